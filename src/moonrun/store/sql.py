"""SqlStore: the Store seam over SQLAlchemy Core, shared by FileStore and MySQLStore.

Subclasses supply the engine and say how writes are serialised: SQLite takes the write lock up
front (`BEGIN IMMEDIATE`), MySQL locks claim candidates with `FOR UPDATE SKIP LOCKED` and
retries deadlocks. Everything else (queries, compare-and-swap, codecs) is here, once.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    Select,
    and_,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from moonrun.errors import AlreadyExists, SchemaTooNew, StoreUnavailable
from moonrun.scheduling.jobs import Job, JobState
from moonrun.scheduling.records import Endpoint, Server, Session, User
from moonrun.scheduling.time import Instant
from moonrun.store import codec
from moonrun.store.protocol import JobCursor
from moonrun.store.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    api_tokens,
    endpoints,
    idempotency_keys,
    jobs,
    schema_version,
    server_admins,
    servers,
    sessions,
    users,
    web_sessions,
)

T = TypeVar("T")

ACTIVE_STATES = (JobState.ACCEPTED.value, JobState.RUNNING.value)
WRITE = {"moonrun_write": True}
"""Execution option marking a connection whose transaction will write."""


class SqlStore:
    """A Store over one SQL database; see FileStore and MySQLStore for the two dialects."""

    skip_locked = False
    """Lock claim candidates with FOR UPDATE SKIP LOCKED (MySQL) rather than relying on a
    store-wide write lock (SQLite)."""
    write_retries = 1
    """How many times a write transaction runs before a retryable database error is final."""
    _write_lock: AbstractContextManager[Any] = nullcontext()
    """Held around every write transaction of this process (FileStore: one writer at a time)."""

    def __init__(self, engine: Engine, description: str, read_engine: Engine | None = None):
        self._engine = engine
        self._read_engine = read_engine or engine
        self._description = description
        try:
            self._migrate()
        except BaseException:
            self.close()
            raise

    @property
    def description(self) -> str:
        """Where the store is, without credentials."""
        return self._description

    # -- plumbing --------------------------------------------------------------------------

    def _is_retryable(self, error: DBAPIError) -> bool:
        """True for database errors worth running the transaction again for."""
        return False

    def _unavailable(self, error: SQLAlchemyError) -> StoreUnavailable:
        """A one-line, credential-free explanation of a database failure."""
        detail = error.orig if isinstance(error, DBAPIError) else error
        return StoreUnavailable(f"store {self._description} failed: {detail}")

    def _query(self, work: Callable[[Connection], T]) -> T:
        """Run read-only `work`; once more on a fresh connection if the old one was dead."""
        for attempt in (1, 2):
            try:
                with self._read_engine.connect() as connection:
                    return work(connection)
            except DBAPIError as error:
                if attempt == 1 and error.connection_invalidated:
                    continue  # the pool dropped the dead connection; a read is safe to repeat
                raise self._unavailable(error) from None
            except SQLAlchemyError as error:
                raise self._unavailable(error) from None
        raise AssertionError("unreachable")

    def _transact(self, work: Callable[[Connection], T]) -> T:
        """Run `work` in one write transaction, again on retryable errors (bounded)."""
        for attempt in range(1, self.write_retries + 1):
            try:
                with (
                    self._write_lock,
                    self._engine.connect().execution_options(**WRITE) as connection,
                    connection.begin(),
                ):
                    return work(connection)
            except IntegrityError as error:
                raise AlreadyExists(_duplicate_message(error)) from None
            except DBAPIError as error:
                if attempt < self.write_retries and self._is_retryable(error):
                    # Capped, jittered backoff: the other transaction usually finishes quickly.
                    time.sleep(min(0.2, 0.005 * 2**attempt) * random.random())
                    continue
                raise self._unavailable(error) from None
            except SQLAlchemyError as error:
                raise self._unavailable(error) from None
        raise AssertionError("unreachable")

    def _lock_schema(self, connection: Connection) -> None:
        """Serialise migrations between processes (the write transaction does it for SQLite)."""

    def _unlock_schema(self, connection: Connection) -> None:
        """Undo `_lock_schema`."""

    def _migrate(self) -> None:
        """Bring the schema up to SCHEMA_VERSION; refuse a newer one."""
        try:
            with self._engine.connect().execution_options(**WRITE) as connection:
                self._lock_schema(connection)
                try:
                    with connection.begin():
                        self._apply_migrations(connection)
                finally:
                    self._unlock_schema(connection)
        except SQLAlchemyError as error:
            raise self._unavailable(error) from None

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
        query = select(schema_version.c.version)
        return self._query(lambda c: int(c.execute(query).scalar_one()))

    def close(self) -> None:
        self._engine.dispose()
        self._read_engine.dispose()

    # -- jobs ----------------------------------------------------------------------------

    def _jobs(self, query: Select[Any]) -> list[Job]:
        return self._query(lambda c: [codec.row_to_job(row) for row in c.execute(query).mappings()])

    def get_job(self, job_id: str) -> Job | None:
        found = self._jobs(select(jobs).where(jobs.c.id == job_id))
        return found[0] if found else None

    def insert_job(self, job: Job) -> None:
        self._transact(lambda c: c.execute(insert(jobs).values(codec.job_to_row(job))))

    def replace_job(self, job: Job, expected_version: int) -> bool:
        statement = (
            update(jobs)
            .where(jobs.c.id == job.id, jobs.c.version == expected_version)
            .values(codec.job_to_row(job))
        )
        return self._transact(lambda c: c.execute(statement).rowcount == 1)

    def _claimable(self, endpoint_id: str, now: Instant, limit: int) -> Select[Any]:
        return (
            select(jobs)
            .where(jobs.c.endpoint_id == endpoint_id, jobs.c.claimable_at <= now)
            .order_by(jobs.c.claimable_at, jobs.c.created_at, jobs.c.id)
            .limit(limit)
        )

    def claimable_jobs(self, endpoint_id: str, now: Instant, limit: int) -> list[Job]:
        return self._jobs(self._claimable(endpoint_id, now, limit))

    def claim_jobs(
        self, endpoint_id: str, now: Instant, limit: int, grant: Callable[[Job], Job]
    ) -> list[Job]:
        query = self._claimable(endpoint_id, now, limit)
        if self.skip_locked:
            query = query.with_for_update(skip_locked=True)

        def work(connection: Connection) -> list[Job]:
            claimed = []
            for row in connection.execute(query).mappings().all():
                job = codec.row_to_job(row)
                granted = grant(job)
                statement = (
                    update(jobs)
                    .where(jobs.c.id == job.id, jobs.c.version == job.version)
                    .values(codec.job_to_row(granted))
                )
                if connection.execute(statement).rowcount == 1:
                    claimed.append(granted)
            return claimed

        return self._transact(work)

    def due_jobs(self, now: Instant, limit: int) -> list[Job]:
        return self._jobs(
            select(jobs)
            .where(jobs.c.deadline_at <= now)
            .order_by(jobs.c.deadline_at, jobs.c.id)
            .limit(limit)
        )

    def active_jobs(self, endpoint_id: str) -> list[Job]:
        return self._jobs(
            select(jobs).where(jobs.c.endpoint_id == endpoint_id, jobs.c.state.in_(ACTIVE_STATES))
        )

    def job_counts(self) -> dict[JobState, int]:
        query = select(jobs.c.state, func.count()).group_by(jobs.c.state)
        return self._query(lambda c: {JobState(state): n for state, n in c.execute(query)})

    def list_jobs(
        self,
        *,
        server_ids: Collection[str] | None,
        state: JobState | None,
        limit: int,
        after: JobCursor | None = None,
    ) -> list[Job]:
        if server_ids is not None and not server_ids:
            return []
        query = select(jobs)
        if server_ids is not None:
            query = query.where(jobs.c.server_id.in_(list(server_ids)))
        if state is not None:
            query = query.where(jobs.c.state == state.value)
        if after is not None:
            created_at, job_id = after
            query = query.where(
                or_(
                    jobs.c.created_at < created_at,
                    and_(jobs.c.created_at == created_at, jobs.c.id < job_id),
                )
            )
        return self._jobs(query.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit))

    def remember_idempotent_job(
        self, user_id: str, key: str, fingerprint: str, job_id: str, at: Instant
    ) -> None:
        row = {
            "user_id": user_id,
            "idempotency_key": key,
            "fingerprint": fingerprint,
            "job_id": job_id,
            "created_at": at,
        }
        self._transact(lambda c: c.execute(insert(idempotency_keys).values(row)))

    def idempotent_job(self, user_id: str, key: str) -> tuple[str, str] | None:
        query = select(idempotency_keys.c.fingerprint, idempotency_keys.c.job_id).where(
            idempotency_keys.c.user_id == user_id, idempotency_keys.c.idempotency_key == key
        )
        row = self._query(lambda c: c.execute(query).first())
        return None if row is None else (row[0], row[1])

    # -- endpoints and sessions ------------------------------------------------------------

    def _endpoints(self, query: Select[Any]) -> list[Endpoint]:
        return self._query(
            lambda c: [codec.row_to_endpoint(row) for row in c.execute(query).mappings()]
        )

    def insert_endpoint(self, endpoint: Endpoint) -> None:
        row = codec.endpoint_to_row(endpoint)
        self._transact(lambda c: c.execute(insert(endpoints).values(row)))

    def get_endpoint(self, endpoint_id: str) -> Endpoint | None:
        found = self._endpoints(select(endpoints).where(endpoints.c.id == endpoint_id))
        return found[0] if found else None

    def endpoint_by_join_token(self, token_hash: str) -> Endpoint | None:
        found = self._endpoints(select(endpoints).where(endpoints.c.join_token_hash == token_hash))
        return found[0] if found else None

    def replace_endpoint(self, endpoint: Endpoint, expected_version: int) -> bool:
        statement = (
            update(endpoints)
            .where(endpoints.c.id == endpoint.id, endpoints.c.version == expected_version)
            .values(codec.endpoint_to_row(endpoint))
        )
        return self._transact(lambda c: c.execute(statement).rowcount == 1)

    def list_endpoints(self) -> list[Endpoint]:
        return self._endpoints(select(endpoints).order_by(endpoints.c.created_at, endpoints.c.id))

    def insert_session(self, session: Session) -> None:
        row = codec.session_to_row(session)
        self._transact(lambda c: c.execute(insert(sessions).values(row)))

    def get_session(self, session_id: str) -> Session | None:
        query = select(sessions).where(sessions.c.id == session_id)
        row = self._query(lambda c: c.execute(query).mappings().first())
        return None if row is None else codec.row_to_session(row)

    def extend_session(self, session_id: str, seen_at: Instant, expires_at: Instant) -> None:
        statement = (
            update(sessions)
            .where(sessions.c.id == session_id, sessions.c.expires_at < expires_at)
            .values(last_seen_at=seen_at, expires_at=expires_at)
        )
        self._transact(lambda c: c.execute(statement))

    def mark_session_reconciled(self, session_id: str, at: Instant) -> None:
        statement = update(sessions).where(sessions.c.id == session_id).values(reconciled_at=at)
        self._transact(lambda c: c.execute(statement))

    # -- users, tokens and servers ---------------------------------------------------------

    def _users(self, query: Select[Any]) -> list[User]:
        return self._query(
            lambda c: [codec.row_to_user(row) for row in c.execute(query).mappings()]
        )

    def insert_user(self, user: User) -> None:
        row = codec.user_to_row(user)
        self._transact(lambda c: c.execute(insert(users).values(row)))

    def get_user(self, user_id: str) -> User | None:
        found = self._users(select(users).where(users.c.id == user_id))
        return found[0] if found else None

    def user_by_name(self, name: str) -> User | None:
        found = self._users(select(users).where(users.c.name == name))
        return found[0] if found else None

    def list_users(self) -> list[User]:
        return self._users(select(users).order_by(users.c.created_at, users.c.id))

    def insert_api_token(self, token_hash: str, user_id: str, created_at: Instant) -> None:
        row = {"token_hash": token_hash, "user_id": user_id, "created_at": created_at}
        self._transact(lambda c: c.execute(insert(api_tokens).values(row)))

    def user_by_api_token(self, token_hash: str) -> User | None:
        found = self._users(
            select(users)
            .join(api_tokens, api_tokens.c.user_id == users.c.id)
            .where(api_tokens.c.token_hash == token_hash)
        )
        return found[0] if found else None

    def insert_web_session(
        self, token_hash: str, user_id: str, created_at: Instant, expires_at: Instant
    ) -> None:
        row = {
            "token_hash": token_hash,
            "user_id": user_id,
            "created_at": created_at,
            "expires_at": expires_at,
        }
        self._transact(lambda c: c.execute(insert(web_sessions).values(row)))

    def web_session_user(self, token_hash: str, now: Instant) -> User | None:
        found = self._users(
            select(users)
            .join(web_sessions, web_sessions.c.user_id == users.c.id)
            .where(web_sessions.c.token_hash == token_hash, web_sessions.c.expires_at > now)
        )
        return found[0] if found else None

    def delete_web_session(self, token_hash: str) -> None:
        statement = delete(web_sessions).where(web_sessions.c.token_hash == token_hash)
        self._transact(lambda c: c.execute(statement))

    def _servers(self, query: Select[Any]) -> list[Server]:
        def work(connection: Connection) -> list[Server]:
            rows = connection.execute(query).mappings().all()
            ids = [row["id"] for row in rows]
            admins: dict[str, list[str]] = {server_id: [] for server_id in ids}
            if ids:
                admin_rows = connection.execute(
                    select(server_admins.c.server_id, server_admins.c.user_id)
                    .where(server_admins.c.server_id.in_(ids))
                    .order_by(server_admins.c.server_id, server_admins.c.position)
                )
                for server_id, user_id in admin_rows:
                    admins[server_id].append(user_id)
            return [codec.row_to_server(row, tuple(admins[row["id"]])) for row in rows]

        return self._query(work)

    def _write_admins(self, connection: Connection, server: Server) -> None:
        connection.execute(delete(server_admins).where(server_admins.c.server_id == server.id))
        if server.admin_ids:
            connection.execute(
                insert(server_admins),
                [
                    {"server_id": server.id, "user_id": user_id, "position": position}
                    for position, user_id in enumerate(server.admin_ids)
                ],
            )

    def insert_server(self, server: Server) -> None:
        def work(connection: Connection) -> None:
            connection.execute(insert(servers).values(codec.server_to_row(server)))
            self._write_admins(connection, server)

        self._transact(work)

    def get_server(self, server_id: str) -> Server | None:
        found = self._servers(select(servers).where(servers.c.id == server_id))
        return found[0] if found else None

    def replace_server(self, server: Server, expected_version: int) -> bool:
        def work(connection: Connection) -> bool:
            statement = (
                update(servers)
                .where(servers.c.id == server.id, servers.c.version == expected_version)
                .values(codec.server_to_row(server))
            )
            if connection.execute(statement).rowcount != 1:
                return False
            self._write_admins(connection, server)
            return True

        return self._transact(work)

    def list_servers(self) -> list[Server]:
        return self._servers(select(servers).order_by(servers.c.created_at, servers.c.id))

    def servers_of_user(self, user_id: str) -> list[Server]:
        administered = select(server_admins.c.server_id).where(server_admins.c.user_id == user_id)
        return self._servers(
            select(servers)
            .where(or_(servers.c.owner_id == user_id, servers.c.id.in_(administered)))
            .order_by(servers.c.created_at, servers.c.id)
        )


def _duplicate_message(error: IntegrityError) -> str:
    detail = str(error.orig).lower()
    if "name" in detail:
        return "that name is already taken"
    return "a record with that id already exists"
