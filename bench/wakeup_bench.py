"""Wake-ups across two platform processes on one database: how soon a blocking read waiting on
platform B answers after a change made through platform A.

Two real `moonrun platform serve` processes over one fresh database (same secret, the same
bootstrap admin token), an endpoint with no Run (so nothing but the bench changes its jobs)
and a server on it. Each sample: create a job through A; open a blocking read of it on B
(`GET /api/v1/jobs/{id}?wait_s=30&until=terminal`) and wait until B's `/metrics` shows it
waiting; then cancel the job through A and time until B's read answers `cancelled`:

- **latency**: from just before the cancel is sent to A until B's read answered (it holds A's
  handling of the cancel too: an upper bound of the wake-up);
- **after A's answer**: from A's answer to the cancel (the change is committed by then) until
  B's read answered (a lower bound).

On PostgreSQL B is told by LISTEN/NOTIFY; on MySQL (`--stores postgres,mysql`) B's poller
finds A's row in `job_wakeups` at its next poll (every 0.25 s), which is the bound there. Each
change is made after a random pause (up to `PHASE_S`) once B's read waits, so that it falls at
a random moment of B's poll, as a real change would.

    python bench/wakeup_bench.py [--samples 200] [--stores postgres,mysql]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kit import Served, child_env, free_port, mysql_database, platform_command, postgres_database

ADMIN_TOKEN = "mra_" + secrets.token_urlsafe(32)
PHASE_S = 0.3
"""Each change waits a random pause up to this (more than MySQL's poll) once the read waits."""


class User:
    """The user API of one platform over one aiohttp session."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url
        self.headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    async def call(self, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = (
            self.headers if data is None else {**self.headers, "Content-Type": "application/json"}
        )
        async with self.http.request(method, self.url + path, data=data, headers=headers) as answer:
            text = await answer.read()
            if answer.status != expect:
                raise SystemExit(f"{method} {path}: {answer.status} {text[:300]!r}")
            return json.loads(text)

    async def reads_waiting(self) -> float:
        async with self.http.get(self.url + "/metrics") as answer:
            for line in (await answer.text()).splitlines():
                if line.startswith('moonrun_waiting_requests{kind="reads"}'):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1000, p99 * 1000, ordered[-1] * 1000


async def measure(a_url: str, b_url: str, samples: int, warmup: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        a, b = User(http, a_url), User(http, b_url)
        admin_id = (await a.call("GET", "/api/v1/users"))["users"][0]["id"]
        endpoint = await a.call("POST", "/api/v1/endpoints", {"name": "bench-host"}, 201)
        server = await a.call(
            "POST",
            "/api/v1/servers",
            {"name": "bench", "endpoint_id": endpoint["endpoint"]["id"], "owner_id": admin_id},
            201,
        )
        upper: list[float] = []
        lower: list[float] = []
        jobs = f"/api/v1/servers/{server['id']}/jobs"
        for n in range(warmup + samples):
            job = await a.call("POST", jobs, {"kind": "noop"}, 201)
            read = asyncio.ensure_future(
                b.call("GET", f"/api/v1/jobs/{job['id']}?wait_s=30&until=terminal")
            )
            while await b.reads_waiting() < 1:
                if read.done():
                    raise SystemExit(f"the read answered before waiting: {read.result()}")
                await asyncio.sleep(0.002)
            # A change at a random moment of B's poll (MySQL): a sample that followed the
            # last wake-up at once would come just after a poll, every time (the worst case).
            await asyncio.sleep(random.uniform(0, PHASE_S))
            sent = time.perf_counter()
            await a.call("POST", f"/api/v1/jobs/{job['id']}/cancel")
            answered = time.perf_counter()
            view = await read
            ended = time.perf_counter()
            if view["state"] != "cancelled":
                raise SystemExit(f"B answered {view['state']}, not cancelled")
            if n >= warmup:
                upper.append(ended - sent)
                lower.append(ended - answered)
        return {"upper": percentiles(upper), "lower": percentiles(lower)}


def run_pair(store_url: str, workdir: Path, samples: int, warmup: int) -> dict[str, Any]:
    a_dir, b_dir = workdir / "a", workdir / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    a_port, b_port = free_port(), free_port()
    a = Served("platform-a", platform_command(store_url, a_port, a_dir), a_port, a_dir,
               child_env(ADMIN_TOKEN))  # fmt: skip
    b: Served | None = None
    try:
        a.wait_ready()
        shutil.copy(a_dir / "platform.secret", b_dir / "platform.secret")
        b = Served("platform-b", platform_command(store_url, b_port, b_dir), b_port, b_dir,
                   child_env(ADMIN_TOKEN))  # fmt: skip
        b.wait_ready()
        return asyncio.run(measure(a.url, b.url, samples, warmup))
    finally:
        if b is not None:
            b.stop()
        a.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--stores", default="postgres,mysql")
    args = parser.parse_args()
    load = os.getloadavg()
    print(
        f"wake-ups across two platforms, {args.samples} changes each "
        f"(load average {load[0]:.1f} on {os.cpu_count()} cores):"
    )
    for store in args.stores.split(","):
        opener = {"postgres": postgres_database, "mysql": mysql_database}.get(store)
        if opener is None:
            parser.error(f"unknown store {store!r} (postgres, mysql)")
        with opener() as url, tempfile.TemporaryDirectory() as tmp:
            if url is None:
                continue
            figures = run_pair(url, Path(tmp), args.samples, args.warmup)
        (p50, p99, worst), (l50, l99, _) = figures["upper"], figures["lower"]
        print(
            f"  {store:9s} cancel on A -> read on B answers: p50 {p50:6.1f} ms  p99 {p99:6.1f} ms"
            f"  max {worst:6.1f} ms   (after A answered: p50 {l50:6.1f} ms  p99 {l99:6.1f} ms)"
        )


if __name__ == "__main__":
    main()
