"""A fleet of simulated Runs on one platform: heartbeat and dispatch latency as the fleet grows.

The platform is the real `moonrun platform serve` over a FileStore in a temporary directory
(or `--store mysql`: a temporary `moonrun_fleet_*` database on MOONRUN_BENCH_MYSQL_URL), with
its default timings (heartbeat every 10 s, leases of 40 s) and its open-files limit raised so
that the connection cap is not what is measured. Endpoints, their joins and one server per
endpoint are made beforehand by the real service in this process, straight into the store.

The Runs are simulated in `--workers` processes (2 by default, one asyncio loop each, uvloop
when installed), each Run through moonrun's own `moonrun.run.client.PlatformClient` (its own
Ed25519 key and endpoint, four channels, signing): it registers advertising the built-in kinds
with their schemas, reconciles an empty journal, heartbeats every `heartbeat_interval_s` (the
first at a random phase, as Runs started over time would; at the interval the last answer told,
which the platform stretches as its fleet grows), keeps one long-poll claim of `--claim-wait-s`
(Run's default, 50 s) waiting at a time, and acks and finishes (succeeded) every job it is
granted in one batch each, as the real agent does.

The fleet grows through `--steps`; at each step the new Runs join, the bench waits until
every Run has registered and reconciled, lets `--settle-s` pass, then measures for
`--measure-s`: the round trip of every heartbeat (p50/p99), the dispatch latency of
`--jobs` no-op jobs submitted on random servers spread over the window (from the create's
answer to the claim's answer at the Run holding that server, both on this machine's wall
clock), the platform's CPU (share of one core), RSS and open descriptors at the end, errors
of any Run request, and each worker's own CPU: a worker near 100% of its core is a saturated
generator, and then its latencies say more about it than about the platform.

    python bench/fleet_bench.py [--steps 500,1000,2000,5000,10000] [--store file|mysql]
                                [--workers 2] [--settle-s 15] [--measure-s 30] [--jobs 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import multiprocessing
import os
import random
import resource
import secrets
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kit import Served, child_env, cpu_seconds, free_port, mysql_database, platform_command
from moonrun.clock import SystemClock
from moonrun.security.tokens import SystemTokenSource, b64url
from moonrun.service.config import SchedulingSettings
from moonrun.service.directory import Directory
from moonrun.service.scheduling import SchedulingService
from moonrun.wiring.collector import tune_for_serving

ADMIN_TOKEN = "mra_" + secrets.token_urlsafe(32)
CLAIM_WAIT_S = 50.0
"""Run's default (`RunConfig.claim_wait_s`)."""
CAPACITY = 4
NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
"""Every process of the bench raises its open-files limit to the hard limit it was given."""


# -- the fleet's records ------------------------------------------------------------------------


@dataclass(frozen=True)
class Host:
    """One simulated Run: the endpoint it joined as, its key, and the server it hosts."""

    endpoint_id: str
    key: bytes
    server_id: str


def build_fleet(store_url: str, size: int) -> list[Host]:
    """`size` joined endpoints, one server each (one owner for all), made in the store."""
    from moonrun.store import open_store

    store = open_store(store_url)
    clock, tokens = SystemClock(), SystemTokenSource()
    service = SchedulingService(store, clock, tokens, SchedulingSettings())
    directory = Directory(store, clock, tokens)
    admin = directory.ensure_bootstrap_admin(ADMIN_TOKEN)
    owner = directory.create_user(admin, "owner").user
    hosts = []
    try:
        for n in range(size):
            key = Ed25519PrivateKey.generate()
            enrolled = service.create_endpoint(admin, f"host-{n}")
            public = b64url(key.public_key().public_bytes_raw())
            service.join_endpoint(enrolled.join_token, public)
            server = directory.create_server(
                admin, f"srv-{n}", endpoint_id=enrolled.endpoint.id, owner_id=owner.id
            )
            hosts.append(Host(enrolled.endpoint.id, key.private_bytes_raw(), server.id))
    finally:
        store.close()
    return hosts


# -- a worker process: simulated Runs on one event loop ---------------------------------------


@dataclass
class Stats:
    """What one worker's Runs saw since the last reset."""

    registered: int = 0
    heartbeats_ms: list[float] = field(default_factory=list)
    received: dict[str, float] = field(default_factory=dict)
    """job id -> wall time its claim answer arrived."""
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1


class SimulatedRun:
    """One Run on the wire, as `moonrun run start` behaves, minus running anything."""

    def __init__(
        self, url: str, host: Host, kinds: dict[str, Any], stats: Stats, claim_wait_s: float
    ) -> None:
        from moonrun.run.client import PlatformClient

        key = Ed25519PrivateKey.from_private_bytes(host.key)
        self.client = PlatformClient(url, host.endpoint_id, key)
        self.kinds = kinds
        self.stats = stats
        self.registered = False
        self.claim_wait_s = claim_wait_s

    async def run(self) -> None:
        from moonrun.errors import MoonrunError
        from moonrun.run.agent import RETRY_BACKOFF
        from moonrun.run.client import pause_after

        # As Run registers again: capped exponential backoff with full jitter, and at least
        # an overloaded platform's Retry-After. A fixed 0.5-2 s retry made a fleet joining at
        # once a storm of thousands of refused registrations a second.
        delays = RETRY_BACKOFF.delays()
        async with self.client:
            while True:
                try:
                    await self._session()
                    return
                except MoonrunError as error:
                    self.stats.error(error.code)
                    await asyncio.sleep(pause_after(error, delays))

    async def _session(self) -> None:
        session = await self.client.register(b64url(secrets.token_bytes(16)), CAPACITY, self.kinds)
        await self.client.reconcile([])
        if not self.registered:
            # Counted once: a Run that registers again must not stand in for one that never did.
            self.registered = True
            self.stats.registered += 1
        beats = asyncio.create_task(self._heartbeats(session.heartbeat_interval_s))
        try:
            await self._claims()
        finally:
            beats.cancel()

    async def _heartbeats(self, interval_s: float) -> None:
        from moonrun.errors import MoonrunError

        await asyncio.sleep(random.uniform(0, interval_s))
        while True:
            started = time.perf_counter()
            try:
                await self.client.heartbeat()
                self.stats.heartbeats_ms.append((time.perf_counter() - started) * 1000)
            except MoonrunError as error:
                self.stats.error(f"heartbeat {error.code}")
            # As Run: the interval the last answer told (stretched as the fleet grows).
            session = self.client.session
            await asyncio.sleep(session.heartbeat_interval_s if session else interval_s)

    async def _claims(self) -> None:
        from moonrun.errors import MoonrunError
        from moonrun.run.agent import RunConfig
        from moonrun.run.client import SESSION_ERRORS

        interval_s = RunConfig.claim_interval_s
        while True:
            asked = time.monotonic()
            try:
                jobs = await self.client.claim(CAPACITY, wait_s=self.claim_wait_s)
            except SESSION_ERRORS:
                raise
            except MoonrunError as error:
                self.stats.error(f"claim {error.code}")
                await asyncio.sleep(random.uniform(0.5, 1.0))
                continue
            now = time.time()
            for job in jobs:
                self.stats.received[job["job_id"]] = now
            if jobs:
                await self._finish(jobs)
            elif time.monotonic() - asked < interval_s:
                # As Run does: nothing, and at once although asked to wait (an overloaded
                # platform's empty grant), so poll rather than claim again in a tight loop.
                await asyncio.sleep(interval_s)

    async def _finish(self, jobs: list[dict[str, Any]]) -> None:
        from moonrun.errors import MoonrunError

        evidence = [
            {"job_id": j["job_id"], "attempt": j["attempt"], "lease": j["lease"]} for j in jobs
        ]
        try:
            for answer in await self.client.acks(evidence):
                if isinstance(answer, MoonrunError):
                    self.stats.error(f"ack {answer.code}")
            results = [
                {**e, "outcome": "succeeded", "retryable": False, "output": None} for e in evidence
            ]
            for answer in await self.client.results(results):
                if isinstance(answer, MoonrunError):
                    self.stats.error(f"result {answer.code}")
        except MoonrunError as error:
            self.stats.error(f"ack/result {error.code}")


def worker_main(url: str, pipe: Connection, claim_wait_s: float) -> None:
    """A worker: Runs on one loop, commanded over `pipe` (add, reset, report, stop)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))
    # Thousands of simulated Runs share this process (a real Run is a process of its own): a
    # full garbage collection here would stall all of them at once and be timed as the
    # platform's latency. The platform's own tuning keeps it as rare as there.
    tune_for_serving()
    try:
        import uvloop

        uvloop.run(_worker(url, pipe, claim_wait_s))
    except ImportError:
        asyncio.run(_worker(url, pipe, claim_wait_s))


async def _worker(url: str, pipe: Connection, claim_wait_s: float) -> None:
    from moonrun.run.handlers import advertised_kinds, load_handlers

    kinds = advertised_kinds(load_handlers()) or {}
    stats = Stats()
    runs: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[Any] = asyncio.Queue()
    # A thread reads the pipe: a command (the hosts to add) may be larger than the pipe's
    # buffer, which a reader on the loop would find half-arrived (EAGAIN) and lose.
    threading.Thread(target=_read_commands, args=(pipe, loop, commands), daemon=True).start()
    while True:
        command, argument = await commands.get()
        if command == "add":
            for host in argument:
                runs.append(
                    asyncio.create_task(SimulatedRun(url, host, kinds, stats, claim_wait_s).run())
                )
            pipe.send(len(runs))
        elif command == "registered":
            pipe.send(stats.registered)
        elif command == "reset":
            stats.heartbeats_ms, stats.received, stats.errors = [], {}, {}
            pipe.send(cpu_seconds(os.getpid()))
        elif command == "report":
            pipe.send(
                {
                    "heartbeats_ms": stats.heartbeats_ms,
                    "received": stats.received,
                    "errors": stats.errors,
                    "cpu_s": cpu_seconds(os.getpid()),
                }
            )
        elif command == "stop":
            for task in runs:
                task.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
            pipe.send("stopped")
            return


def _read_commands(
    pipe: Connection, loop: asyncio.AbstractEventLoop, commands: asyncio.Queue[Any]
) -> None:
    while True:
        try:
            command = pipe.recv()
        except (EOFError, OSError):
            return
        loop.call_soon_threadsafe(commands.put_nowait, command)


# -- the bench ------------------------------------------------------------------------------------


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def raise_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


class Admin:
    """The admin on the user API (a connection per job: submits are seconds apart, longer
    than the platform keeps an idle connection)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def submit(self, server_id: str) -> str:
        """The new job's id, or an error code (a platform that does not answer within 30 s
        is measured, not fatal)."""
        body = json.dumps({"kind": "noop"})
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("POST", f"/api/v1/servers/{server_id}/jobs", body, headers)
            answer = connection.getresponse()
            document = json.loads(answer.read())
        except (OSError, ValueError, http.client.HTTPException) as error:
            return f"! submit {type(error).__name__}"
        finally:
            connection.close()
        if answer.status != 201:
            return f"! submit {answer.status}"
        job_id: str = document["id"]
        return job_id


def step(
    options: argparse.Namespace,
    size: int,
    platform: Served,
    pipes: list[Connection],
    hosts: list[Host],
    admin: Admin,
) -> dict[str, Any]:
    started = time.monotonic()
    while sum(_ask(pipe, "registered") for pipe in pipes) < size:
        if time.monotonic() - started > options.join_timeout_s:
            registered = sum(_ask(pipe, "registered") for pipe in pipes)
            print(f"  only {registered} of {size} Runs registered in {options.join_timeout_s} s")
            break
        time.sleep(0.5)
    joined_s = time.monotonic() - started
    time.sleep(options.settle_s)
    pid = platform.process.pid
    workers_before = [_ask(pipe, "reset") for pipe in pipes]
    platform_before, wall_before = cpu_seconds(pid), time.monotonic()
    submitted: dict[str, float] = {}
    refused: dict[str, int] = {}
    gap_s = options.measure_s / (options.jobs + 1)
    for _ in range(options.jobs):
        time.sleep(gap_s)
        job_id = admin.submit(random.choice(hosts[:size]).server_id)
        if job_id.startswith("!"):
            refused[job_id[2:]] = refused.get(job_id[2:], 0) + 1
            continue
        submitted[job_id] = time.time()
    time.sleep(max(0.0, options.measure_s - (time.monotonic() - wall_before)))
    elapsed = time.monotonic() - wall_before
    platform_cpu = (cpu_seconds(pid) - platform_before) / elapsed
    reports = [_ask(pipe, "report") for pipe in pipes]
    heartbeats = [ms for report in reports for ms in report["heartbeats_ms"]]
    received = {job: at for report in reports for job, at in report["received"].items()}
    dispatch = [(received[job] - at) * 1000 for job, at in submitted.items() if job in received]
    errors: dict[str, int] = dict(refused)
    for report in reports:
        for code, count in report["errors"].items():
            errors[code] = errors.get(code, 0) + count
    return {
        "runs": size,
        "joined_s": joined_s,
        "heartbeats": len(heartbeats),
        "heartbeat_p50_ms": percentile(heartbeats, 0.5),
        "heartbeat_p99_ms": percentile(heartbeats, 0.99),
        "dispatched": f"{len(dispatch)}/{options.jobs}",
        "dispatch_p50_ms": percentile(dispatch, 0.5),
        "dispatch_p99_ms": percentile(dispatch, 0.99),
        "platform_cpu": platform_cpu,
        "platform_rss_mib": _rss_mib(pid),
        "platform_fds": _descriptors(pid),
        "errors": errors,
        "worker_cpu": [
            (report["cpu_s"] - before) / elapsed
            for report, before in zip(reports, workers_before, strict=True)
        ],
    }


def _ask(pipe: Connection, command: str, argument: Any = None) -> Any:
    pipe.send((command, argument))
    return pipe.recv()


def print_row(row: dict[str, Any]) -> None:
    workers = " ".join(f"{share:4.0%}" for share in row["worker_cpu"])
    errors = ", ".join(f"{code} {n}" for code, n in sorted(row["errors"].items())) or "none"
    print(
        f"{row['runs']:>6} | {row['heartbeat_p50_ms']:7.1f} {row['heartbeat_p99_ms']:8.1f} | "
        f"{row['dispatch_p50_ms']:7.1f} {row['dispatch_p99_ms']:8.1f} {row['dispatched']:>6} | "
        f"{row['platform_cpu']:5.0%} {row['platform_rss_mib']:6.0f} {row['platform_fds']:6} | "
        f"{workers} | {row['joined_s']:5.1f} | {errors}",
        flush=True,
    )


def bench(options: argparse.Namespace, workdir: Path, store_url: str) -> None:
    steps = sorted(int(n) for n in options.steps.split(","))
    began = time.monotonic()
    hosts = build_fleet(store_url, steps[-1])
    print(f"fleet of {len(hosts)} endpoints built in {time.monotonic() - began:.0f} s", flush=True)
    port = free_port()
    extra = ["--max-connections", str(NOFILE - 512), *options.platform_args.split()]
    command = platform_command(store_url, port, workdir, *extra)
    platform = Served("platform", command, port, workdir, env=child_env())
    context = multiprocessing.get_context("spawn")
    pipes: list[Connection] = []
    workers = []
    try:
        platform.wait_ready()
        for _ in range(options.workers):
            ours, theirs = context.Pipe()
            worker = context.Process(
                target=worker_main, args=(platform.url, theirs, options.claim_wait_s), daemon=True
            )
            worker.start()
            pipes.append(ours)
            workers.append(worker)
        admin = Admin(port)
        print(
            f"{options.workers} workers, claims wait {options.claim_wait_s:.0f} s, "
            f"capacity {CAPACITY}; "
            f"settle {options.settle_s:.0f} s, measure {options.measure_s:.0f} s, "
            f"{options.jobs} jobs per step"
        )
        print(
            "  runs | heartbeat p50/p99 ms | dispatch p50/p99 ms  done | platform cpu "
            "rss MiB  fds | workers' cpu | join s | errors"
        )
        added = 0
        for size in steps:
            for n, pipe in enumerate(pipes):
                share = hosts[added:size][n :: len(pipes)]
                _ask(pipe, "add", share)
            added = size
            print_row(step(options, size, platform, pipes, hosts, admin))
    finally:
        for pipe in pipes:
            with contextlib.suppress(Exception):
                _ask(pipe, "stop")
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
        platform.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="500,1000,2000,5000,10000")
    parser.add_argument("--store", choices=("file", "mysql"), default="file")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--settle-s", type=float, default=15.0)
    parser.add_argument("--measure-s", type=float, default=30.0)
    parser.add_argument("--join-timeout-s", type=float, default=180.0)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument(
        "--claim-wait-s",
        type=float,
        default=CLAIM_WAIT_S,
        help="how long each Run's claim waits at the platform",
    )
    parser.add_argument(
        "--platform-args",
        default="",
        help="more `platform serve` options, for A/B runs (say '--max-heartbeats-per-s 0')",
    )
    options = parser.parse_args()
    raise_nofile()  # the platform inherits it
    with tempfile.TemporaryDirectory(prefix="moonrun-fleet-") as directory:
        workdir = Path(directory)
        if options.store == "file":
            bench(options, workdir, f"file:{workdir / 'platform.db'}")
            return
        with mysql_database("moonrun_fleet") as url:
            if url is not None:
                bench(options, workdir, url)


if __name__ == "__main__":
    main()
