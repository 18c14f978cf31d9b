"""Jobs created per second over the user API: one per request (8 in flight) and in batches.

The real `moonrun platform serve` in a subprocess (FileStore, the default, and MySQLStore
when MariaDB answers), with an endpoint and a server but no Run, so that only creation is
measured. The client is aiohttp in this process, as the platform admin.

    python bench/create_bench.py [--jobs 3000] [--lanes 8] [--batch-jobs 10000]
                                 [--batch-size 1000] [--stores file,mysql]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kit import Served, child_env, free_port, mysql_database, platform_command

ADMIN_TOKEN = "mra_" + secrets.token_urlsafe(32)


async def call(http: aiohttp.ClientSession, url: str, path: str, body: Any) -> Any:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    async with http.post(url + path, data=json.dumps(body), headers=headers) as answer:
        text = await answer.read()
        if answer.status != 201:
            raise SystemExit(f"POST {path}: {answer.status} {text[:300]!r}")
        return json.loads(text)


async def measure(store_url: str, workdir: Path, args: argparse.Namespace) -> tuple[float, float]:
    port = free_port()
    served = Served(
        "platform",
        platform_command(store_url, port, workdir),
        port,
        workdir,
        child_env(ADMIN_TOKEN),
    )
    try:
        served.wait_ready()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.lanes)) as http:
            url = served.url
            async with http.get(
                url + "/api/v1/users", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
            ) as answer:
                admin_id = (await answer.json())["users"][0]["id"]
            endpoint = await call(http, url, "/api/v1/endpoints", {"name": "bench-host"})
            server = await call(
                http,
                url,
                "/api/v1/servers",
                {"name": "bench", "endpoint_id": endpoint["endpoint"]["id"], "owner_id": admin_id},
            )
            path = f"/api/v1/servers/{server['id']}/jobs"

            async def lane(n: int, count: int) -> None:
                for _ in range(n, count, args.lanes):
                    await call(http, url, path, {"kind": "noop"})

            async def lanes(count: int) -> None:
                async with asyncio.TaskGroup() as group:
                    for n in range(args.lanes):
                        group.create_task(lane(n, count))

            await lanes(200)  # warm up
            started = time.perf_counter()
            await lanes(args.jobs)
            singles = args.jobs / (time.perf_counter() - started)

            batch = {"jobs": [{"kind": "noop"}] * args.batch_size}
            await call(http, url, path + "/batch", batch)  # warm up
            started = time.perf_counter()
            for _ in range(args.batch_jobs // args.batch_size):
                await call(http, url, path + "/batch", batch)
            batched = args.batch_jobs / (time.perf_counter() - started)
        return singles, batched
    except BaseException:
        print(served.tail(), file=sys.stderr)
        raise
    finally:
        served.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--batch-jobs", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--stores", default="file,mysql")
    args = parser.parse_args()
    print(
        f"{'store':12} {'creates/s, ' + str(args.lanes) + ' in flight':>26} {'batched jobs/s':>16}"
    )
    with tempfile.TemporaryDirectory(prefix="moonrun-create-") as tmp:
        for store in filter(None, args.stores.split(",")):
            workdir = Path(tmp) / store
            workdir.mkdir()
            if store == "file":
                figures = asyncio.run(measure(f"file:{workdir / 'platform.db'}", workdir, args))
            else:
                with mysql_database() as url:
                    if url is None:
                        continue
                    figures = asyncio.run(measure(url, workdir, args))
            print(f"{store:12} {figures[0]:26,.0f} {figures[1]:16,.0f}", flush=True)


if __name__ == "__main__":
    main()
