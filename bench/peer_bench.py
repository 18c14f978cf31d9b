"""moonrun beside Celery + Redis and Procrastinate, in one run: end-to-end no-op jobs/s and
submit -> done latency.

moonrun: the real `moonrun platform serve` (FileStore, the default, MySQLStore when
MariaDB answers and PostgresStore when PostgreSQL does) and one real Run (`moonrun run start
--capacity 16`, and 256 on FileStore to show that a bigger Run is not slower) in subprocesses.
A user client (aiohttp, in this process) runs 8 lanes; each lane creates its share of the jobs, one
`POST /api/v1/servers/{id}/jobs` at a time, then awaits each of them until it is terminal:
with one blocking `GET /api/v1/jobs/{id}?wait_s=..&until=terminal` per job (`--await block`,
the default), or by polling its GET every `--poll-ms` (`--await poll`).

Celery 5 with Redis (127.0.0.1:6379, database 14) as broker and result backend, `acks_late`
and `reject_on_worker_lost` (bench/celery_peer.py), one prefork worker with 2 processes in a
subprocess. The client runs 8 threads; each calls `noop.delay()` for its share, then
`.get()` of each result.

Procrastinate 3 on PostgreSQL 15 (127.0.0.1:5432, database `moonrun_peer` of its own),
durable like moonrun (bench/procrastinate_peer.py): 2 worker processes with 16 jobs at once
each. The client runs 8 lanes on one event loop; each defers its share (`defer_async`), then
reads each job's status until it is terminal (Procrastinate keeps no results), every 1 ms.

Latency: one no-op at a time on an idle system, submit -> terminal state visible to the
client (moonrun: POST then the blocking GET; Celery: `delay()` then `.get()`; Procrastinate:
`defer_async()` then its status read every 0.5 ms), p50 and p99.

`--rounds N` runs every system N times, alternating, and reports each one's median.

`--keyed` adds a FileStore run (the first capacity) whose every job carries one of 1,000
concurrency keys (limit 1) and one of the 10 priorities, for fleet scheduling's cost end to end.

    python bench/peer_bench.py [--jobs 3000] [--lanes 8] [--capacities 16,256] [--samples 200]
                               [--stores file,mysql,postgres] [--await block|poll] [--no-celery]
                               [--no-procrastinate] [--rounds 1] [--keyed] [--proxied 1,2]
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
    RoundRobinProxy,
    Served,
    child_env,
    cpu_seconds,
    free_port,
    mysql_database,
    platform_command,
    postgres_database,
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
    cpu_ms_per_job: float | None = None
    """moonrun's platform processes' CPU per job of the throughput run (all of them behind a
    proxy): less noisy than jobs/s on a shared machine."""


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1000, p99 * 1000


# -- moonrun -------------------------------------------------------------------------------------


class User:
    """The user API over one aiohttp session."""

    def __init__(
        self, http: aiohttp.ClientSession, url: str, mode: str, poll_s: float, keyed: bool = False
    ) -> None:
        self.http, self.url, self.mode, self.poll_s = http, url, mode, poll_s
        self.headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        self.keyed, self.made = keyed, 0

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
        body: dict[str, Any] = {"kind": "noop"}
        if self.keyed:  # one of 1,000 keys and one of 10 priorities, in turn
            body["concurrency"] = {"key": f"key-{self.made % 1000}", "limit": 1}
            body["priority"] = self.made % 10
        self.made += 1
        job = await self.call("POST", f"/api/v1/servers/{server_id}/jobs", body, 201)
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
    """A platform (with `flags` after its command) and one Run in subprocesses, an endpoint,
    a server; ready for jobs. With `proxied` N, N platforms on the one store, sharing their
    secret and data directory, behind the tests' round-robin proxy (tests/support/
    round_robin_proxy.py: every request to the next platform, a new upstream connection per
    request, bodies buffered), which the Run and the user talk to."""

    def __init__(
        self,
        store_url: str,
        workdir: Path,
        capacity: int,
        flags: tuple[str, ...] = (),
        proxied: int = 0,
    ) -> None:
        self.workdir = workdir
        if proxied:
            secret = workdir / "platform.secret"  # written before any platform races to
            secret.write_text(secrets.token_hex(32))
            secret.chmod(0o600)
            flags = (*flags, "--trusted-proxy", "127.0.0.1")
        self.platforms = []
        for n in range(max(1, proxied)):
            port = free_port()
            self.platforms.append(
                Served(
                    f"platform-{n}" if proxied else "platform",
                    platform_command(store_url, port, workdir, *flags),
                    port,
                    workdir,
                    child_env(ADMIN_TOKEN),
                )
            )
        self.platform = self.platforms[0]
        self.proxy: RoundRobinProxy | None = None
        if proxied:
            self.proxy = RoundRobinProxy(workdir, [platform.url for platform in self.platforms])
        self.url = self.proxy.url if self.proxy is not None else self.platform.url
        self.run: Process | None = None
        self.capacity = capacity

    async def start(self, user: User) -> str:
        """Join a Run and create a server on its endpoint; returns the server id."""
        for platform in self.platforms:
            platform.wait_ready()
        if self.proxy is not None:
            self.proxy.start()
        admin = await user.call("GET", "/api/v1/users")
        admin_id = admin["users"][0]["id"]
        created = await user.call("POST", "/api/v1/endpoints", {"name": "bench-host"}, 201)
        run_dir = self.workdir / "run"
        run_dir.mkdir(mode=0o700)
        base = [sys.executable, "-m", "moonrun", "run"]
        subprocess.run(
            [*base, "join", "--platform", self.url, "--token", created["join_token"],
             "--data-dir", str(run_dir)],
            check=True, env=child_env(), cwd=self.workdir, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        self.run = Process(
            "run",
            [*base, "start", "--platform", self.url, "--data-dir", str(run_dir),
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
        if self.proxy is not None:
            self.proxy.stop()
        for platform in self.platforms:
            platform.stop()


async def moonrun_figures(
    label: str,
    store_url: str,
    args: argparse.Namespace,
    workdir: Path,
    capacity: int,
    keyed: bool = False,
    proxied: int = 0,
) -> Figures:
    system = Moonrun(store_url, workdir, capacity, proxied=proxied)
    connector = aiohttp.TCPConnector(limit=args.lanes + 2)
    try:
        async with aiohttp.ClientSession(connector=connector) as http:
            user = User(http, system.url, args.await_mode, args.poll_ms / 1000, keyed)
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

            pids = [platform.pid for platform in system.platforms]
            cpu_before = sum(cpu_seconds(pid) for pid in pids)
            started = time.perf_counter()
            async with asyncio.TaskGroup() as lanes:
                for n in range(args.lanes):
                    lanes.create_task(lane(n))
            seconds = time.perf_counter() - started
            cpu_ms = (sum(cpu_seconds(pid) for pid in pids) - cpu_before) * 1000 / args.jobs
        p50, p99 = percentiles(samples)
        return Figures(label, args.jobs / seconds, p50, p99, cpu_ms)
    except BaseException:
        for platform in system.platforms:
            print(platform.tail(), file=sys.stderr)
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


# -- Procrastinate -------------------------------------------------------------------------------


def procrastinate_figures(args: argparse.Namespace, workdir: Path) -> Figures | None:
    import psycopg

    from procrastinate_peer import DATABASE, SERVER_DSN

    try:
        with psycopg.connect(f"{SERVER_DSN}/postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {DATABASE}")
    except psycopg.Error as error:
        print(f"procrastinate: skipped ({error})")
        return None
    return asyncio.run(_procrastinate_figures(args, workdir))


async def _procrastinate_figures(args: argparse.Namespace, workdir: Path) -> Figures:
    from procrastinate.jobs import Status

    from procrastinate_peer import app, noop

    ended = {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.ABORTED}
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        workers = [_procrastinate_worker(n, workdir) for n in range(2)]
        try:

            async def until_ended(job_id: int, poll_s: float) -> Status:
                while True:
                    status = await app.job_manager.get_job_status_async(job_id)
                    if status in ended:
                        return status
                    await asyncio.sleep(poll_s)

            async def one(poll_s: float) -> None:
                status = await until_ended(await noop.defer_async(), poll_s)
                assert status is Status.SUCCEEDED, status

            await asyncio.wait_for(one(0.01), 60)  # the workers are up
            for _ in range(args.warmup):
                await one(0.0005)
            samples = []
            for _ in range(args.samples):
                started = time.perf_counter()
                await one(0.0005)
                samples.append(time.perf_counter() - started)

            async def lane(n: int) -> None:
                mine = [await noop.defer_async() for _ in range(n, args.jobs, args.lanes)]
                for job_id in mine:
                    assert await until_ended(job_id, 0.001) is Status.SUCCEEDED

            started = time.perf_counter()
            async with asyncio.TaskGroup() as lanes:
                for n in range(args.lanes):
                    lanes.create_task(lane(n))
            seconds = time.perf_counter() - started
        except BaseException:
            for worker in workers:
                print(worker.tail(), file=sys.stderr)
            raise
        finally:
            for worker in workers:
                worker.stop()
    p50, p99 = percentiles(samples)
    return Figures("Procrastinate + PostgreSQL", args.jobs / seconds, p50, p99)


def _procrastinate_worker(n: int, workdir: Path) -> Process:
    command = [sys.executable, "-m", "procrastinate", "--app", "procrastinate_peer.app",
               "worker", "--concurrency", "16", "--name", f"bench-{n}"]  # fmt: skip
    env = {**child_env(), "PYTHONPATH": str(ROOT / "bench")}
    return Process(f"procrastinate-{n}", command, workdir, env)


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
    parser.add_argument("--stores", default="file,mysql,postgres")
    parser.add_argument("--await", dest="await_mode", choices=["block", "poll"], default="block")
    parser.add_argument("--poll-ms", type=float, default=10.0)
    parser.add_argument("--no-celery", action="store_true")
    parser.add_argument("--no-procrastinate", action="store_true")
    parser.add_argument("--rounds", type=int, default=1, help="alternating runs; medians")
    parser.add_argument(
        "--keyed", action="store_true", help="also FileStore with keys and priorities"
    )
    parser.add_argument(
        "--proxied",
        default="",
        help="also each database store with N platforms behind the round-robin proxy, for "
        "each N given (e.g. 1,2: one platform behind it is the proxy's own cost)",
    )
    args = parser.parse_args()

    capacities = [int(c) for c in args.capacities.split(",") if c]
    rounds: dict[str, list[Figures]] = {}
    with tempfile.TemporaryDirectory(prefix="moonrun-peer-") as tmp:
        base = Path(tmp)

        def fresh(name: str) -> Path:
            return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))

        runners: list[Callable[[], Figures | None]] = []
        if not args.no_celery:
            runners.append(lambda: celery_figures(args, fresh("celery")))
        if not args.no_procrastinate:
            runners.append(lambda: procrastinate_figures(args, fresh("procrastinate")))
        for store in filter(None, args.stores.split(",")):
            if store not in ("file", "mysql", "postgres"):
                parser.error(f"unknown store {store!r} (file, mysql, postgres)")
            for capacity in capacities if store == "file" else capacities[:1]:
                if store == "file":
                    label = f"moonrun, FileStore, {capacity}"
                    runners.append(
                        lambda c=capacity, label=label: _with_file(
                            args, fresh(f"file-{c}"), c, label
                        )
                    )
                else:
                    runners.append(
                        lambda c=capacity, s=store: _with_database(s, args, fresh(f"{s}-{c}"), c)
                    )
                    for n in (int(n) for n in args.proxied.split(",") if n):
                        runners.append(
                            lambda c=capacity, s=store, n=n: _with_database(
                                s, args, fresh(f"{s}-{c}-{n}"), c, proxied=n
                            )
                        )
            if store == "file" and args.keyed:
                label = f"moonrun, FileStore, {capacities[0]}, keyed"
                runners.append(
                    lambda c=capacities[0], label=label: _with_file(
                        args, fresh(f"keyed-{c}"), c, label, keyed=True
                    )
                )
        for round_ in range(args.rounds):
            for runner in runners:
                figures = runner()
                if figures is not None:
                    rounds.setdefault(figures.label, []).append(figures)
                    cpu = figures.cpu_ms_per_job
                    print(
                        f"  round {round_ + 1}: {figures.label}: {figures.jobs_per_s:,.0f} jobs/s,"
                        f" p50 {figures.p50_ms:.2f} ms"
                        + (f", platform CPU {cpu:.2f} ms/job" if cpu is not None else ""),
                        flush=True,
                    )

    results = [_median(label, runs) for label, runs in rounds.items()]
    print(
        f"\n{args.jobs} no-op jobs, {args.lanes} lanes, Run capacity after the store's name, "
        f"await {args.await_mode}; latency over {args.samples} one-at-a-time jobs; "
        f"median of {args.rounds} alternating round(s)\n"
    )
    celery = next((f for f in results if f.label.startswith("Celery")), None)
    durable = next((f for f in results if f.label.startswith("Procrastinate")), None)
    print(
        f"{'':44} {'jobs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'jobs/s x C':>11} {'p50 x C':>8}"
        f" {'jobs/s x P':>11} {'CPU ms/job':>11}"
    )
    for f in results:
        versus_celery = (
            f"{f.jobs_per_s / celery.jobs_per_s:11.2f} {f.p50_ms / celery.p50_ms:8.2f}"
            if celery
            else f"{'':11} {'':8}"
        )
        versus_durable = f"{f.jobs_per_s / durable.jobs_per_s:11.2f}" if durable else f"{'':11}"
        per_job = f"{f.cpu_ms_per_job:11.3f}" if f.cpu_ms_per_job is not None else ""
        print(
            f"{f.label:44} {f.jobs_per_s:9,.0f} {f.p50_ms:8.2f} {f.p99_ms:8.2f}"
            f" {versus_celery} {versus_durable} {per_job}"
        )


def _median(label: str, runs: list[Figures]) -> Figures:
    cpus = [f.cpu_ms_per_job for f in runs if f.cpu_ms_per_job is not None]
    return Figures(
        label,
        statistics.median(f.jobs_per_s for f in runs),
        statistics.median(f.p50_ms for f in runs),
        statistics.median(f.p99_ms for f in runs),
        statistics.median(cpus) if cpus else None,
    )


def _with_file(
    args: argparse.Namespace, workdir: Path, capacity: int, label: str, keyed: bool = False
) -> Figures:
    url = f"file:{workdir / 'platform.db'}"
    return asyncio.run(moonrun_figures(label, url, args, workdir, capacity, keyed))


def _with_database(
    store: str, args: argparse.Namespace, workdir: Path, capacity: int, proxied: int = 0
) -> Figures | None:
    """moonrun over a fresh MySQL or PostgreSQL database (None when it does not answer)."""
    database, name = (
        (mysql_database, "MySQLStore") if store == "mysql" else (postgres_database, "PostgresStore")
    )
    with database() as url:
        if url is None:
            return None
        label = f"moonrun, {name}, {capacity}"
        if proxied:
            label += f", {proxied} behind proxy"
        return asyncio.run(moonrun_figures(label, url, args, workdir, capacity, proxied=proxied))


if __name__ == "__main__":
    main()
