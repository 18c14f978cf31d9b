"""Fleet scheduling's costs: a fan-out to 1,000 servers in one request, and what concurrency keys
and priorities add to a claim.

1. **Fan-out.** The real `moonrun platform serve` over a FileStore (and MySQL with `--stores
   file,mysql`), with `--servers` servers labelled `role=web` on 10 endpoints, made beforehand
   over the API; then `--fanouts` fan-outs (`POST /api/v1/jobs/fanout`, selector `role=web`),
   one at a time, each timed from request to answer (every job and the group in one commit).
2. **Claims.** The real SchedulingService in this process over a FileStore (and MySQL), one
   endpoint, one server, one reconciled session; `--queued` jobs created through the service in
   batches of 1,000, either plain (no key, default priority) or each with one of `--keys`
   concurrency keys (limit 1) and one of 10 priorities; then `--claims` claim -> ack -> result
   lifecycles, the claim alone timed (a result then releases the next held job of its key, as
   in production). Plain and keyed alternate `--rounds` times; the ratio of the medians of
   their p50s is the figure (issue: within 1.5x).

    python bench/fleet_scheduling_bench.py [--servers 1000] [--fanouts 5] [--queued 10000]
                                           [--keys 1000] [--claims 500] [--rounds 2]
                                           [--stores file,mysql]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kit import Served, child_env, free_port, mysql_database, platform_command
from moonrun.service.specs import JobSpec
from moonrun.store import open_store
from moonrun.store.protocol import Store
from store_bench import Bench

ADMIN_TOKEN = "mra_" + secrets.token_urlsafe(32)


async def _call(http: aiohttp.ClientSession, url: str, path: str, body: Any) -> Any:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    async with http.post(url + path, data=json.dumps(body), headers=headers) as answer:
        text = await answer.read()
        if answer.status != 201:
            raise SystemExit(f"POST {path}: {answer.status} {text[:300]!r}")
        return json.loads(text)


async def fanout_seconds(store_url: str, workdir: Path, args: argparse.Namespace) -> list[float]:
    """Each fan-out's seconds, request to answer."""
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
        connector = aiohttp.TCPConnector(limit=8)
        async with aiohttp.ClientSession(connector=connector) as http:
            url = served.url
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            async with http.get(url + "/api/v1/users", headers=headers) as answer:
                admin_id = (await answer.json())["users"][0]["id"]
            endpoints = [
                (await _call(http, url, "/api/v1/endpoints", {"name": f"host-{n}"}))["endpoint"][
                    "id"
                ]
                for n in range(10)
            ]

            async def lane(n: int) -> None:
                for index in range(n, args.servers, 8):
                    body = {
                        "name": f"web-{index}",
                        "endpoint_id": endpoints[index % len(endpoints)],
                        "owner_id": admin_id,
                        "labels": {"role": "web"},
                    }
                    await _call(http, url, "/api/v1/servers", body)

            async with asyncio.TaskGroup() as group:
                for n in range(8):
                    group.create_task(lane(n))
            body = {"selector": "role=web", "kind": "noop"}
            await _call(http, url, "/api/v1/jobs/fanout", body)  # warm up
            seconds = []
            for _ in range(args.fanouts):
                started = time.perf_counter()
                made = await _call(http, url, "/api/v1/jobs/fanout", body)
                seconds.append(time.perf_counter() - started)
                assert len(made["jobs"]) == args.servers, len(made["jobs"])
            return seconds
    except BaseException:
        print(served.tail(), file=sys.stderr)
        raise
    finally:
        served.stop()


def claim_p50_p99(
    make: Callable[[], Store], args: argparse.Namespace, keyed: bool
) -> tuple[float, float]:
    """p50 and p99 claim latency (ms) with `--queued` jobs waiting, plain or keyed."""
    store = make()
    try:
        bench = Bench(store, capacity=1)
        rng = random.Random(7)
        total = args.queued + args.claims + 20
        for start in range(0, total, 1000):
            specs = [
                JobSpec(
                    kind="noop",
                    concurrency={"key": f"key-{rng.randrange(args.keys)}", "limit": 1},
                    priority=rng.randrange(10),
                )
                if keyed
                else JobSpec(kind="noop")
                for _ in range(min(1000, total - start))
            ]
            bench.service.create_jobs(bench.admin, bench.server.id, specs)
        for _ in range(20):
            bench.lifecycle()  # warm the caches and the connection pool
        samples = sorted(bench.lifecycle() for _ in range(args.claims))
    finally:
        store.close()
    p50 = statistics.median(samples) * 1000
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1000
    return p50, p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--fanouts", type=int, default=5)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stores", default="file,mysql")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="moonrun-fleet-scheduling-") as tmp:
        for name in filter(None, args.stores.split(",")):
            workdir = Path(tmp) / name
            workdir.mkdir()
            with mysql_database() if name == "mysql" else _file(workdir) as url:
                if url is None:
                    continue
                seconds = asyncio.run(fanout_seconds(url, workdir, args))
                median, most = statistics.median(seconds) * 1000, max(seconds) * 1000
                print(
                    f"{name:6} fan-out to {args.servers} servers: median {median:,.0f} ms, "
                    f"max {most:,.0f} ms ({args.fanouts} fan-outs)",
                    flush=True,
                )
            plain: list[tuple[float, float]] = []
            keyed: list[tuple[float, float]] = []
            for _ in range(args.rounds):
                for figures, with_keys in ((plain, False), (keyed, True)):
                    with mysql_database() if name == "mysql" else _file(workdir) as url:
                        assert url is not None
                        figures.append(claim_p50_p99(lambda u=url: open_store(u), args, with_keys))
            p50 = statistics.median(f[0] for f in plain), statistics.median(f[0] for f in keyed)
            p99 = statistics.median(f[1] for f in plain), statistics.median(f[1] for f in keyed)
            print(
                f"{name:6} claim with {args.queued:,} queued: plain p50 {p50[0]:.2f} ms "
                f"p99 {p99[0]:.2f} ms; {args.keys:,} keys and 10 priorities p50 {p50[1]:.2f} ms "
                f"p99 {p99[1]:.2f} ms; p50 ratio {p50[1] / p50[0]:.2f}",
                flush=True,
            )


class _file:
    """A fresh FileStore URL in `workdir` (a context, as `mysql_database` is)."""

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / f"{secrets.token_hex(4)}.db"

    def __enter__(self) -> str:
        return f"file:{self.path}"

    def __exit__(self, *exc: object) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
