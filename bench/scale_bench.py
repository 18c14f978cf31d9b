"""Does a request cost the same with 1,000 and 1,000,000 jobs stored? Ratios large/small.

For each durable store, FileStore (a temporary SQLite file) and MySQLStore (a temporary
`moonrun_scale_*` database on MOONRUN_BENCH_MYSQL_URL, default mysql://root@127.0.0.1:3306/;
skipped when unreachable), the bench builds two stores: a small one (`--small`, default 1,000
jobs) and a large one (`--large`, default 1,000,000). Both hold one admin, one joined endpoint
and one server, and 90% succeeded and 10% queued jobs of that server, created 1 ms apart in
the past, every tenth one queued. The endpoint, server and admin are made by the real service
in this process; the jobs are bulk-loaded with `store.insert_jobs`, 5,000 to a write. A
succeeded job is the domain's own record (create_job, claim, ack, result succeeded, built once)
copied with `dataclasses.replace` under its own id (random, as the platform makes them) and
times. Then statistics are gathered as a long-lived database would have them: `ANALYZE` on
SQLite, `ANALYZE TABLE jobs` on MySQL. Build times are printed; they are not measured figures.

Then the real `moonrun platform serve` runs over a store in a subprocess on this machine
(sweeper on, logs at warning), one platform at a time, in `--rounds` rounds that alternate
small and large (so that load from elsewhere on the machine falls on both alike); each round
starts the platform afresh, registers a Run session, and measures, in this order:

  start-up        process start until GET /healthz answers 200 (polled every 5 ms)
  list by state   GET /api/v1/jobs?state=queued&limit=50
  list by server  GET /api/v1/jobs?server_id=<id>&limit=50
  list by both    GET /api/v1/jobs?server_id=<id>&state=queued&limit=50
  /metrics        GET /metrics
  create          POST /api/v1/servers/<id>/jobs {"kind": "noop"}
  claim           POST /run/v1/jobs/claim {"max_jobs": 1}, signed with the session key as
                  Run signs it, on a session of capacity 1 (so the capacity check reads the
                  endpoint's active jobs every time); the granted job is then acked and
                  finished (succeeded), untimed, so capacity is free for the next claim

Requests go one at a time on one keep-alive connection (http.client), as the admin (Bearer
token) or as the session; each figure takes `--requests` timed requests per round after
`--warmup` untimed ones. Creates come before claims, so the small store never runs out of
queued jobs. The table gives each figure's median over all rounds (p50 of the requests; the
median start-up) for the small and the large store, the ratio large/small, and whether it is
within its bound: 1.5 for everything, 2 for /metrics.

    python bench/scale_bench.py [--small 1000] [--large 1000000] [--rounds 3]
                                [--requests 50] [--warmup 10] [--stores file,mysql]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import http.client
import json
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kit import Served, child_env, free_port, mysql_connect, mysql_database, platform_command
from moonrun.clock import SystemClock
from moonrun.scheduling import messages
from moonrun.scheduling.fingerprint import token_hash
from moonrun.scheduling.jobs import Job, JobState, RunResult, claim, create_job
from moonrun.security import signing
from moonrun.security.tokens import SystemTokenSource
from moonrun.service.config import SchedulingSettings
from moonrun.service.directory import Directory
from moonrun.service.scheduling import SchedulingService
from moonrun.store.file import FileStore
from moonrun.store.mysql import MySQLStore
from moonrun.store.protocol import Store

ADMIN_TOKEN = "mra_" + secrets.token_urlsafe(32)
CHUNK = 5_000
SPACING_MS = 1
QUEUED_EVERY = 10
"""Every tenth job is queued, the others succeeded: 10% queued, 90% succeeded."""
BOUND = 1.5
BOUNDS = {"/metrics": 2.0}
STORES = ("file", "mysql")
ORDER = (
    "start-up",
    "claim",
    "list by state",
    "list by server",
    "list by server+state",
    "create",
    "/metrics",
)
"""The figures, in the order of the table."""


# -- building a store --------------------------------------------------------------------------


@dataclass
class Built:
    """One store, loaded and analysed, ready to be served."""

    kind: str
    size: int
    url: str
    endpoint_id: str
    server_id: str
    identity: Ed25519PrivateKey
    load_s: float = 0.0
    analyze_s: float = 0.0


def finished_template(server_id: str, endpoint_id: str, job: Job) -> Job:
    """`job` taken through one whole succeeded attempt by the domain: claim, ack, result."""
    lease = "mrl_scale-bench"
    at = job.created_at
    caller = messages.Caller(endpoint_id, 1)
    evidence = messages.Evidence(1, lease)
    accepted = claim(
        job, now=at + 10, lease_hash=token_hash(lease), generation=1, ack_timeout_ms=30_000
    )
    acked = messages.ack(accepted, caller, evidence, now=at + 20, lease_ttl_ms=40_000, draw=0.0)
    assert acked.error is None, acked.error
    done = messages.result(
        acked.job, caller, evidence, RunResult.of("succeeded", False), now=at + 30, draw=0.0
    )
    assert done.error is None, done.error
    assert done.job.state is JobState.SUCCEEDED
    return done.job


def moved(template: Job, job_id: str, created_at: int) -> Job:
    """The finished `template` as another job: its own id, every time shifted alike."""
    shift = created_at - template.created_at
    assert template.result is not None
    assert template.terminal is not None
    return dataclasses.replace(
        template,
        id=job_id,
        created_at=created_at,
        eligible_at=template.eligible_at + shift,
        updated_at=template.updated_at + shift,
        claimed_at=None if template.claimed_at is None else template.claimed_at + shift,
        result=dataclasses.replace(template.result, at=template.result.at + shift),
        terminal=dataclasses.replace(template.terminal, at=template.terminal.at + shift),
        history=tuple(
            dataclasses.replace(
                summary,
                claimed_at=None if summary.claimed_at is None else summary.claimed_at + shift,
                ended_at=summary.ended_at + shift,
            )
            for summary in template.history
        ),
    )


def job_chunks(
    size: int, server_id: str, endpoint_id: str, owner_id: str, now: int
) -> Iterator[list[Job]]:
    """`size` jobs in chunks of CHUNK, oldest first, every QUEUED_EVERY-th one queued."""
    tokens = SystemTokenSource()
    policy = SchedulingSettings().default_policy()
    start = now - 60_000 - size * SPACING_MS

    def queued(job_id: str, created_at: int) -> Job:
        return create_job(
            job_id=job_id,
            server_id=server_id,
            endpoint_id=endpoint_id,
            owner_id=owner_id,
            kind="noop",
            payload=None,
            policy=policy,
            now=created_at,
        )

    template = finished_template(server_id, endpoint_id, queued("job_template", start))
    assert moved(template, template.id, template.created_at) == template
    for first in range(0, size, CHUNK):
        chunk = []
        for n in range(first, min(size, first + CHUNK)):
            job_id, created_at = tokens.identifier("job_"), start + n * SPACING_MS
            if n % QUEUED_EVERY == QUEUED_EVERY - 1:
                chunk.append(queued(job_id, created_at))
            else:
                chunk.append(moved(template, job_id, created_at))
        yield chunk


def build(kind: str, url: str, size: int) -> Built:
    """Admin, endpoint (joined), server and `size` jobs in the store at `url`, then ANALYZE."""
    store: Store = FileStore(url.removeprefix("file:")) if kind == "file" else MySQLStore(url)
    try:
        clock, tokens = SystemClock(), SystemTokenSource()
        service = SchedulingService(store, clock, tokens, SchedulingSettings())
        directory = Directory(store, clock, tokens)
        admin = directory.ensure_bootstrap_admin(ADMIN_TOKEN)
        enrolled = service.create_endpoint(admin, "scale-host")
        identity = Ed25519PrivateKey.generate()
        raw = identity.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        endpoint = service.join_endpoint(enrolled.join_token, signing.b64url(raw))
        server = directory.create_server(admin, "scale", endpoint_id=endpoint.id, owner_id=admin.id)
        built = Built(kind, size, url, endpoint.id, server.id, identity)
        started = time.perf_counter()
        for chunk in job_chunks(size, server.id, endpoint.id, admin.id, clock.now()):
            store.insert_jobs(chunk)
        built.load_s = time.perf_counter() - started
    finally:
        store.close()
    started = time.perf_counter()
    analyze(kind, url)
    built.analyze_s = time.perf_counter() - started
    return built


def analyze(kind: str, url: str) -> None:
    """Gather the planner's statistics, as SQLite advises for long-lived databases."""
    if kind == "file":
        connection = sqlite3.connect(url.removeprefix("file:"), isolation_level=None)
        try:
            connection.execute("ANALYZE")
        finally:
            connection.close()
        return
    connection = mysql_connect(url, url.rsplit("/", 1)[1])
    try:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE TABLE jobs")
            cursor.fetchall()
    finally:
        connection.close()


# -- measuring one served store ----------------------------------------------------------------


@dataclass
class Client:
    """One keep-alive connection to the platform: the admin's API calls and Run's signed ones."""

    port: int
    endpoint_id: str
    identity: Ed25519PrivateKey
    session_id: str = ""
    session_key: bytes = b""
    connection: http.client.HTTPConnection = field(init=False)

    def __post_init__(self) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def send(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], expect: int
    ) -> Any:
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        data = response.read()
        if response.status != expect:
            raise SystemExit(f"{method} {path}: {response.status} {data[:300]!r}")
        return data

    def admin(self, method: str, path: str, body: Any = None, *, expect: int = 200) -> Any:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        return self.send(method, path, data, headers, expect)

    def signed(self, path: str, body: Any, *, expect: int = 200) -> Any:
        """POST `body` signed as Run signs it (the identity key only to register)."""
        data = json.dumps(body).encode()
        registering = path == "/run/v1/sessions"
        headers = signing.sign(
            "POST",
            path,
            "",
            data,
            key_id=f"endpoint:{self.endpoint_id}" if registering else f"session:{self.session_id}",
            key=self.identity if registering else self.session_key,
            created=int(time.time()),
            nonce=signing.b64url(secrets.token_bytes(16)),
        )
        headers["Content-Type"] = "application/json"
        return json.loads(self.send("POST", path, data, headers, expect))

    def register(self) -> None:
        """A new session of capacity 1, reconciled, ready to claim."""
        session = self.signed(
            "/run/v1/sessions",
            {"boot_id": secrets.token_hex(8), "run_version": "0.1.0", "capacity": 1},
            expect=201,
        )
        self.session_id = session["session_id"]
        self.session_key = signing.b64url_decode(session["session_key"])
        self.signed("/run/v1/reconcile", {"entries": []})

    def claim_one(self) -> float:
        """Claim one job (timed), then ack and finish it (untimed); the claim's seconds."""
        started = time.perf_counter()
        claimed = self.signed("/run/v1/jobs/claim", {"max_jobs": 1})
        seconds = time.perf_counter() - started
        if len(claimed["jobs"]) != 1:
            raise SystemExit(f"a claim granted {len(claimed['jobs'])} jobs, not 1")
        (job,) = claimed["jobs"]
        evidence = {"attempt": job["attempt"], "lease": job["lease"]}
        self.signed(f"/run/v1/jobs/{job['job_id']}/ack", evidence)
        done = self.signed(
            f"/run/v1/jobs/{job['job_id']}/result",
            {**evidence, "outcome": "succeeded", "retryable": False},
        )
        if done["state"] != "succeeded":
            raise SystemExit(f"job {job['job_id']} ended {done['state']}")
        return seconds

    def close(self) -> None:
        self.connection.close()


def timed(call: Callable[[], object]) -> Callable[[], float]:
    """`call` as a sample: the seconds it took."""

    def sample() -> float:
        started = time.perf_counter()
        call()
        return time.perf_counter() - started

    return sample


def wait_healthy(served: Served, port: int) -> None:
    """Block until GET /healthz answers 200, polling every 5 ms."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if served.process.poll() is not None:
            raise SystemExit(f"{served.name} exited at start:\n{served.tail()}")
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            connection.request("GET", "/healthz")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            connection.close()
        time.sleep(0.005)
    raise SystemExit(f"{served.name} did not answer /healthz in 60 s:\n{served.tail()}")


def serve_round(
    built: Built, workdir: Path, args: argparse.Namespace, samples: dict[str, list[float]]
) -> None:
    """Start the platform over `built`, add one start-up and `--requests` samples of every
    request figure to `samples` (seconds), then stop it."""
    workdir.mkdir(exist_ok=True)
    port = free_port()
    command = platform_command(built.url, port, workdir)
    started = time.perf_counter()
    served = Served("platform", command, port, workdir, child_env(ADMIN_TOKEN))
    try:
        wait_healthy(served, port)
        samples["start-up"].append(time.perf_counter() - started)
        client = Client(port, built.endpoint_id, built.identity)
        try:
            client.register()
            server = built.server_id
            gets = {
                "list by state": "/api/v1/jobs?state=queued&limit=50",
                "list by server": f"/api/v1/jobs?server_id={server}&limit=50",
                "list by server+state": f"/api/v1/jobs?server_id={server}&state=queued&limit=50",
            }
            requests: dict[str, Callable[[], float]] = {
                label: timed(functools.partial(client.admin, "GET", path))
                for label, path in gets.items()
            }
            requests["/metrics"] = timed(lambda: client.send("GET", "/metrics", None, {}, 200))
            create = f"/api/v1/servers/{server}/jobs"
            requests["create"] = timed(
                lambda: client.admin("POST", create, {"kind": "noop"}, expect=201)
            )
            requests["claim"] = client.claim_one  # after the creates: never runs out of jobs
            for label, sample in requests.items():
                for _ in range(args.warmup):
                    sample()
                samples[label].extend(sample() for _ in range(args.requests))
        finally:
            client.close()
    except BaseException:
        print(served.tail(), file=sys.stderr)
        raise
    finally:
        served.stop()


def measure(small: Built, large: Built, workdir: Path, args: argparse.Namespace) -> list[str]:
    """`--rounds` rounds of small then large; the report lines of the medians."""
    samples: dict[int, dict[str, list[float]]] = {
        built.size: {label: [] for label in ORDER} for built in (small, large)
    }
    for _ in range(args.rounds):
        for built in (small, large):
            serve_round(built, workdir / f"{built.kind}-{built.size}", args, samples[built.size])
    medians = [
        {label: statistics.median(found) for label, found in samples[built.size].items()}
        for built in (small, large)
    ]
    return report(small.kind, *medians)


# -- the run -----------------------------------------------------------------------------------


def report(kind: str, small: dict[str, float], large: dict[str, float]) -> list[str]:
    lines = []
    for label in ORDER:
        ratio = large[label] / small[label]
        bound = BOUNDS.get(label, BOUND)
        verdict = "ok" if ratio <= bound else "OVER"
        lines.append(
            f"{kind:6} {label:22} {small[label] * 1000:10.2f} {large[label] * 1000:10.2f}"
            f" {ratio:8.2f} {'<= ' + str(bound):>7} {verdict:>5}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1_000, help="jobs in the small store")
    parser.add_argument("--large", type=int, default=1_000_000, help="jobs in the large store")
    parser.add_argument("--rounds", type=int, default=3, help="starts of each platform")
    parser.add_argument(
        "--requests", type=int, default=50, help="timed requests per figure and round"
    )
    parser.add_argument("--warmup", type=int, default=10, help="untimed requests first, each")
    parser.add_argument("--stores", default="file,mysql", help="comma-separated: file,mysql")
    args = parser.parse_args()
    kinds = [kind for kind in args.stores.split(",") if kind]
    if set(kinds) - set(STORES) or args.small < QUEUED_EVERY or args.large <= args.small:
        parser.error("--stores takes file,mysql; need 10 <= --small < --large")
    if args.requests < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("--requests and --rounds must be at least 1, --warmup at least 0")

    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="moonrun-scale-bench-") as tmp, ExitStack() as stack:
        for kind in kinds:
            urls: list[str] = []
            for size in (args.small, args.large):
                if kind == "file":
                    urls.append(f"file:{Path(tmp) / f'{kind}-{size}.db'}")
                    continue
                url = stack.enter_context(mysql_database("moonrun_scale"))
                if url is None:
                    break
                urls.append(url)
            if len(urls) < 2:
                continue
            small, large = (
                build(kind, url, size)
                for url, size in zip(urls, (args.small, args.large), strict=True)
            )
            for built in (small, large):
                print(
                    f"{kind}: {built.size:,} jobs loaded in {built.load_s:.1f} s"
                    f" ({built.size / built.load_s:,.0f} jobs/s), ANALYZE {built.analyze_s:.1f} s",
                    flush=True,
                )
            started = time.perf_counter()
            lines += measure(small, large, Path(tmp), args)
            print(f"{kind}: measured in {time.perf_counter() - started:.1f} s", flush=True)
    print()
    print(
        f"medians of {args.rounds} rounds (small, then large): start-up of {args.rounds} starts,"
        f" requests of {args.rounds} x {args.requests} (each round after {args.warmup});"
        f" small {args.small:,} jobs, large {args.large:,} jobs"
    )
    print(
        f"{'store':6} {'figure':22} {'small ms':>10} {'large ms':>10} {'ratio':>8}"
        f" {'bound':>7} {'':>5}"
    )
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
