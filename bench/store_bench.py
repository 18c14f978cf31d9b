"""Per store: claim -> ack -> result lifecycles/s (1 and 8 callers) against the database's own
commit rate, and claim latency with 1k vs 100k jobs queued.

Runs the real SchedulingService over MemoryStore, FileStore (a temporary SQLite file) and
MySQLStore (a temporary `moonrun_bench_*` database on MOONRUN_BENCH_MYSQL_URL, default
mysql://root@127.0.0.1:3306/; skipped when unreachable). In the same run it measures what the
database does with no moonrun code at all: plain `sqlite3` (WAL, synchronous=FULL) and plain
PyMySQL (InnoDB, autocommit), each committing one small row per transaction from one client.
A lifecycle is three commits (claim, ack, result); the fraction printed is lifecycles/s over
those single-row commits/s, the share of the database's commit rate moonrun turns into work.
MySQLStore runs twice when mysqlclient is installed: `mysql` (mysqlclient, the default then) and
`mysql-py` (PyMySQL forced by `mysql+pymysql://`); both are divided by the PyMySQL floor, and
the mysqlclient floor is printed beside it.

Each rate is the median of `--repeat` measurements (default 3), taken in the same run: the
disk's fsync time drifts by ±10% from second to second here, and one unlucky floor or one
unlucky lifecycle run would otherwise decide the fraction.

    python bench/store_bench.py [--lifecycles N] [--callers 8] [--small 1000] [--large 100000]
                                [--claims N] [--commits N] [--repeat 3]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import secrets
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kit import mysql_connect, mysql_database
from moonrun.clock import SystemClock
from moonrun.scheduling import jobs as domain
from moonrun.scheduling.messages import Evidence
from moonrun.security.tokens import SystemTokenSource
from moonrun.service.config import SchedulingSettings
from moonrun.service.directory import Directory
from moonrun.service.scheduling import SchedulingService
from moonrun.store.file import FileStore
from moonrun.store.memory import MemoryStore
from moonrun.store.mysql import MySQLStore
from moonrun.store.protocol import Store

PUBLIC_KEY = "B" * 43
ROW = "x" * 200


class Bench:
    """One platform over one store, with an endpoint, a server and a reconciled session."""

    def __init__(self, store: Store, capacity: int = 1) -> None:
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
            self.endpoint.id, boot_id="bench", run_version="0.1.0", capacity=capacity
        ).session.id
        self.service.reconcile(self.session, [])

    def load(self, count: int) -> None:
        """Queue `count` jobs, 2,000 to a store write."""
        now = SystemClock().now() - 1000
        policy = self.service.settings.default_policy()
        queued = [
            domain.create_job(
                job_id=f"job_{secrets.token_hex(8)}",
                server_id=self.server.id,
                endpoint_id=self.endpoint.id,
                owner_id=self.server.owner_id,
                kind="noop",
                payload=None,
                policy=policy,
                now=now,
            )
            for _ in range(count)
        ]
        for start in range(0, len(queued), 2000):
            self.store.insert_jobs(queued[start : start + 2000])

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


def lifecycles_per_second(make: Callable[[], Store], count: int, callers: int) -> float:
    store = make()
    try:
        bench = Bench(store, capacity=callers)
        bench.load(count)
        start = threading.Barrier(callers + 1)

        def caller(share: int) -> None:
            start.wait()
            for _ in range(share):
                bench.lifecycle()

        shares = [count // callers + (n < count % callers) for n in range(callers)]
        threads = [threading.Thread(target=caller, args=(share,)) for share in shares]
        for thread in threads:
            thread.start()
        start.wait()
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        return count / (time.perf_counter() - started)
    finally:
        store.close()


def claim_latency(make: Callable[[], Store], queued: int, claims: int) -> tuple[float, float]:
    """p50 and p99 claim latency (ms) with `queued` jobs waiting."""
    store = make()
    try:
        bench = Bench(store)
        bench.load(queued + claims + 20)
        for _ in range(20):
            bench.lifecycle()  # warm the caches and the connection pool
        samples = sorted(bench.lifecycle() for _ in range(claims))
    finally:
        store.close()
    p50 = statistics.median(samples) * 1000
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1000
    return p50, p99


def sqlite_commits_per_second(directory: Path, count: int) -> float:
    """Plain sqlite3, WAL, synchronous=FULL: one small row per transaction, one client."""
    path = directory / f"plain-{secrets.token_hex(4)}.db"
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = FULL")
    connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
    started = time.perf_counter()
    for n in range(count):
        connection.execute("BEGIN")
        connection.execute("INSERT INTO t (id, body) VALUES (?, ?)", (n, ROW))
        connection.execute("COMMIT")
    rate = count / (time.perf_counter() - started)
    connection.close()
    return rate


def mysql_commits_per_second(url: str, count: int, driver: str = "pymysql") -> float:
    """Plain PyMySQL (or mysqlclient), InnoDB, autocommit: one small row per transaction."""
    connection = mysql_connect(url, url.rsplit("/", 1)[1], driver=driver)
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, body TEXT NOT NULL)")
        started = time.perf_counter()
        for n in range(count):
            cursor.execute("INSERT INTO t (id, body) VALUES (%s, %s)", (n, ROW))
        rate = count / (time.perf_counter() - started)
        cursor.execute("DROP TABLE t")
    connection.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lifecycles", type=int, default=3000)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--commits", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    def median(measure: Callable[[], float]) -> float:
        return statistics.median(measure() for _ in range(args.repeat))

    with tempfile.TemporaryDirectory() as tmp, mysql_database() as mysql_url:
        counter = iter(range(10**6))

        def file_store() -> Store:
            return FileStore(Path(tmp) / f"bench-{next(counter)}.db")

        makers: dict[str, Callable[[], Store]] = {"memory": MemoryStore, "file": file_store}
        floors = {"file": median(lambda: sqlite_commits_per_second(Path(tmp), args.commits))}
        c_floor = 0.0
        if mysql_url is not None:
            url = mysql_url
            makers["mysql"] = lambda: MySQLStore(url)
            floors["mysql"] = median(lambda: mysql_commits_per_second(url, args.commits))
            if importlib.util.find_spec("MySQLdb") is not None:
                py_url = url.replace("mysql://", "mysql+pymysql://", 1)
                makers["mysql-py"] = lambda: MySQLStore(py_url)
                floors["mysql-py"] = floors["mysql"]
                c_floor = median(
                    lambda: mysql_commits_per_second(url, args.commits, driver="MySQLdb")
                )

        print("single-row commits/s, no moonrun code, one client:")
        print(f"  sqlite3 (WAL, FULL) {floors['file']:10,.0f}")
        if "mysql" in floors:
            print(f"  PyMySQL (InnoDB)    {floors['mysql']:10,.0f}")
        if c_floor:
            print(f"  mysqlclient         {c_floor:10,.0f}  (not a divisor; for reference)")
        print()
        print(
            f"{'store':8} {'lc/s 1':>9} {'lc/s ' + str(args.callers):>9} {'x commits 1':>12}"
            f" {'x commits ' + str(args.callers):>12} {'claim p50/p99 @' + str(args.small):>23}"
            f" {'claim p50/p99 @' + str(args.large):>24} {'p50 ratio':>10}"
        )
        for name, make in makers.items():
            one = median(functools.partial(lifecycles_per_second, make, args.lifecycles, 1))
            many = median(
                functools.partial(lifecycles_per_second, make, args.lifecycles, args.callers)
            )
            floor = floors.get(name)
            fractions = f"{one / floor:12.3f} {many / floor:12.3f}" if floor else f"{'':12} {'':12}"
            small = claim_latency(make, args.small, args.claims)
            large = claim_latency(make, args.large, args.claims)
            print(
                f"{name:8} {one:9,.0f} {many:9,.0f} {fractions}"
                f" {small[0]:9.3f} / {small[1]:7.3f} ms"
                f" {large[0]:10.3f} / {large[1]:7.3f} ms {large[0] / small[0]:10.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
