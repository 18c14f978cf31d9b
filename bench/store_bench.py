"""Per store: claim -> ack -> result lifecycles/s, and claim latency with 1k vs 100k queued jobs.

Runs the real SchedulingService over MemoryStore, FileStore (a temporary SQLite file) and
MySQLStore (a temporary `moonrun_bench_*` database on MOONRUN_BENCH_MYSQL_URL, default
mysql://root@127.0.0.1:3306/; skipped when unreachable). Queues are bulk-loaded straight into
the table so that loading 100k jobs does not dominate the run.

    python bench/store_bench.py [--lifecycles N] [--small 1000] [--large 100000] [--claims N]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pymysql
from sqlalchemy import insert

from moonrun.clock import SystemClock
from moonrun.platform.config import SchedulingSettings
from moonrun.platform.directory import Directory
from moonrun.platform.service import SchedulingService
from moonrun.scheduling import jobs as domain
from moonrun.scheduling.messages import Evidence
from moonrun.security.tokens import SystemTokenSource
from moonrun.store import codec
from moonrun.store.file import FileStore
from moonrun.store.memory import MemoryStore
from moonrun.store.mysql import MySQLStore
from moonrun.store.protocol import Store
from moonrun.store.schema import jobs as jobs_table
from moonrun.store.sql import SqlStore

PUBLIC_KEY = "B" * 43


class Bench:
    """One platform over one store, with an endpoint, a server and a reconciled session."""

    def __init__(self, store: Store) -> None:
        self.store = store
        clock, tokens = SystemClock(), SystemTokenSource()
        settings = SchedulingSettings(max_claim_batch=1)
        self.service = SchedulingService(store, clock, tokens, settings)
        directory = Directory(store, clock, tokens)
        self.admin = directory.ensure_bootstrap_admin("mra_bench")
        enrolled = self.service.create_endpoint(self.admin, "bench-" + secrets.token_hex(4))
        self.endpoint = enrolled.endpoint
        self.service.join_endpoint(enrolled.join_token, PUBLIC_KEY)
        self.server = directory.create_server(
            self.admin, "bench", endpoint_id=self.endpoint.id, owner_id=self.admin.id
        )
        self.session = self.service.register_session(
            self.endpoint.id, boot_id="bench", run_version="0.1.0", capacity=1
        ).session.id
        self.service.reconcile(self.session, [])

    def load(self, count: int) -> None:
        """Queue `count` jobs, in bulk where the store is SQL."""
        now = SystemClock().now() - 1000
        policy = self.service.settings.default_policy()
        queued = [
            domain.create_job(
                job_id=f"job_{secrets.token_hex(8)}",
                server_id=self.server.id,
                endpoint_id=self.endpoint.id,
                kind="noop",
                payload=None,
                policy=policy,
                now=now,
            )
            for _ in range(count)
        ]
        if isinstance(self.store, SqlStore):
            rows = [codec.job_to_row(job) for job in queued]
            for start in range(0, len(rows), 2000):
                chunk = rows[start : start + 2000]
                self.store._transact(lambda c, chunk=chunk: c.execute(insert(jobs_table), chunk))
        else:
            for job in queued:
                self.store.insert_job(job)

    def lifecycle(self) -> float:
        """One claim -> ack -> result; returns the claim's latency in seconds."""
        started = time.perf_counter()
        (granted,) = self.service.claim(self.session, 1)
        claimed = time.perf_counter()
        evidence = Evidence(granted.attempt, granted.lease)
        self.service.ack(self.session, granted.job_id, evidence)
        self.service.result(
            self.session, granted.job_id, evidence, outcome="succeeded", retryable=False
        )
        return claimed - started


def lifecycles_per_second(bench: Bench, count: int) -> float:
    bench.load(count)
    started = time.perf_counter()
    for _ in range(count):
        bench.lifecycle()
    return count / (time.perf_counter() - started)


def claim_latency(make: Callable[[], Store], queued: int, claims: int) -> tuple[float, float]:
    """p50 and p99 claim latency (ms) with `queued` jobs waiting."""
    store = make()
    try:
        bench = Bench(store)
        bench.load(queued + claims)
        for _ in range(20):
            bench.lifecycle()  # warm the caches and the connection pool
        samples = sorted(bench.lifecycle() for _ in range(claims))
    finally:
        store.close()
    p50 = statistics.median(samples) * 1000
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1000
    return p50, p99


@contextmanager
def mysql_database() -> Iterator[str | None]:
    base = os.environ.get("MOONRUN_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/")
    parts = urlsplit(base)
    try:
        admin = pymysql.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=parts.username or "root",
            password=parts.password or "",
            autocommit=True,
            connect_timeout=3,
        )
    except pymysql.err.MySQLError as error:
        print(f"mysql: skipped ({error})")
        yield None
        return
    name = f"moonrun_bench_{secrets.token_hex(4)}"
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    try:
        yield f"{parts.scheme}://{parts.netloc}/{name}"
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE {name}")
        admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lifecycles", type=int, default=2000)
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=500)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, mysql_database() as mysql_url:
        counter = iter(range(10**6))

        def file_store() -> Store:
            return FileStore(Path(tmp) / f"bench-{next(counter)}.db")

        makers: dict[str, Callable[[], Store]] = {"memory": MemoryStore, "file": file_store}
        if mysql_url is not None:
            url = mysql_url
            makers["mysql"] = lambda: MySQLStore(url)

        print(
            f"{'store':8} {'lifecycles/s':>13} {'claim p50/p99 @' + str(args.small):>22}"
            f" {'claim p50/p99 @' + str(args.large):>24} {'p50 ratio':>10}"
        )
        for name, make in makers.items():
            store = make()
            try:
                rate = lifecycles_per_second(Bench(store), args.lifecycles)
            finally:
                store.close()
            small = claim_latency(make, args.small, args.claims)
            large = claim_latency(make, args.large, args.claims)
            print(
                f"{name:8} {rate:13,.0f} {small[0]:10.3f} / {small[1]:7.3f} ms"
                f" {large[0]:11.3f} / {large[1]:7.3f} ms {large[0] / small[0]:10.2f}"
            )


if __name__ == "__main__":
    main()
