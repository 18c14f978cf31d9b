"""PostgresStore: PostgreSQL 13+ through psycopg 3, for several platforms on one database.

Writes run at READ COMMITTED (PostgreSQL's default), one transaction per unit on a connection
of a `psycopg_pool.ConnectionPool`. Claims lock their candidates with `SELECT ... FOR UPDATE
SKIP LOCKED`, so two platform processes claiming at once take different jobs; every other job
write is a compare-and-swap on `version`. Deadlocks and serialization failures run the unit
again, a bounded number of times. Job counts are spread over shards, as on MySQL, so that
concurrent writers rarely wait for one another's counter row.

psycopg is an optional dependency (`pip install 'moonrun[postgres]'`): its binary build where
the platform has one, else the pure-Python one over the system's libpq.
"""

from __future__ import annotations

import contextlib
import importlib.util
import random
import re
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from moonrun.backoff import Backoff
from moonrun.errors import StoreUnavailable
from moonrun.scheduling.groups import Group
from moonrun.scheduling.jobs import Job
from moonrun.scheduling.time import Instant
from moonrun.store import codec
from moonrun.store.pg_cursor import NumberedCursor
from moonrun.store.pg_wakeups import RECONNECT, PostgresWakeups
from moonrun.store.protocol import IdempotencyRecord
from moonrun.store.queries import COUNT_SHARDS, Queries
from moonrun.store.sql import (
    Cursor,
    SqlStore,
    count_move,
    duplicate,
    idempotency_row,
    job_and_row,
)

T = TypeVar("T")

RETRYABLE_STATES = frozenset({"40001", "40P01", "55P03"})
"""serialization_failure, deadlock_detected, lock_not_available: run the unit again."""
CONFLICT_BACKOFF = Backoff(initial_s=0.01, max_s=0.2)
SCHEMA_LOCK = 0x6D6F6F6E72756E  # "moonrun": the advisory lock that serialises migrations
POOL_SIZE = 16
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
"""libpq's `sslmode`s, weakest first (docs/operations.md, "PostgreSQL")."""
OPTIMISTIC_TRIES = 3
"""How many times a one-job write reads and swaps before it takes the row's lock instead."""
SWAPS_PER_STATEMENT = 50
"""At most this many jobs' swaps in one statement (`_cas_all`)."""
CHECK_IDLE_S = 1.0
"""A pooled connection idle this long is checked before it is used again."""
_STATE_NAME = re.compile(r"[a-z_]{1,32}")
"""What a job state's name is made of: the count changes are written as literals."""


class PostgresStore(SqlStore):
    """A store in one PostgreSQL database, shared by any number of platform processes."""

    count_shards = COUNT_SHARDS
    write_retries = 8

    def __init__(self, url: str, *, connect_timeout_s: int = 5, pool_size: int = POOL_SIZE):
        self.url = _parse(url)
        psycopg, pool = _driver()
        self._psycopg, self._psycopg_pool = psycopg, pool
        self._idle_since: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        """When each pooled connection last went back to the pool."""
        self._unit = threading.local()
        """The count changes of the unit this thread is writing (sent with its COMMIT)."""
        super().__init__(Queries("postgresql"), redact(url))
        options: dict[str, Any] = {
            "host": self.url.host or "127.0.0.1",
            "port": self.url.port or 5432,
            "user": self.url.username or "",
            "password": self.url.password or "",
            "dbname": self.url.database,
            "connect_timeout": connect_timeout_s,
            "application_name": "moonrun",
        }
        # The URL's query is libpq's options (`?sslmode=verify-full&sslrootcert=...`): the pool
        # and the listener connect with them too, not only the migration.
        for name, value in self.url.query.items():
            options[name] = value if isinstance(value, str) else value[-1]
        try:
            conninfo = psycopg.conninfo.make_conninfo(**options)
        except psycopg.ProgrammingError as error:  # an option libpq does not know
            raise self._unavailable(error) from None
        self._conninfo = conninfo
        self._migrate(
            create_engine(
                self.url.set(drivername="postgresql+psycopg"),
                poolclass=NullPool,
                connect_args={"connect_timeout": connect_timeout_s},
            )
        )
        self._pool = pool.ConnectionPool(
            conninfo,
            min_size=1,
            max_size=pool_size,
            timeout=connect_timeout_s,
            # Every connection is in autocommit: a read is one round trip, and a write opens
            # its own transaction. Switching modes per checkout costs a step each time, and a
            # `reset` callback would send every returned connection through the pool's worker
            # thread (a thread hop per query, measured: reads 125-170 us against MySQL's 30).
            kwargs={"autocommit": True},
            check=self._check_if_idle,
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except Exception as error:  # the pool says only that it timed out: say why
            self._pool.close()
            raise self._unavailable(error) from None

    def _cursor(self, connection: Any) -> NumberedCursor:
        """The connection's one cursor, made on its first use: a new psycopg cursor per
        statement cost about 10 us of CPU (`bench/peer_bench.py` over PostgreSQL)."""
        cursor: NumberedCursor | None = getattr(connection, "_moonrun_cursor", None)
        if cursor is None:
            cursor = NumberedCursor(self._psycopg.RawCursor(connection))
            connection._moonrun_cursor = cursor
        return cursor

    def _check_if_idle(self, connection: Any) -> None:
        """Check a pooled connection (one round trip) before use if it sat idle CHECK_IDLE_S
        or longer, or was never used: one the database dropped meanwhile (a restart, a
        failover, an idle timeout) is replaced instead of failing a request. One reused at once
        is not checked: checking every checkout doubled a busy platform's round trips (a third
        of its time in `peer_bench.py`)."""
        returned = self._idle_since.get(connection)
        if returned is None or time.monotonic() - returned >= CHECK_IDLE_S:
            self._psycopg_pool.ConnectionPool.check_connection(connection)

    def _read(self, work: Callable[[Cursor], T]) -> T:
        try:
            with self._pool.connection() as connection:
                with self._cursor(connection) as cursor:
                    result = work(cursor)
                self._idle_since[connection] = time.monotonic()
                return result
        except self._psycopg.Error as error:
            raise self._unavailable(error) from None
        except self._pool_timeout() as error:
            raise self._unavailable(error) from None

    def _write(self, work: Callable[[Cursor], T]) -> T:
        return self._with_retries(lambda connection: self._in_transaction(connection, work))

    def _write_alone(self, statement: str, parameters: dict[str, Any]) -> None:
        """One statement in autocommit: PostgreSQL runs it as a transaction of its own, so
        the write is one round trip (`_write` takes three at least: BEGIN, the unit, COMMIT)."""

        def run(connection: Any) -> None:
            with self._cursor(connection) as cursor:
                cursor.execute(statement, parameters)

        self._with_retries(run)

    def _with_retries(self, run: Callable[[Any], T]) -> T:
        errors = self._psycopg.errors
        delays = CONFLICT_BACKOFF.delays()
        for attempt in range(1, self.write_retries + 1):
            try:
                with self._pool.connection() as connection:
                    result = run(connection)
                    self._idle_since[connection] = time.monotonic()
                    return result
            except errors.UniqueViolation as error:
                raise duplicate(error) from None
            except self._psycopg.Error as error:
                if attempt < self.write_retries and error.sqlstate in RETRYABLE_STATES:
                    time.sleep(next(delays))
                    continue
                raise self._unavailable(error) from None
            except self._pool_timeout() as error:
                raise self._unavailable(error) from None
        raise AssertionError("unreachable")

    def insert_jobs(
        self,
        jobs: Sequence[Job],
        idempotency: IdempotencyRecord | None = None,
        group: Group | None = None,
    ) -> None:
        """One job (a user's create, with or without its Idempotency-Key) is one statement:
        the key, the job and its count inserted together by data-modifying `WITH` clauses;
        anything more goes through the unit of every SQL store."""
        if len(jobs) != 1 or group is not None or jobs[0].waits_on:
            super().insert_jobs(jobs, idempotency, group)
            return
        parameters = codec.job_to_row(jobs[0])
        clauses = [f"inserted AS ({self._sql.insert_job})"]
        if idempotency is not None:
            parameters.update(
                {f"key_{name}": value for name, value in idempotency_row(idempotency).items()}
            )
            remembered = _renamed(self._sql.remember_idempotent, "key_{}".format)
            clauses.insert(0, f"remembered AS ({remembered})")
        parameters["count_shard"] = random.randrange(self.count_shards)
        self._write_alone(
            f"WITH {', '.join(clauses)} INSERT INTO job_counts (state, shard, n) "
            "VALUES (%(state)s, %(count_shard)s, 1) "
            "ON CONFLICT (state, shard) DO UPDATE SET n = job_counts.n + excluded.n",
            parameters,
        )

    def update_jobs(
        self, job_ids: Sequence[str], change: Callable[[Job], Job]
    ) -> dict[str, tuple[Job, Job]]:
        """One job (an ack, a result, a cancel: most writes) is written optimistically in
        autocommit: read, changed, then its compare-and-swap and its count change in one
        statement, two round trips where the locking transaction of every SQL store takes
        four (BEGIN, the locked read, the write, the counts with COMMIT). If another write
        came between, the job is read and `change` called again; after OPTIMISTIC_TRIES
        losses in a row, and for several jobs, the locking transaction does it."""
        ids = list(dict.fromkeys(job_ids))
        if len(ids) != 1:
            return super().update_jobs(ids, change)
        for _ in range(OPTIMISTIC_TRIES):
            found = self._rows(self._sql.get_jobs(1), {"id0": ids[0]})
            if not found:
                return {}
            stored, row = job_and_row(found[0])
            changed = change(stored)
            if changed is stored or self._swap_alone(changed, stored, row):
                return {stored.id: (stored, changed)}
        return super().update_jobs(ids, change)

    def claim_jobs(
        self,
        endpoint_id: str,
        now: Instant,
        limit: int,
        grant: Callable[[Job], Job],
        after_owner: str | None = None,
    ) -> list[Job]:
        """The candidates read outside any write, then each granted by its own swap (with
        its count change): a claim of one job is three round trips where the locking
        transaction takes five (BEGIN, the rank, the locked candidates, the write, the
        counts with COMMIT). A swap that lost (another platform granted the job first) leaves
        the rest of the claim to the locking transaction, which skips what others hold. A
        store error between two swaps leaves the first granted and unanswered, as a platform
        lost after its commit does: the grant's ack deadline passes and the job is retried."""
        candidates = self._read(
            lambda cursor: self._claim_candidates(
                cursor, endpoint_id, now, limit, after_owner, locked=False
            )
        )
        grants = [(grant(job), job, row) for job, row in candidates]  # raises before writing
        claimed: list[Job] = []
        for granted, job, row in grants:
            if not self._swap_alone(granted, job, row):
                turn = claimed[-1].owner_id if claimed else after_owner
                rest = super().claim_jobs(endpoint_id, now, limit - len(claimed), grant, turn)
                return claimed + rest
            claimed.append(granted)
        return claimed

    def _swap_alone(self, job: Job, expected: Job, old: dict[str, Any]) -> bool:
        """`_cas` as one statement in autocommit, the count change in a data-modifying `WITH`
        clause that writes only if the swap did. True if it did."""
        update, parameters = self._swap(job, expected, old)
        statement = f"WITH swapped AS ({update} RETURNING 1)"
        if job.state is not expected.state:
            parameters.update(
                count_from=expected.state.value,
                count_to=job.state.value,
                count_shard=random.randrange(self.count_shards),
            )
            statement += (
                ", counted AS (INSERT INTO job_counts (state, shard, n) "
                "SELECT change.state, %(count_shard)s, change.n FROM (VALUES "
                "(CAST(%(count_from)s AS TEXT), -1), (CAST(%(count_to)s AS TEXT), 1)) "
                "AS change(state, n) WHERE EXISTS (SELECT 1 FROM swapped) "
                "ON CONFLICT (state, shard) DO UPDATE SET n = job_counts.n + excluded.n)"
            )
        statement += " SELECT COUNT(*) FROM swapped"

        def run(connection: Any) -> bool:
            with self._cursor(connection) as cursor:
                cursor.execute(statement, parameters)
                (swapped,) = cursor.fetchall()
            return bool(swapped[0])

        return self._with_retries(run)

    def _cas_all(
        self,
        cursor: Cursor,
        swaps: list[tuple[Job, Job, dict[str, Any]]],
        deltas: Counter[str],
    ) -> bool:
        """Several jobs' compare-and-swaps as one statement (one round trip where one a job
        took N): each `UPDATE` a data-modifying `WITH` clause, the answer how many swapped."""
        if len(swaps) < 2:
            return super()._cas_all(cursor, swaps, deltas)
        if len(swaps) > SWAPS_PER_STATEMENT:  # a chunk of 500 jobs' every column: 35,000
            return all(  # parameters, near PostgreSQL's 65,535, and a long plan
                self._cas_all(cursor, swaps[start : start + SWAPS_PER_STATEMENT], deltas)
                for start in range(0, len(swaps), SWAPS_PER_STATEMENT)
            )
        clauses, parameters = [], {}
        for n, (job, expected, old) in enumerate(swaps):
            update, swap_parameters = self._swap(job, expected, old)
            ours = _renamed(update, f"{{}}_{n}".format)  # each parameter x as x_<n>
            clauses.append(f"s{n} AS ({ours} RETURNING 1)")
            parameters.update({f"{name}_{n}": value for name, value in swap_parameters.items()})
        swapped = " + ".join(f"(SELECT COUNT(*) FROM s{n})" for n in range(len(swaps)))
        cursor.execute(f"WITH {', '.join(clauses)} SELECT {swapped}", parameters)
        (count,) = cursor.fetchall()
        if count[0] != len(swaps):
            return False
        for job, expected, _ in swaps:
            count_move(deltas, job, expected)
        return True

    def _in_transaction(self, connection: Any, work: Callable[[Cursor], T]) -> T:
        """BEGIN, the unit, then its count changes and COMMIT in one round trip (as MySQL's
        `_commit` does): psycopg's `transaction()` and an `executemany` of the counts took
        two more round trips a write. Anything raised rolls the unit back."""
        self._unit.counts = []
        with self._cursor(connection) as cursor:
            cursor.execute("BEGIN")
            try:
                result = work(cursor)
                cursor.execute(_counts_and_commit(self._unit.counts))
            except BaseException:
                if connection.info.transaction_status != self._psycopg.pq.TransactionStatus.IDLE:
                    with contextlib.suppress(self._psycopg.Error):
                        cursor.execute("ROLLBACK")
                raise
        return result

    def _apply_counts(self, cursor: Cursor, changes: list[dict[str, Any]]) -> None:
        self._unit.counts.extend(changes)

    def _pool_timeout(self) -> type[Exception]:
        pool_timeout: type[Exception] = importlib.import_module("psycopg_pool").PoolTimeout
        return pool_timeout

    def _unavailable(self, error: BaseException) -> StoreUnavailable:
        where = f"{self.url.host or '127.0.0.1'}:{self.url.port or 5432}"
        state = getattr(error, "sqlstate", None)
        text_ = str(error).strip()
        detail = text_.splitlines()[0] if text_ else type(error).__name__
        # Errors while connecting carry no SQLSTATE: they are told apart by the server's text.
        if (
            state in ("28P01", "28000")
            or "password authentication failed" in text_
            or ("role" in text_ and "does not exist" in text_)
        ):
            return StoreUnavailable(
                f"PostgreSQL at {where} refused user {self.url.username!r}: wrong user or password"
            )
        if state == "3D000" or ("database" in text_ and "does not exist" in text_):
            return StoreUnavailable(
                f"PostgreSQL at {where} has no database {self.url.database!r}; create it first"
            )
        if (ssl := self._ssl_advice(where, text_)) is not None:
            return StoreUnavailable(ssl)
        if 'invalid connection option "' in text_:
            return StoreUnavailable(
                f"the store URL's query has an option PostgreSQL does not know ({detail}): its "
                "options are libpq's (sslmode, sslrootcert, connect_timeout, ...)"
            )
        if state is None and "connect" in detail.lower():
            return StoreUnavailable(
                f"cannot reach PostgreSQL at {where}: is the server running? ({detail})"
            )
        return StoreUnavailable(f"store {self.description} failed: {detail}")

    def _ssl_advice(self, where: str, said: str) -> str | None:
        """What to do about an SSL problem libpq met connecting, or None when it is another."""
        mode = self.url.query.get("sslmode")
        if "invalid sslmode value" in said:
            return (
                f"sslmode must be one of {', '.join(SSL_MODES)}, not {mode!r}: e.g. "
                "postgresql://USER:PASS@HOST:PORT/DB?sslmode=verify-full"
            )
        if "server does not support SSL" in said:
            return (
                f"PostgreSQL at {where} does not accept SSL, but the store URL asks for it "
                f"(sslmode={mode}): turn SSL on at the server (`ssl = on` in postgresql.conf, "
                "with its certificate and key), or, only on a network you trust, connect "
                "without it (?sslmode=disable)"
            )
        if "no pg_hba.conf entry" in said and "no encryption" in said:
            return (
                f"PostgreSQL at {where} accepts this host only over SSL (its pg_hba.conf): add "
                "?sslmode=verify-full&sslrootcert=PATH to the store URL (the server's CA "
                "certificate; ?sslmode=require encrypts without checking who answers)"
            )
        if "root certificate file" in said:
            return (
                f"sslmode={mode} checks PostgreSQL's certificate at {where} against a CA "
                "certificate, and there is none: give its file with ?sslrootcert=PATH (libpq "
                "looks in ~/.postgresql/root.crt otherwise)"
            )
        if "certificate verify failed" in said or "server certificate for" in said:
            return (
                f"PostgreSQL at {where} presented a certificate that sslmode={mode} does not "
                "accept (not signed by ?sslrootcert's CA, or not for this host name): connect by "
                "the name in its certificate, or give the CA that signed it"
            )
        return None

    def _lock_schema(self, connection: Connection) -> None:
        # Two platforms starting together must not both create the tables.
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": SCHEMA_LOCK})
        connection.commit()

    def _unlock_schema(self, connection: Connection) -> None:
        connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": SCHEMA_LOCK})
        connection.commit()

    def wakeups(
        self,
        heard: Callable[[str, str | None], None],
        missed: Callable[[], None],
        *,
        reconnect: Backoff = RECONNECT,
    ) -> PostgresWakeups:
        """Wake-ups across the platform processes on this database (`store/pg_wakeups.py`):
        announcements go out on this store's pool, and one connection of their own listens
        (started by `start()`)."""
        return PostgresWakeups(self._conninfo, self._notify, heard, missed, reconnect=reconnect)

    def _notify(self, statement: str, params: tuple[Any, ...]) -> None:
        self._read(lambda cursor: cursor.execute(statement, params))

    def close(self) -> None:
        self._pool.close()


def _renamed(statement: str, name: Callable[[str], str]) -> str:
    """`statement` with each parameter `%(x)s` named `name(x)`, to sit beside another's in
    one statement (a job and its Idempotency-Key both have a `created_at`; several swaps
    each an `id`)."""
    return re.sub(r"%\((\w+)\)s", lambda found: f"%({name(found[1])})s", statement)


def _counts_and_commit(counts: list[dict[str, Any]]) -> str:
    """The unit's count changes and its COMMIT, as one statement string without
    parameters, so that psycopg sends it in one simple query. The values are inlined:
    a state's name is checked against `_STATE_NAME`, shards and deltas are ints."""
    if not counts:
        return "COMMIT"
    rows = []
    for change in counts:
        state, shard, delta = change["state"], int(change["shard"]), int(change["delta"])
        if not _STATE_NAME.fullmatch(state):
            raise ValueError(f"not a job state's name: {state!r}")
        rows.append(f"('{state}', {shard}, {delta})")
    return (
        f"INSERT INTO job_counts (state, shard, n) VALUES {', '.join(rows)} "
        "ON CONFLICT (state, shard) DO UPDATE SET n = job_counts.n + excluded.n; COMMIT"
    )


def _parse(url: str) -> URL:
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise StoreUnavailable(f"not a PostgreSQL URL: {redact(url)}") from None
    if parsed.drivername not in ("postgresql", "postgres", "postgresql+psycopg"):
        raise StoreUnavailable(f"not a PostgreSQL URL: {redact(url)}")
    if not parsed.database:
        raise StoreUnavailable(
            f"not a PostgreSQL URL: {redact(url)}; use postgresql://USER:PASS@HOST:PORT/DATABASE"
        )
    return parsed


def _driver() -> tuple[Any, Any]:
    if (
        importlib.util.find_spec("psycopg") is None
        or importlib.util.find_spec("psycopg_pool") is None
    ):
        raise StoreUnavailable(
            "PostgreSQL stores need psycopg 3 and its pool: pip install 'moonrun[postgres]'"
        )
    psycopg = importlib.import_module("psycopg")
    importlib.import_module("psycopg.conninfo")
    return psycopg, importlib.import_module("psycopg_pool")


def redact(url: str) -> str:
    """The URL with any password replaced by `***`."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        return "postgresql://<unparseable URL>"
