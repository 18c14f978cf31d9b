"""SqlStore: the Store seam over plain DB-API cursors, shared by FileStore and MySQLStore.

Every statement is text rendered once per dialect (`store/queries.py`) and run on a DB-API
cursor the subclass lends: `_read` for queries, `_write` for one atomic unit of writes.
Subclasses own their connections and say how writes are committed (SQLite: group commit on
one writer connection; MySQL: a transaction per unit on pooled connections). The schema and
its migrations stay SQLAlchemy Core (`store/schema.py`), run once at open.
"""

from __future__ import annotations

import heapq
import json
import random
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine, insert, select, update
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from moonrun.errors import AlreadyExists, SchemaTooNew, StoreUnavailable
from moonrun.scheduling.fairness import NextOwner, Oldest, take_by_priority
from moonrun.scheduling.groups import Group
from moonrun.scheduling.jobs import Job, JobState
from moonrun.scheduling.records import Advertisement, Endpoint, Server, Session, User
from moonrun.scheduling.schedules import Schedule
from moonrun.scheduling.time import Instant
from moonrun.store import codec
from moonrun.store.protocol import IdempotencyRecord, JobCursor, ScheduleWrite
from moonrun.store.queries import (
    ENDPOINT_COLUMNS,
    GROUP_COLUMNS,
    JOB_COLUMNS,
    SCHEDULE_COLUMNS,
    SERVER_COLUMNS,
    SESSION_COLUMNS,
    USER_COLUMNS,
    Queries,
)
from moonrun.store.schema import MIGRATIONS, SCHEMA_VERSION, schema_version

T = TypeVar("T")

Row = Sequence[Any]


class Cursor(Protocol):
    """The part of a DB-API cursor the stores use (sqlite3 and PyMySQL both fit)."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Any: ...

    def fetchall(self) -> Sequence[Row]: ...

    def fetchone(self) -> Row | None: ...


def _job(row: Row) -> Job:
    return codec.row_to_job(dict(zip(JOB_COLUMNS, row, strict=True)))


def job_and_row(row: Row) -> tuple[Job, dict[str, Any]]:
    mapping = dict(zip(JOB_COLUMNS, row, strict=True))
    return codec.row_to_job(mapping), mapping


def _claim_order(candidate: tuple[Job, dict[str, Any]]) -> tuple[int, int, str]:
    job = candidate[0]
    return job.eligible_at, job.created_at, job.id


def _server_of(rows: Sequence[Row], start: int) -> Server | None:
    """The server in `rows[0]` from column `start` on, its admins in each row's last column
    (a LEFT JOIN: one row per admin, in order; None when the server itself is missing)."""
    if not rows or rows[0][start] is None:
        return None
    values = rows[0][start : start + len(SERVER_COLUMNS)]
    admins = tuple(row[-1] for row in rows if row[-1] is not None)
    return codec.row_to_server(dict(zip(SERVER_COLUMNS, values, strict=True)), admins)


def _endpoint(row: Row) -> Endpoint:
    return codec.row_to_endpoint(dict(zip(ENDPOINT_COLUMNS, row, strict=True)))


def _session(row: Row) -> Session:
    return codec.row_to_session(dict(zip(SESSION_COLUMNS, row, strict=True)))


def _user(row: Row) -> User:
    return codec.row_to_user(dict(zip(USER_COLUMNS, row, strict=True)))


class SqlStore:
    """A Store over one SQL database; see FileStore and MySQLStore for the two dialects."""

    count_shards = 1
    """How many rows each state's job count is spread over (see `queries.COUNT_SHARDS`)."""
    counted_by_triggers = False
    """The database keeps `job_counts` itself (SQLite's triggers), so writes need not."""

    def __init__(self, queries: Queries, description: str) -> None:
        self._sql = queries
        self._description = description

    @property
    def description(self) -> str:
        """Where the store is, without credentials."""
        return self._description

    # -- what a dialect supplies -------------------------------------------------------------

    def _read(self, work: Callable[[Cursor], T]) -> T:
        """Run read-only `work` on a cursor of a read connection."""
        raise NotImplementedError

    def _write(self, work: Callable[[Cursor], T]) -> T:
        """Run `work` as one atomic unit and return its result once it is committed."""
        raise NotImplementedError

    def after_commit(self, action: Callable[[], None]) -> None:
        """Every write is committed when its method returns (FileStore's flusher aside)."""
        action()

    def _unavailable(self, error: BaseException) -> StoreUnavailable:
        """A one-line, credential-free explanation of a database failure."""
        return StoreUnavailable(f"store {self._description} failed: {error}")

    def _lock_schema(self, connection: Connection) -> None:
        """Serialise migrations between processes (the write transaction does it for SQLite)."""

    def _unlock_schema(self, connection: Connection) -> None:
        """Undo `_lock_schema`."""

    # -- schema ------------------------------------------------------------------------------

    def _migrate(self, engine: Engine) -> None:
        """Bring the schema up to SCHEMA_VERSION through `engine`; refuse a newer one."""
        try:
            with engine.connect().execution_options(moonrun_write=True) as connection:
                self._lock_schema(connection)
                try:
                    with connection.begin():
                        self._apply_migrations(connection)
                finally:
                    self._unlock_schema(connection)
        except SQLAlchemyError as error:
            raise self._unavailable(
                error.orig if isinstance(error, DBAPIError) and error.orig else error
            ) from None
        finally:
            engine.dispose()

    def _apply_migrations(self, connection: Connection) -> None:
        schema_version.create(connection, checkfirst=True)
        current = connection.execute(select(schema_version.c.version)).scalar()
        if current is None:
            connection.execute(insert(schema_version).values(version=0))
            current = 0
        if current > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"store {self._description} has schema version {current}, but this moonrun "
                f"knows only up to {SCHEMA_VERSION}; upgrade moonrun"
            )
        for number in range(current + 1, SCHEMA_VERSION + 1):
            MIGRATIONS[number - 1](connection)
            connection.execute(update(schema_version).values(version=number))

    def schema_version(self) -> int:
        def work(cursor: Cursor) -> int:
            cursor.execute(self._sql.schema_version)
            row = cursor.fetchone()
            assert row is not None
            return int(row[0])

        return self._read(work)

    # -- reading helpers ---------------------------------------------------------------------

    def _rows(self, sql: str, parameters: dict[str, Any]) -> Sequence[Row]:
        def work(cursor: Cursor) -> Sequence[Row]:
            cursor.execute(sql, parameters)
            return cursor.fetchall()

        return self._read(work)

    def _jobs(self, sql: str, parameters: dict[str, Any]) -> list[Job]:
        return [_job(row) for row in self._rows(sql, parameters)]

    def _one(self, sql: str, parameters: dict[str, Any], make: Callable[[Row], T]) -> T | None:
        rows = self._rows(sql, parameters)
        return make(rows[0]) if rows else None

    # -- jobs: writing -----------------------------------------------------------------------

    def _count(self, cursor: Cursor, deltas: Counter[str]) -> None:
        """Apply per-state count changes in the current unit, on one of the count shards."""
        if self.counted_by_triggers:
            return
        shard = random.randrange(self.count_shards) if self.count_shards > 1 else 0
        changes = [
            {"state": state, "shard": shard, "delta": delta}
            for state, delta in sorted(deltas.items())
            if delta
        ]
        if changes:
            self._apply_counts(cursor, changes)

    def _apply_counts(self, cursor: Cursor, changes: list[dict[str, Any]]) -> None:
        """Write count changes now, in the unit's transaction (MySQL defers them to its
        commit, see MySQLStore)."""
        cursor.executemany(self._sql.count_delta, changes)

    def _cas(
        self,
        cursor: Cursor,
        job: Job,
        expected: Job,
        deltas: Counter[str],
        old: dict[str, Any] | None = None,
    ) -> bool:
        """One compare-and-swap on version, writing only the columns that changed (`old` is
        `expected` as a row, when it was just read)."""
        cursor.execute(*self._swap(job, expected, old))
        if cursor.rowcount != 1:
            return False
        count_move(deltas, job, expected)
        return True

    def _cas_all(
        self,
        cursor: Cursor,
        swaps: list[tuple[Job, Job, dict[str, Any]]],
        deltas: Counter[str],
    ) -> bool:
        """`_cas` of each (job, expected, expected's row); True if every one swapped."""
        return all(self._cas(cursor, job, expected, deltas, old) for job, expected, old in swaps)

    def _swap(
        self, job: Job, expected: Job, old: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The statement and parameters of `job`'s compare-and-swap over `expected`."""
        new = codec.job_to_row(job)
        if old is None:
            old = codec.job_to_row(expected)
        changed = tuple(name for name in JOB_COLUMNS if name == "version" or new[name] != old[name])
        parameters = {name: new[name] for name in changed}
        parameters["id"] = job.id
        parameters["expected_version"] = expected.version
        return self._sql.update_job(changed), parameters

    def insert_job(self, job: Job) -> None:
        self.insert_jobs([job])

    def insert_jobs(
        self,
        jobs: Sequence[Job],
        idempotency: IdempotencyRecord | None = None,
        group: Group | None = None,
    ) -> None:
        rows = [codec.job_to_row(job) for job in jobs]
        deltas = Counter(job.state.value for job in jobs)
        dependencies = [
            {"on_id": on_id, "job_id": job.id} for job in jobs for on_id in job.waits_on
        ]

        def work(cursor: Cursor) -> None:
            if idempotency is not None:
                cursor.execute(self._sql.remember_idempotent, idempotency_row(idempotency))
            if group is not None:
                cursor.execute(self._sql.insert_group, codec.group_to_row(group))
            if len(rows) == 1:
                cursor.execute(self._sql.insert_job, rows[0])
            elif rows:
                cursor.executemany(self._sql.insert_job, rows)
            if dependencies:
                cursor.executemany(self._sql.insert_dependency, dependencies)
            self._count(cursor, deltas)

        self._write(work)

    def replace_job(self, job: Job, expected: Job) -> bool:
        def work(cursor: Cursor) -> bool:
            deltas: Counter[str] = Counter()
            won = self._cas(cursor, job, expected, deltas)
            self._count(cursor, deltas)
            return won

        return self._write(work)

    def update_jobs(
        self, job_ids: Sequence[str], change: Callable[[Job], Job]
    ) -> dict[str, tuple[Job, Job]]:
        ids = list(dict.fromkeys(job_ids))

        def work(cursor: Cursor) -> dict[str, tuple[Job, Job]]:
            done: dict[str, tuple[Job, Job]] = {}
            deltas: Counter[str] = Counter()
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                parameters = {f"id{n}": job_id for n, job_id in enumerate(chunk)}
                cursor.execute(self._sql.get_jobs_locked(len(chunk)), parameters)
                swaps = []
                for stored, row in [job_and_row(row) for row in cursor.fetchall()]:
                    changed = change(stored)
                    if changed is not stored:
                        swaps.append((changed, stored, row))
                    done[stored.id] = (stored, changed)
                if not self._cas_all(cursor, swaps, deltas):
                    raise AssertionError("a job changed under its row lock")
            self._count(cursor, deltas)
            return done

        return self._write(work) if ids else {}

    def claim_jobs(
        self,
        endpoint_id: str,
        now: Instant,
        limit: int,
        grant: Callable[[Job], Job],
        after_owner: str | None = None,
    ) -> list[Job]:
        def work(cursor: Cursor) -> list[Job]:
            # Inside the write transaction: SQLite holds the one write lock, MySQL locks the
            # candidates (skipping rows another platform is claiming right now).
            candidates = self._claim_candidates(cursor, endpoint_id, now, limit, after_owner)
            deltas: Counter[str] = Counter()
            claimed = []
            for job, row in candidates:
                granted = grant(job)
                if self._cas(cursor, granted, job, deltas, row):
                    claimed.append(granted)
            self._count(cursor, deltas)
            return claimed

        return self._write(work)

    def _claim_candidates(
        self,
        cursor: Cursor,
        endpoint_id: str,
        now: Instant,
        limit: int,
        after_owner: str | None,
        *,
        locked: bool = True,
    ) -> list[tuple[Job, dict[str, Any]]]:
        """The jobs (with their rows) a claim of `limit` takes, in claim order: by priority,
        the owners taking turns after `after_owner` (`take_by_priority`)."""
        sql = self._sql
        Candidate = tuple[Job, dict[str, Any]]

        def next_rank(after: int | None) -> tuple[int, str] | None:
            parameters = {"endpoint_id": endpoint_id, "rank": -1 if after is None else after}
            cursor.execute(sql.next_claim_rank, parameters)
            found = cursor.fetchall()
            return (int(found[0][0]), str(found[0][1])) if found else None

        def turns(rank: int, first: str) -> tuple[NextOwner, Oldest[Candidate]]:
            def next_owner(after: str | None) -> str | None:
                if after is None:  # the first owner came with the rank
                    return first
                parameters = {"endpoint_id": endpoint_id, "rank": rank, "after": after}
                cursor.execute(sql.next_claim_owner, parameters)
                found = cursor.fetchall()
                return str(found[0][0]) if found else None

            def oldest(wants: Mapping[str, int]) -> dict[str, list[Candidate]]:
                owners = list(wants)
                parameters: dict[str, Any] = {"endpoint_id": endpoint_id, "rank": rank, "now": now}
                for n, owner in enumerate(owners):
                    parameters[f"owner{n}"], parameters[f"limit{n}"] = owner, wants[owner]
                cursor.execute(sql.claimable_of_owners(len(owners), locked), parameters)
                found: dict[str, list[Candidate]] = {owner: [] for owner in owners}
                # In claim order whatever order the parts of a UNION come back in.
                candidates = sorted(map(job_and_row, cursor.fetchall()), key=_claim_order)
                for job, row in candidates:
                    found[job.owner_id].append((job, row))
                return found

            return next_owner, oldest

        return take_by_priority(limit, after_owner, next_rank, turns)

    def delete_jobs(self, job_ids: Sequence[str], deletable: Callable[[Job], bool]) -> list[Job]:
        ids = list(dict.fromkeys(job_ids))

        def work(cursor: Cursor) -> list[Job]:
            deleted: list[Job] = []
            deltas: Counter[str] = Counter()
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                parameters = {f"id{n}": job_id for n, job_id in enumerate(chunk)}
                # Read under the write lock (MySQL: the rows locked), so that what `deletable`
                # judged is what is deleted.
                cursor.execute(self._sql.get_jobs_locked(len(chunk)), parameters)
                gone = [job for job in map(_job, cursor.fetchall()) if deletable(job)]
                if not gone:
                    continue
                marks = {f"id{n}": job.id for n, job in enumerate(gone)}
                cursor.execute(self._sql.delete_idempotency_of(len(gone)), marks)
                cursor.execute(self._sql.delete_jobs(len(gone)), marks)
                # What waited on them was settled before they could go (retention keeps a
                # job a held job waits on): their waiters' rows go with them.
                waited = {f"on{n}": job.id for n, job in enumerate(gone)}
                cursor.execute(self._sql.delete_waiters_of(len(gone)), waited)
                for job in gone:
                    deltas[job.state.value] -= 1
                deleted.extend(gone)
            self._count(cursor, deltas)
            return deleted

        return self._write(work) if ids else []

    def release_space(self, pages: int) -> int:
        """The database reuses the space of deleted rows itself (MySQL: InnoDB's pages)."""
        return 0

    # -- jobs: reading -----------------------------------------------------------------------

    def finished_jobs(self, ended_by: Instant, limit: int) -> list[Job]:
        return self._jobs(self._sql.finished, {"ended_by": ended_by, "limit": limit})

    def get_job(self, job_id: str) -> Job | None:
        return self._one(self._sql.get_job, {"id": job_id}, _job)

    def job_and_server(self, job_id: str) -> tuple[Job, Server | None] | None:
        """One statement: the job's row, its server's and an admin's, once per admin."""

        def work(cursor: Cursor) -> tuple[Job, Server | None] | None:
            cursor.execute(self._sql.job_and_server, {"id": job_id})
            rows = cursor.fetchall()
            if not rows:
                return None
            job = _job(rows[0][: len(JOB_COLUMNS)])
            return job, _server_of(rows, len(JOB_COLUMNS))

        return self._read(work)

    def get_jobs(self, job_ids: Collection[str]) -> dict[str, Job]:
        found: dict[str, Job] = {}
        ids = list(dict.fromkeys(job_ids))
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            parameters = {f"id{n}": job_id for n, job_id in enumerate(chunk)}
            for job in self._jobs(self._sql.get_jobs(len(chunk)), parameters):
                found[job.id] = job
        return found

    def claimable_jobs(self, endpoint_id: str, now: Instant, limit: int) -> list[Job]:
        parameters = {"endpoint_id": endpoint_id, "now": now, "limit": limit}
        return self._jobs(self._sql.claimable, parameters)

    def next_claimable_at(self, endpoint_id: str) -> Instant | None:
        rows = self._rows(self._sql.next_claimable, {"endpoint_id": endpoint_id})
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def due_jobs(self, now: Instant, limit: int) -> list[Job]:
        return self._jobs(self._sql.due, {"now": now, "limit": limit})

    def active_jobs(self, endpoint_id: str) -> list[Job]:
        return self._jobs(self._sql.active, {"endpoint_id": endpoint_id})

    def active_deadlines(self, endpoint_id: str) -> list[tuple[str, Instant | None]]:
        rows = self._rows(self._sql.active_deadlines, {"endpoint_id": endpoint_id})
        return [(job_id, deadline) for job_id, deadline in rows]

    def job_counts(self) -> dict[JobState, int]:
        rows = self._rows(self._sql.counts, {})
        return {JobState(state): int(n) for state, n in rows if n}

    def list_jobs(
        self,
        *,
        server_ids: Collection[str] | None,
        state: JobState | None,
        limit: int,
        after: JobCursor | None = None,
        kind: str | None = None,
        id_prefix: str | None = None,
        group_id: str | None = None,
    ) -> list[Job]:
        parameters: dict[str, Any] = {"limit": limit}
        if state is not None:
            parameters["state"] = state.value
        if after is not None:
            parameters["after_created"], parameters["after_id"] = after
        if kind is not None:
            parameters["kind"] = kind
        if id_prefix is not None:
            # Ids are ASCII letters, digits, "_" and "-", all below "~" (and compared byte by
            # byte in every store), so [prefix, prefix + "~") holds exactly the ids with it.
            parameters["id_low"], parameters["id_high"] = id_prefix, id_prefix + "~"
        shape = (state is not None, after is not None, kind is not None, id_prefix is not None)
        by_state, by_after, by_kind, by_prefix = shape
        if group_id is not None:
            parameters["group_id"] = group_id
            sql = self._sql.list_jobs(False, by_state, by_after, by_kind, by_prefix, True)
            return self._jobs(sql, parameters)
        if server_ids is None:
            sql = self._sql.list_jobs(False, by_state, by_after, by_kind, by_prefix)
            return self._jobs(sql, parameters)
        # One index walk per server, merged: each stops after `limit` rows, so a page costs
        # the same however many jobs the servers hold.
        sql = self._sql.list_jobs(True, by_state, by_after, by_kind, by_prefix)
        pages = [
            self._jobs(sql, {**parameters, "server_id": server_id})
            for server_id in dict.fromkeys(server_ids)
        ]
        merged = heapq.merge(*pages, key=lambda job: (job.created_at, job.id), reverse=True)
        return [job for _, job in zip(range(limit), merged, strict=False)]

    def idempotency_record(self, user_id: str, key: str) -> IdempotencyRecord | None:
        rows = self._rows(self._sql.idempotent, {"user_id": user_id, "idempotency_key": key})
        if not rows:
            return None
        fingerprint, job_id, job_ids_json, created_at = rows[0]
        job_ids = tuple(json.loads(job_ids_json)) if job_ids_json else (job_id,)
        return IdempotencyRecord(user_id, key, fingerprint, job_ids, int(created_at))

    # -- groups ----------------------------------------------------------------------------

    def get_group(self, group_id: str) -> Group | None:
        def make(row: Row) -> Group:
            return codec.row_to_group(dict(zip(GROUP_COLUMNS, row, strict=True)))

        return self._one(self._sql.get_group, {"id": group_id}, make)

    def groups_of(self, creator_id: str, limit: int) -> list[Group]:
        rows = self._rows(self._sql.groups_of, {"creator_id": creator_id, "limit": limit})
        return [codec.row_to_group(dict(zip(GROUP_COLUMNS, row, strict=True))) for row in rows]

    def _group_counts(self, cursor: Cursor, group_id: str) -> dict[JobState, int]:
        cursor.execute(self._sql.group_counts, {"group_id": group_id})
        return {JobState(state): int(n) for state, n in cursor.fetchall() if n}

    def group_counts(self, group_id: str) -> dict[JobState, int]:
        return self._read(lambda cursor: self._group_counts(cursor, group_id))

    def release_held(
        self,
        group_id: str,
        how_many: Callable[[int, int], int],
        release: Callable[[Job], Job],
    ) -> dict[str, tuple[Job, Job]]:
        sql = self._sql
        key = {"group_id": group_id}

        def work(cursor: Cursor) -> dict[str, tuple[Job, Job]]:
            cursor.execute(sql.lock_group, {"id": group_id})
            cursor.fetchall()
            counts = self._group_counts(cursor, group_id)
            cursor.execute(sql.group_held_count, key)
            held = int(cursor.fetchall()[0][0])
            live = sum(n for state, n in counts.items() if not state.is_terminal) - held
            wanted = how_many(live, held)
            done: dict[str, tuple[Job, Job]] = {}
            if wanted <= 0:
                return done
            cursor.execute(sql.group_held_locked, {**key, "limit": wanted})
            deltas: Counter[str] = Counter()
            for stored, row in [job_and_row(row) for row in cursor.fetchall()]:
                changed = release(stored)
                # A job another write changed meanwhile stays held: a later release (or the
                # sweeper's) takes it, and under-releasing never breaks max_parallel.
                if changed is stored or self._cas(cursor, changed, stored, deltas, row):
                    done[stored.id] = (stored, changed)
            self._count(cursor, deltas)
            return done

        return self._write(work)

    def held_groups(self, after: str | None, limit: int) -> list[str]:
        def work(cursor: Cursor) -> list[str]:
            found: list[str] = []
            last = after
            while len(found) < limit:
                if last is None:
                    cursor.execute(self._sql.first_held_group, {})
                else:
                    cursor.execute(self._sql.next_held_group, {"after": last})
                row = cursor.fetchone()
                if row is None:
                    break
                last = str(row[0])
                found.append(last)
            return found

        return self._read(work)

    # -- concurrency keys ------------------------------------------------------------------

    def release_key(
        self,
        owner_id: str,
        key: str,
        limit: int,
        declare: bool,
        how_many: Callable[[int, int, int], int],
        release: Callable[[Job], Job],
    ) -> dict[str, tuple[Job, Job]]:
        sql = self._sql
        scope = {"owner_id": owner_id, "key": key}

        def work(cursor: Cursor) -> dict[str, tuple[Job, Job]]:
            cursor.execute(sql.declare_key, {**scope, "limit": limit, "declare": declare})
            cursor.execute(sql.lock_key, scope)
            key_limit = int(cursor.fetchall()[0][0])
            cursor.execute(sql.key_live_count, scope)
            live = int(cursor.fetchall()[0][0])
            cursor.execute(sql.key_held_count, scope)
            held = int(cursor.fetchall()[0][0])
            wanted = how_many(key_limit, live, held)
            done: dict[str, tuple[Job, Job]] = {}
            if wanted <= 0:
                return done
            cursor.execute(sql.key_held_locked, {**scope, "limit": wanted})
            deltas: Counter[str] = Counter()
            for stored, row in [job_and_row(row) for row in cursor.fetchall()]:
                changed = release(stored)
                # As a group's release: a job another write changed meanwhile stays held.
                if changed is stored or self._cas(cursor, changed, stored, deltas, row):
                    done[stored.id] = (stored, changed)
            self._count(cursor, deltas)
            return done

        return self._write(work)

    def held_keys(self, after: tuple[str, str] | None, limit: int) -> list[tuple[str, str]]:
        def work(cursor: Cursor) -> list[tuple[str, str]]:
            found: list[tuple[str, str]] = []
            last = after
            while len(found) < limit:
                if last is None:
                    cursor.execute(self._sql.first_held_key, {})
                else:
                    cursor.execute(self._sql.next_held_key, {"owner_id": last[0], "key": last[1]})
                row = cursor.fetchone()
                if row is None:
                    break
                last = (str(row[1]), str(row[0]))
                found.append(last)
            return found

        return self._read(work)

    # -- dependencies ----------------------------------------------------------------------

    def waiters(self, on_ids: Collection[str]) -> list[str]:
        found: dict[str, None] = {}
        ids = list(dict.fromkeys(on_ids))
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            parameters = {f"on{n}": on_id for n, on_id in enumerate(chunk)}
            for row in self._rows(self._sql.waiters(len(chunk)), parameters):
                found[str(row[0])] = None
        return list(found)

    def dependency_held_jobs(self, after: str | None, limit: int) -> list[Job]:
        return self._jobs(self._sql.dependency_held, {"after": after or "", "limit": limit})

    # -- endpoints and sessions ------------------------------------------------------------

    def insert_endpoint(self, endpoint: Endpoint) -> None:
        row = codec.endpoint_to_row(endpoint)
        self._write(lambda cursor: cursor.execute(self._sql.insert_endpoint, row))

    def get_endpoint(self, endpoint_id: str) -> Endpoint | None:
        return self._one(self._sql.get_endpoint, {"id": endpoint_id}, _endpoint)

    def endpoint_by_join_token(self, token_hash: str) -> Endpoint | None:
        return self._one(self._sql.endpoint_by_join_token, {"token_hash": token_hash}, _endpoint)

    def replace_endpoint(self, endpoint: Endpoint, expected_version: int) -> bool:
        parameters = {**codec.endpoint_to_row(endpoint), "expected_version": expected_version}
        return self._write_counted(self._sql.replace_endpoint, parameters)

    def list_endpoints(self) -> list[Endpoint]:
        return [_endpoint(row) for row in self._rows(self._sql.list_endpoints, {})]

    def delete_endpoint(self, endpoint_id: str) -> int:
        parameters = {"endpoint_id": endpoint_id}

        def work(cursor: Cursor) -> int:
            cursor.execute(self._sql.servers_on_endpoint, parameters)
            using = int(cursor.fetchall()[0][0])
            if using == 0:
                cursor.execute(self._sql.delete_sessions, parameters)
                cursor.execute(self._sql.delete_advertisement, parameters)
                cursor.execute(self._sql.delete_endpoint, parameters)
            return using

        return self._write(work)

    def set_advertisement(self, endpoint_id: str, advertisement: Advertisement | None) -> None:
        key = {"endpoint_id": endpoint_id}

        if advertisement is None:
            self._write(lambda cursor: cursor.execute(self._sql.delete_advertisement, key))
            return
        row = {
            **key,
            "kinds_json": advertisement.kinds_json,
            "advertised_at": advertisement.advertised_at,
        }
        self._write(lambda cursor: cursor.execute(self._sql.upsert_advertisement, row))

    def get_advertisement(self, endpoint_id: str) -> Advertisement | None:
        def make(row: Row) -> Advertisement:
            endpoint, kinds_json, advertised_at = row
            return Advertisement(endpoint, kinds_json, int(advertised_at))

        return self._one(self._sql.get_advertisement, {"endpoint_id": endpoint_id}, make)

    def insert_session(self, session: Session) -> None:
        row = codec.session_to_row(session)
        self._write(lambda cursor: cursor.execute(self._sql.insert_session, row))

    def get_session(self, session_id: str) -> Session | None:
        return self._one(self._sql.get_session, {"id": session_id}, _session)

    def session_with_endpoint(self, session_id: str) -> tuple[Session, Endpoint] | None:
        split = len(SESSION_COLUMNS)

        def make(row: Row) -> tuple[Session, Endpoint]:
            return _session(row[:split]), _endpoint(row[split:])

        return self._one(self._sql.session_with_endpoint, {"id": session_id}, make)

    def extend_session(self, session_id: str, seen_at: Instant, expires_at: Instant) -> None:
        parameters = {"id": session_id, "seen_at": seen_at, "expires_at": expires_at}
        self._write(lambda cursor: cursor.execute(self._sql.extend_session, parameters))

    def extend_sessions(self, extensions: Sequence[tuple[str, Instant, Instant]]) -> None:
        rows = [
            {"id": session_id, "seen_at": seen_at, "expires_at": expires_at}
            for session_id, seen_at, expires_at in sorted(extensions)
        ]
        if rows:
            self._write(lambda cursor: cursor.executemany(self._sql.extend_session, rows))

    def record_beats(self, beats: Mapping[str, Instant]) -> None:
        # In id order: two processes' passes over the same sessions lock their rows in one order.
        rows = [{"id": sid, "seen_at": seen_at} for sid, seen_at in sorted(beats.items())]
        if rows:
            self._write(lambda cursor: cursor.executemany(self._sql.record_beat, rows))

    def latest_session(self, endpoint_id: str) -> Session | None:
        return self._one(self._sql.latest_session, {"endpoint_id": endpoint_id}, _session)

    def mark_session_reconciled(self, session_id: str, at: Instant) -> None:
        parameters = {"id": session_id, "at": at}
        self._write(lambda cursor: cursor.execute(self._sql.mark_session_reconciled, parameters))

    def _write_counted(self, sql: str, parameters: dict[str, Any]) -> bool:
        def work(cursor: Cursor) -> bool:
            cursor.execute(sql, parameters)
            return cursor.rowcount == 1

        return self._write(work)

    # -- users, tokens and servers ---------------------------------------------------------

    def insert_user(self, user: User) -> None:
        row = codec.user_to_row(user)
        self._write(lambda cursor: cursor.execute(self._sql.insert_user, row))

    def get_user(self, user_id: str) -> User | None:
        return self._one(self._sql.get_user, {"id": user_id}, _user)

    def user_by_name(self, name: str) -> User | None:
        return self._one(self._sql.user_by_name, {"name": name}, _user)

    def list_users(self) -> list[User]:
        return [_user(row) for row in self._rows(self._sql.list_users, {})]

    def insert_api_token(self, token_hash: str, user_id: str, created_at: Instant) -> None:
        row = {"token_hash": token_hash, "user_id": user_id, "created_at": created_at}
        self._write(lambda cursor: cursor.execute(self._sql.insert_api_token, row))

    def user_by_api_token(self, token_hash: str) -> User | None:
        return self._one(self._sql.user_by_api_token, {"token_hash": token_hash}, _user)

    def replace_api_tokens(self, user_id: str, token_hash: str, created_at: Instant) -> None:
        row = {"token_hash": token_hash, "user_id": user_id, "created_at": created_at}

        def work(cursor: Cursor) -> None:
            cursor.execute(self._sql.delete_api_tokens, {"user_id": user_id})
            cursor.execute(self._sql.insert_api_token, row)

        self._write(work)

    def set_password_hash(self, user_id: str, password_hash: str | None) -> None:
        parameters = {"id": user_id, "password_hash": password_hash}
        self._write(lambda cursor: cursor.execute(self._sql.set_password_hash, parameters))

    def set_user_disabled(self, user_id: str, disabled: bool) -> None:
        parameters = {"id": user_id, "disabled": disabled}
        self._write(lambda cursor: cursor.execute(self._sql.set_user_disabled, parameters))

    def insert_web_session(
        self, token_hash: str, user_id: str, created_at: Instant, expires_at: Instant
    ) -> None:
        row = {
            "token_hash": token_hash,
            "user_id": user_id,
            "created_at": created_at,
            "expires_at": expires_at,
        }
        self._write(lambda cursor: cursor.execute(self._sql.insert_web_session, row))

    def web_session_user(self, token_hash: str, now: Instant) -> User | None:
        parameters = {"token_hash": token_hash, "now": now}
        return self._one(self._sql.web_session_user, parameters, _user)

    def delete_web_session(self, token_hash: str) -> None:
        parameters = {"token_hash": token_hash}
        self._write(lambda cursor: cursor.execute(self._sql.delete_web_session, parameters))

    def _servers(self, sql: str, parameters: dict[str, Any]) -> list[Server]:
        def work(cursor: Cursor) -> list[Server]:
            cursor.execute(sql, parameters)
            rows = [dict(zip(SERVER_COLUMNS, row, strict=True)) for row in cursor.fetchall()]
            admins: dict[str, list[str]] = {row["id"]: [] for row in rows}
            ids = list(admins)
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = {f"id{n}": server_id for n, server_id in enumerate(chunk)}
                cursor.execute(self._sql.admins_of(len(chunk)), marks)
                for server_id, user_id in cursor.fetchall():
                    admins[server_id].append(user_id)
            return [codec.row_to_server(row, tuple(admins[row["id"]])) for row in rows]

        return self._read(work)

    def _write_admins(self, cursor: Cursor, server: Server) -> None:
        cursor.execute(self._sql.delete_admins, {"server_id": server.id})
        if server.admin_ids:
            cursor.executemany(
                self._sql.insert_admin,
                [
                    {"server_id": server.id, "user_id": user_id, "position": position}
                    for position, user_id in enumerate(server.admin_ids)
                ],
            )

    def insert_server(self, server: Server) -> None:
        row = codec.server_to_row(server)

        def work(cursor: Cursor) -> None:
            cursor.execute(self._sql.insert_server, row)
            self._write_admins(cursor, server)

        self._write(work)

    def get_server(self, server_id: str) -> Server | None:
        """One statement, the server's row once per admin: every job read and create asks
        (a second statement for the admins cost PostgreSQL a round trip each time)."""

        def work(cursor: Cursor) -> Server | None:
            cursor.execute(self._sql.get_server_with_admins, {"id": server_id})
            return _server_of(cursor.fetchall(), 0)

        return self._read(work)

    def replace_server(self, server: Server, expected_version: int) -> bool:
        parameters = {**codec.server_to_row(server), "expected_version": expected_version}

        def work(cursor: Cursor) -> bool:
            cursor.execute(self._sql.replace_server, parameters)
            if cursor.rowcount != 1:
                return False
            self._write_admins(cursor, server)
            return True

        return self._write(work)

    def list_servers(self) -> list[Server]:
        return self._servers(self._sql.list_servers, {})

    def servers_of_user(self, user_id: str) -> list[Server]:
        return self._servers(self._sql.servers_of_user, {"user_id": user_id})

    def delete_server(self, server_id: str) -> int:
        parameters = {"server_id": server_id}

        def work(cursor: Cursor) -> int:
            cursor.execute(self._sql.live_jobs_of_server, parameters)
            live = int(cursor.fetchall()[0][0])
            if live == 0:
                cursor.execute(self._sql.delete_admins, parameters)
                cursor.execute(self._sql.delete_schedules_of_server, parameters)
                cursor.execute(self._sql.delete_server, parameters)
            return live

        return self._write(work)

    # -- schedules -------------------------------------------------------------------------

    def _schedules(self, sql: str, parameters: dict[str, Any]) -> list[Schedule]:
        rows = self._rows(sql, parameters)
        return [
            codec.row_to_schedule(dict(zip(SCHEDULE_COLUMNS, row, strict=True))) for row in rows
        ]

    def insert_schedule(self, schedule: Schedule) -> None:
        row = codec.schedule_to_row(schedule)
        self._write(lambda cursor: cursor.execute(self._sql.insert_schedule, row))

    def get_schedule(self, schedule_id: str) -> Schedule | None:
        found = self._schedules(self._sql.get_schedule, {"id": schedule_id})
        return found[0] if found else None

    def fire_schedules(self, writes: Sequence[ScheduleWrite]) -> list[bool]:
        rows = [
            {**codec.schedule_to_row(w.schedule), "expected_version": w.expected_version}
            for w in writes
        ]

        def work(cursor: Cursor) -> list[bool]:
            stored, deltas = [], Counter[str]()
            for write, parameters in zip(writes, rows, strict=True):
                cursor.execute(self._sql.replace_schedule, parameters)
                won = cursor.rowcount == 1
                stored.append(won)
                if won and write.job is not None:
                    cursor.execute(self._sql.job_exists, {"id": write.job.id})
                    if int(cursor.fetchall()[0][0]) == 0:
                        cursor.execute(self._sql.insert_job, codec.job_to_row(write.job))
                        deltas[write.job.state.value] += 1
                if won and write.group is not None:
                    cursor.execute(self._sql.group_exists, {"id": write.group.id})
                    if int(cursor.fetchall()[0][0]) == 0:
                        cursor.execute(self._sql.insert_group, codec.group_to_row(write.group))
                        if write.group_jobs:
                            cursor.executemany(
                                self._sql.insert_job,
                                [codec.job_to_row(job) for job in write.group_jobs],
                            )
                        for job in write.group_jobs:
                            deltas[job.state.value] += 1
            self._count(cursor, deltas)
            return stored

        return self._write(work)

    def delete_schedule(self, schedule_id: str) -> bool:
        def work(cursor: Cursor) -> bool:
            cursor.execute(self._sql.delete_schedule, {"id": schedule_id})
            return bool(cursor.rowcount == 1)

        return self._write(work)

    def list_schedules(self, server_id: str | None = None) -> list[Schedule]:
        if server_id is None:
            return self._schedules(self._sql.list_schedules, {})
        return self._schedules(self._sql.schedules_of_server, {"server_id": server_id})

    def selector_schedules(self, owner_id: str) -> list[Schedule]:
        return self._schedules(self._sql.selector_schedules, {"owner_id": owner_id})

    def due_schedules(self, now: Instant, limit: int) -> list[Schedule]:
        parameters = {"paused": False, "now": now, "limit": limit}
        return self._schedules(self._sql.due_schedules, parameters)


def idempotency_row(record: IdempotencyRecord) -> dict[str, Any]:
    return {
        "user_id": record.user_id,
        "idempotency_key": record.key,
        "fingerprint": record.fingerprint,
        "job_id": record.job_ids[0] if record.job_ids else "",
        "job_ids_json": json.dumps(list(record.job_ids)) if len(record.job_ids) != 1 else None,
        "created_at": record.created_at,
    }


def count_move(deltas: Counter[str], job: Job, expected: Job) -> None:
    """A swap from `expected` to `job` in a unit's count changes (none if the state stayed)."""
    if job.state is not expected.state:
        deltas[expected.state.value] -= 1
        deltas[job.state.value] += 1


def duplicate(error: BaseException) -> AlreadyExists:
    """The AlreadyExists an integrity error means (a unique name, a key, or an id)."""
    detail = str(error).lower()
    if "idempotency" in detail:
        return AlreadyExists("that Idempotency-Key was already used")
    if "name" in detail:
        return AlreadyExists("that name is already taken")
    return AlreadyExists("a record with that id already exists")
