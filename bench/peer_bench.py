"""moonrun beside Celery + Redis, in one run: end-to-end no-op jobs/s and submit -> done latency.

moonrun: the real `moonrun platform serve` (FileStore, the default, and MySQLStore when
MariaDB answers) and one real Run (`moonrun run start --capacity 16`, and 256 on FileStore to
show that a bigger Run is not slower) in subprocesses. A user client (aiohttp, in this
process) runs 8 lanes; each lane creates its share of the jobs, one
`POST /api/v1/servers/{id}/jobs` at a time, then awaits each of them until it is terminal:
with one blocking `GET /api/v1/jobs/{id}?wait_s=..&until=terminal` per job (`--await block`,
the default), or by polling its GET every `--poll-ms` (`--await poll`).

Celery 5 with Redis (127.0.0.1:6379, database 14) as broker and result backend, `acks_late`
and `reject_on_worker_lost` (bench/celery_peer.py), one prefork worker with 2 processes in a
subprocess. The client runs 8 threads; each calls `noop.delay()` for its share, then
`.get()` of each result.

Latency: one no-op at a time on an idle system, submit -> terminal state visible to the
client (moonrun: POST then the blocking GET; Celery: `delay()` then `.get()`), p50 and p99.

    python bench/peer_bench.py [--jobs 3000] [--lanes 8] [--capacities 16,256] [--samples 200]
                               [--stores file,mysql] [--await block|poll] [--no-celery]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kit import (
    ROOT,
    Process,
    Served,
    child_env,
    free_port,
    mysql_database,
    platform_command,
)

ADMIN_TOKEN = "mra_" + secrets.token_urlsafe(32)
TERMINAL = {"succeeded", "failed", "cancelled"}
WAIT_S = 30


@dataclass(frozen=True)
class Figures:
    label: str
    jobs_per_s: float
    p50_ms: float
    p99_ms: float


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1000, p99 * 1000


# -- moonrun -------------------------------------------------------------------------------------


class User:
    """The user API over one aiohttp session."""

    def __init__(self, http: aiohttp.ClientSession, url: str, mode: str, poll_s: float) -> None:
        self.http, self.url, self.mode, self.poll_s = http, url, mode, poll_s
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

    async def submit(self, server_id: str) -> str:
        job = await self.call("POST", f"/api/v1/servers/{server_id}/jobs", {"kind": "noop"}, 201)
        job_id: str = job["id"]
        return job_id

    async def until_terminal(self, job_id: str) -> dict[str, Any]:
        while True:
            if self.mode == "block":
                view = await self.call(
                    "GET", f"/api/v1/jobs/{job_id}?wait_s={WAIT_S}&until=terminal"
                )
            else:
                view = await self.call("GET", f"/api/v1/jobs/{job_id}")
            if view["state"] in TERMINAL:
                return dict(view)
            if self.mode == "poll":
                await asyncio.sleep(self.poll_s)


class Moonrun:
    """A platform and one Run in subprocesses, an endpoint, a server; ready for jobs."""

    def __init__(self, store_url: str, workdir: Path, capacity: int) -> None:
        self.workdir = workdir
        port = free_port()
        self.platform = Served(
            "platform",
            platform_command(store_url, port, workdir),
            port,
            workdir,
            child_env(ADMIN_TOKEN),
        )
        self.run: Process | None = None
        self.capacity = capacity

    async def start(self, user: User) -> str:
        """Join a Run and create a server on its endpoint; returns the server id."""
        self.platform.wait_ready()
        admin = await user.call("GET", "/api/v1/users")
        admin_id = admin["users"][0]["id"]
        created = await user.call("POST", "/api/v1/endpoints", {"name": "bench-host"}, 201)
        run_dir = self.workdir / "run"
        run_dir.mkdir(mode=0o700)
        base = [sys.executable, "-m", "moonrun", "run"]
        subprocess.run(
            [*base, "join", "--platform", self.platform.url, "--token", created["join_token"],
             "--data-dir", str(run_dir)],
            check=True, env=child_env(), cwd=self.workdir, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        self.run = Process(
            "run",
            [*base, "start", "--platform", self.platform.url, "--data-dir", str(run_dir),
             "--capacity", str(self.capacity), "--log-level", "warning"],
            self.workdir,
        )  # fmt: skip
        server = await user.call(
            "POST",
            "/api/v1/servers",
            {"name": "bench", "endpoint_id": created["endpoint"]["id"], "owner_id": admin_id},
            201,
        )
        for _ in range(600):
            endpoints = await user.call("GET", "/api/v1/endpoints")
            if endpoints["endpoints"][0]["online"]:
                break
            await asyncio.sleep(0.05)
        else:
            raise SystemExit(f"Run did not come online:\n{self.run.tail()}")
        server_id: str = server["id"]
        return server_id

    def stop(self) -> None:
        if self.run is not None:
            self.run.stop()
        self.platform.stop()


async def moonrun_figures(
    label: str, store_url: str, args: argparse.Namespace, workdir: Path, capacity: int
) -> Figures:
    system = Moonrun(store_url, workdir, capacity)
    connector = aiohttp.TCPConnector(limit=args.lanes + 2)
    try:
        async with aiohttp.ClientSession(connector=connector) as http:
            user = User(http, system.platform.url, args.await_mode, args.poll_ms / 1000)
            server_id = await system.start(user)
            for _ in range(args.warmup):
                await user.until_terminal(await user.submit(server_id))

            samples = []
            for _ in range(args.samples):
                started = time.perf_counter()
                view = await user.until_terminal(await user.submit(server_id))
                samples.append(time.perf_counter() - started)
                assert view["state"] == "succeeded", view

            async def lane(n: int) -> None:
                mine = [await user.submit(server_id) for _ in range(n, args.jobs, args.lanes)]
                for job_id in mine:
                    view = await user.until_terminal(job_id)
                    assert view["state"] == "succeeded", view

            started = time.perf_counter()
            async with asyncio.TaskGroup() as lanes:
                for n in range(args.lanes):
                    lanes.create_task(lane(n))
            seconds = time.perf_counter() - started
        p50, p99 = percentiles(samples)
        return Figures(label, args.jobs / seconds, p50, p99)
    except BaseException:
        print(system.platform.tail(), file=sys.stderr)
        if system.run is not None:
            print(system.run.tail(), file=sys.stderr)
        raise
    finally:
        system.stop()


# -- Celery --------------------------------------------------------------------------------------


def celery_figures(args: argparse.Namespace, workdir: Path) -> Figures:
    from celery_peer import app, noop

    app.control.purge()
    worker = Process(
        "celery",
        [sys.executable, "-m", "celery", "-A", "celery_peer", "worker", "--pool", "prefork",
         "--concurrency", "2", "--loglevel", "warning", "--without-gossip", "--without-mingle",
         "--without-heartbeat"],
        workdir,
        {**child_env(), "PYTHONPATH": str(ROOT / "bench")},
    )  # fmt: skip
    try:
        noop.delay().get(timeout=60)  # the worker is up
        for _ in range(args.warmup):
            noop.delay().get(timeout=60)
        samples = []
        for _ in range(args.samples):
            started = time.perf_counter()
            noop.delay().get(timeout=60)
            samples.append(time.perf_counter() - started)

        def lane(n: int) -> None:
            results = [noop.delay() for _ in range(n, args.jobs, args.lanes)]
            for result in results:
                result.get(timeout=120)

        threads = [threading.Thread(target=lane, args=(n,)) for n in range(args.lanes)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
        p50, p99 = percentiles(samples)
        return Figures("Celery + Redis", args.jobs / seconds, p50, p99)
    except BaseException:
        print(worker.tail(), file=sys.stderr)
        raise
    finally:
        worker.stop()


# -- the run -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument(
        "--capacities",
        default="16,256",
        help="Run capacities to measure on FileStore (the first also on MySQL)",
    )
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--stores", default="file,mysql")
    parser.add_argument("--await", dest="await_mode", choices=["block", "poll"], default="block")
    parser.add_argument("--poll-ms", type=float, default=10.0)
    parser.add_argument("--no-celery", action="store_true")
    args = parser.parse_args()

    capacities = [int(c) for c in args.capacities.split(",") if c]
    results: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="moonrun-peer-") as tmp:
        base = Path(tmp)
        runners: list[Callable[[], Figures | None]] = []
        if not args.no_celery:
            runners.append(lambda: celery_figures(args, base))
        for store in filter(None, args.stores.split(",")):
            if store not in ("file", "mysql"):
                parser.error(f"unknown store {store!r} (file, mysql)")
            for capacity in capacities if store == "file" else capacities[:1]:
                workdir = base / f"{store}-{capacity}"
                workdir.mkdir()
                if store == "file":
                    url = f"file:{workdir / 'platform.db'}"
                    label = f"moonrun, FileStore, {capacity}"
                    runners.append(
                        lambda url=url, w=workdir, c=capacity, label=label: asyncio.run(
                            moonrun_figures(label, url, args, w, c)
                        )
                    )
                else:
                    runners.append(lambda w=workdir, c=capacity: _with_mysql(args, w, c))
        for runner in runners:
            figures = runner()
            if figures is not None:
                results.append(figures)
                print(f"  {figures.label}: {figures.jobs_per_s:,.0f} jobs/s", flush=True)

    print(
        f"\n{args.jobs} no-op jobs, {args.lanes} lanes, Run capacity after the store's name, "
        f"await {args.await_mode}; latency over {args.samples} one-at-a-time jobs\n"
    )
    peer = next((f for f in results if f.label.startswith("Celery")), None)
    print(f"{'':26} {'jobs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'jobs/s x':>9} {'p50 x':>7}")
    for f in results:
        ratio = (
            f"{f.jobs_per_s / peer.jobs_per_s:9.2f} {f.p50_ms / peer.p50_ms:7.2f}" if peer else ""
        )
        print(f"{f.label:26} {f.jobs_per_s:9,.0f} {f.p50_ms:8.2f} {f.p99_ms:8.2f} {ratio}")


def _with_mysql(args: argparse.Namespace, workdir: Path, capacity: int) -> Figures | None:
    with mysql_database() as url:
        if url is None:
            return None
        label = f"moonrun, MySQLStore, {capacity}"
        return asyncio.run(moonrun_figures(label, url, args, workdir, capacity))


if __name__ == "__main__":
    main()
