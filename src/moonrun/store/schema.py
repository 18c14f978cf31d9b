"""The one SQL schema (SQLAlchemy Core) that FileStore and MySQLStore share, and its migrations.

Every time is a BIGINT of milliseconds since the epoch. Nested values of the job record are
flat columns, so each scheduling fact is plain SQL. `claimable_at` and `deadline_at` are the
record's own derived values (`Job.claimable_at`, `Job.deadline_at`), stored for the claim and
sweeper indexes; `claimable_owner_id` is the job's owner while `claimable_at` is set (NULL
otherwise), so that a claim finds the owners with waiting jobs by one index dive each, past
the entries of every job that does not wait.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Double,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    inspect,
    text,
)
from sqlalchemy.types import TypeEngine


def _text(length: int) -> TypeEngine[str]:
    """A string column compared byte by byte everywhere: PostgreSQL's default collation
    follows the locale, whose order differs from SQLite's and MySQL's `utf8mb4_bin` (owners
    take turns at claims in id order, on every store alike)."""
    return String(length).with_variant(String(length, collation="C"), "postgresql")


ID = _text(64)
KEY = _text(128)
"""A concurrency key (`scheduling/concurrency.py`)."""
HASH = _text(64)
SHORT = _text(64)

TABLE_OPTIONS: Final[dict[str, Any]] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
}
"""Byte-exact comparisons on MySQL, as in SQLite and MemoryStore."""

metadata = MetaData()

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, nullable=False),
    **TABLE_OPTIONS,
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", ID, primary_key=True),
    Column("server_id", ID, nullable=False),
    Column("endpoint_id", ID, nullable=False),
    Column("owner_id", ID, nullable=False, server_default=text("''")),
    Column("kind", SHORT, nullable=False),
    Column("payload_json", Text, nullable=False),
    Column("state", _text(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("backoff_initial_s", Double, nullable=False),
    Column("backoff_multiplier", Double, nullable=False),
    Column("backoff_max_s", Double, nullable=False),
    Column("backoff_jitter", Double, nullable=False),
    Column("eligible_at", BigInteger, nullable=False),
    Column("claimable_at", BigInteger),
    Column("claimable_owner_id", ID),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("lease_hash", HASH),
    Column("session_generation", BigInteger),
    Column("claimed_at", BigInteger),
    Column("ack_deadline", BigInteger),
    Column("lease_expires_at", BigInteger),
    Column("deadline_at", BigInteger),
    Column("progress_seq", BigInteger),
    Column("progress_percent", Double),
    Column("progress_message", Text),
    Column("progress_at", BigInteger),
    Column("cancel_requested_at", BigInteger),
    Column("cancel_requested_by", ID),
    Column("cancel_result", _text(16)),
    Column("cancel_resolved_at", BigInteger),
    Column("failure_reason", _text(32)),
    Column("failure_attempt", Integer),
    Column("failure_at", BigInteger),
    Column("failure_code", SHORT),
    Column("failure_message", Text),
    Column("result_attempt", Integer),
    Column("result_outcome", _text(16)),
    Column("result_retryable", Boolean),
    Column("result_error_code", SHORT),
    Column("result_error_message", Text),
    Column("result_output_json", Text),
    Column("result_fingerprint", HASH),
    Column("result_at", BigInteger),
    Column("terminal_outcome", _text(16)),
    Column("terminal_attempt", Integer),
    Column("terminal_at", BigInteger),
    Column("terminal_error_code", SHORT),
    Column("terminal_error_message", Text),
    Column("reconcile_outcome", _text(16)),
    Column("reconcile_at", BigInteger),
    Column("reconcile_generation", BigInteger),
    Column("history_json", Text, nullable=False),
    Column("group_id", ID),
    Column("held", Boolean, nullable=False, server_default=text("false")),
    Column("held_group_id", ID),
    Column("schedule_id", ID),
    Column("scheduled_for", BigInteger),
    Column("concurrency_key", KEY),
    Column("concurrency_limit", Integer),
    Column("key_held", Boolean, nullable=False, server_default=text("false")),
    Column("held_key", KEY),
    Column("live_key", KEY),
    Column("after_json", Text),
    Column("after_group_id", ID),
    Column("dependency_held", Integer),
    Column("priority", Integer, nullable=False, server_default=text("5")),
    Column("claimable_rank", Integer),
    Index("ix_jobs_claim", "endpoint_id", "claimable_at", "created_at", "id"),
    Index("ix_jobs_active", "endpoint_id", "state"),
    Index("ix_jobs_due", "deadline_at", "id"),
    Index("ix_jobs_server_listing", "server_id", "created_at", "id"),
    Index("ix_jobs_server_state_listing", "server_id", "state", "created_at", "id"),
    Index("ix_jobs_state_listing", "state", "created_at", "id"),
    Index("ix_jobs_listing", "created_at", "id"),
    Index("ix_jobs_kind_listing", "kind", "created_at", "id"),
    Index("ix_jobs_server_kind_listing", "server_id", "kind", "created_at", "id"),
    Index("ix_jobs_finished", "terminal_at", "id"),
    # And ix_jobs_owner_claim, made by migration 8 (OWNER_CLAIM_INDEX), the groups'
    # indexes, made by migration 11 (GROUP_INDEXES), ix_jobs_dependency_held, made by
    # migration 13 (DEPENDENCY_INDEX), the keys', by migration 14 (KEY_INDEXES), and
    # ix_jobs_priority_claim, by migration 15 (PRIORITY_CLAIM_INDEX), in place of 8's.
    **TABLE_OPTIONS,
)

endpoints = Table(
    "endpoints",
    metadata,
    Column("id", ID, primary_key=True),
    Column("name", SHORT, nullable=False, unique=True),
    Column("created_at", BigInteger, nullable=False),
    Column("join_token_hash", HASH, nullable=False, unique=True),
    Column("join_token_expires_at", BigInteger, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("identity_public_key", SHORT),
    Column("joined_at", BigInteger),
    Column("generation", BigInteger, nullable=False),
    Column("current_session_id", ID),
    Column("draining", Boolean, nullable=False, server_default=text("false")),
    Column("labels_json", Text),
    **TABLE_OPTIONS,
)

endpoint_kinds = Table(
    "endpoint_kinds",
    metadata,
    Column("endpoint_id", ID, primary_key=True),
    Column("kinds_json", Text, nullable=False),
    Column("advertised_at", BigInteger, nullable=False),
    **TABLE_OPTIONS,
)
"""What the endpoint's Run last advertised at registration (docs/protocol.md, "Kinds"): apart from
`endpoints`, whose row every signed request reads."""

sessions = Table(
    "sessions",
    metadata,
    Column("id", ID, primary_key=True),
    Column("endpoint_id", ID, nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("boot_id", _text(128), nullable=False),
    Column("capacity", Integer, nullable=False),
    Column("run_version", SHORT, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("last_seen_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    Column("reconciled_at", BigInteger),
    Index("ix_sessions_endpoint", "endpoint_id", "generation"),
    **TABLE_OPTIONS,
)

users = Table(
    "users",
    metadata,
    Column("id", ID, primary_key=True),
    Column("name", SHORT, nullable=False, unique=True),
    Column("platform_admin", Boolean, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("password_hash", _text(255)),
    Column("disabled", Boolean, nullable=False, server_default=text("false")),
    **TABLE_OPTIONS,
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("token_hash", HASH, primary_key=True),
    Column("user_id", ID, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    **TABLE_OPTIONS,
)

servers = Table(
    "servers",
    metadata,
    Column("id", ID, primary_key=True),
    Column("name", SHORT, nullable=False),
    Column("endpoint_id", ID, nullable=False),
    Column("owner_id", ID, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("labels_json", Text),
    Index("ix_servers_owner", "owner_id"),
    **TABLE_OPTIONS,
)

server_admins = Table(
    "server_admins",
    metadata,
    Column("server_id", ID, primary_key=True),
    Column("user_id", ID, primary_key=True),
    Column("position", Integer, nullable=False),
    Index("ix_server_admins_user", "user_id"),
    **TABLE_OPTIONS,
)

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("user_id", ID, primary_key=True),
    Column("idempotency_key", _text(255), primary_key=True),
    Column("fingerprint", HASH, nullable=False),
    Column("job_id", ID, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("job_ids_json", Text),
    Index("ix_idempotency_keys_job", "job_id"),
    **TABLE_OPTIONS,
)

web_sessions = Table(
    "web_sessions",
    metadata,
    Column("token_hash", HASH, primary_key=True),
    Column("user_id", ID, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    Index("ix_web_sessions_expiry", "expires_at"),
    **TABLE_OPTIONS,
)

job_counts = Table(
    "job_counts",
    metadata,
    Column("state", _text(16), primary_key=True),
    Column("shard", Integer, primary_key=True, autoincrement=False),
    Column("n", BigInteger, nullable=False),
    **TABLE_OPTIONS,
)
"""How many jobs are in each state: the sum of `n` over a state's shards. Kept by the stores in
the transaction of every job write, so `/metrics` never counts the jobs table itself."""

job_groups = Table(
    "job_groups",
    metadata,
    Column("id", ID, primary_key=True),
    Column("creator_id", ID, nullable=False),
    Column("selector", Text, nullable=False),
    Column("kind", SHORT, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("job_count", Integer, nullable=False),
    Column("max_parallel", Integer),
    Column("stop_on_failure", Boolean, nullable=False),
    Column("version", BigInteger, nullable=False),
    **TABLE_OPTIONS,
)
"""Fan-out groups (`scheduling/groups.py`); their jobs carry `group_id`. Named so, because
GROUPS is a reserved word of MySQL."""
concurrency_keys = Table(
    "concurrency_keys",
    metadata,
    Column("owner_id", ID, primary_key=True),
    Column("concurrency_key", KEY, primary_key=True),
    Column("concurrency_limit", Integer, nullable=False),
    **TABLE_OPTIONS,
)
"""Each owner's concurrency keys: the key's limit, and the row its releases take turns on
(`scheduling/concurrency.py`). A key's row is made by its first release."""
job_dependencies = Table(
    "job_dependencies",
    metadata,
    Column("on_id", ID, primary_key=True),
    Column("job_id", ID, primary_key=True),
    **TABLE_OPTIONS,
)
"""What each job waits on (`scheduling/dependencies.py`): one row per job or group a job names
(`on_id`), written with the job and never changed, so that a job's end finds its waiters by one
range of the key."""


def _schedule_columns() -> list[Column[Any]]:
    """The columns of `schedules`, made anew at each call (a column belongs to one table):
    migration 16 builds SQLite's table again from them."""
    return [
        Column("id", ID, primary_key=True),
        Column("server_id", ID),
        Column("owner_id", ID, nullable=False),
        Column("name", SHORT, nullable=False),
        Column("cron", _text(200), nullable=False),
        Column("timezone", SHORT, nullable=False),
        Column("job_json", Text, nullable=False),
        Column("overlap", _text(16), nullable=False),
        Column("catchup_window_s", Integer, nullable=False),
        Column("paused", Boolean, nullable=False),
        Column("created_at", BigInteger, nullable=False),
        Column("next_at", BigInteger),
        Column("version", BigInteger, nullable=False),
        Column("last_scheduled_for", BigInteger),
        Column("last_job_id", ID),
        Column("skipped", BigInteger, nullable=False),
        Column("missed", BigInteger, nullable=False),
        # Migration 16: selector schedules (their firings are groups).
        Column("selector", Text),
        Column("max_parallel", Integer),
        Column("stop_on_failure", Boolean, nullable=False, server_default=text("false")),
        Column("last_group_id", ID),
        Column("unmatched", BigInteger, nullable=False, server_default=text("0")),
    ]


schedules = Table(
    "schedules",
    metadata,
    *_schedule_columns(),
    Index("ix_schedules_due", "paused", "next_at", "id"),
    Index("ix_schedules_server", "server_id", "created_at", "id"),
    Index("ix_schedules_owner", "owner_id", "created_at", "id"),
    **TABLE_OPTIONS,
)
"""Recurring schedules (`scheduling/schedules.py`); `next_at` is the cursor the due index finds.
A schedule names a server (`server_id`) or a label `selector` (its firings are groups; `server_id`
NULL); `ix_schedules_owner` finds a creator's selector schedules."""

V1_TABLES: Final = (jobs, endpoints, sessions, users, api_tokens, servers, server_admins)
DATA_TABLES: Final = (
    *V1_TABLES,
    idempotency_keys,
    web_sessions,
    job_counts,
    endpoint_kinds,
    job_groups,
    schedules,
    concurrency_keys,
    job_dependencies,
)


def _create_v1(connection: Connection) -> None:
    metadata.create_all(connection, tables=list(V1_TABLES))


def _idempotency_keys_v2(connection: Connection) -> None:
    idempotency_keys.create(connection)


def _web_sessions_v3(connection: Connection) -> None:
    web_sessions.create(connection)


def _scale_v4(connection: Connection) -> None:
    """Listing indexes by state, the due index ordered like the sweeper's query, idempotent
    batches, and the per-state job counts (filled once from the jobs table)."""
    inspector = inspect(connection)
    if "job_ids_json" not in {c["name"] for c in inspector.get_columns("idempotency_keys")}:
        connection.execute(text("ALTER TABLE idempotency_keys ADD COLUMN job_ids_json TEXT"))
    present = {index["name"] for index in inspector.get_indexes("jobs")}
    if "ix_jobs_deadline" in present:
        Index("ix_jobs_deadline", jobs.c.deadline_at).drop(connection)
    for index in jobs.indexes:
        if index.name not in present:
            index.create(connection)
    job_counts.create(connection)
    connection.execute(
        text(
            "INSERT INTO job_counts (state, shard, n) "
            "SELECT state, 0, COUNT(*) FROM jobs GROUP BY state"
        )
    )
    if connection.dialect.name == "sqlite":
        for trigger in SQLITE_COUNT_TRIGGERS:
            connection.execute(text(trigger))


_COUNT_UP = (
    "INSERT INTO job_counts (state, shard, n) VALUES (NEW.state, 0, 1) "
    "ON CONFLICT (state, shard) DO UPDATE SET n = n + 1;"
)
_COUNT_DOWN = "UPDATE job_counts SET n = n - 1 WHERE state = OLD.state AND shard = 0;"
SQLITE_COUNT_TRIGGERS: Final = (
    f"CREATE TRIGGER jobs_counted_insert AFTER INSERT ON jobs BEGIN {_COUNT_UP} END",
    "CREATE TRIGGER jobs_counted_update AFTER UPDATE OF state ON jobs "
    f"WHEN OLD.state <> NEW.state BEGIN {_COUNT_DOWN} {_COUNT_UP} END",
    f"CREATE TRIGGER jobs_counted_delete AFTER DELETE ON jobs BEGIN {_COUNT_DOWN} END",
)
"""SQLite keeps `job_counts` by triggers, inside the statement that changes a job (no extra
statement per write). MySQL stores count in the same transaction instead (`SqlStore._count`),
since creating triggers there needs privileges an operator may not grant."""


def _access_v5(connection: Connection) -> None:
    """Disabled users and draining endpoints: a flag column each, false for every existing row
    (docs/protocol.md, "Users and access" and "Endpoints")."""
    inspector = inspect(connection)
    for table, column in (("users", "disabled"), ("endpoints", "draining")):
        if column not in {c["name"] for c in inspector.get_columns(table)}:
            connection.execute(
                text(f"ALTER TABLE {table} ADD COLUMN {column} BOOLEAN NOT NULL DEFAULT 0")
            )


def _kinds_v6(connection: Connection) -> None:
    """Advertised kinds and the listings by kind (docs/protocol.md, "Kinds", "Jobs")."""
    inspector = inspect(connection)
    if "endpoint_kinds" not in inspector.get_table_names():
        endpoint_kinds.create(connection)
    present = {index["name"] for index in inspector.get_indexes("jobs")}
    for index in jobs.indexes:
        if index.name not in present:
            index.create(connection)


def _owners_v7(connection: Connection) -> None:
    """Each job knows its owner (docs/protocol.md, "Claims"): the owner of its server, which never
    changes, filled in for the jobs already stored. A job whose server was removed (all of
    them ended) keeps an empty owner: nobody can tell any more whose it was."""
    if "owner_id" not in {c["name"] for c in inspect(connection).get_columns("jobs")}:
        connection.execute(
            text("ALTER TABLE jobs ADD COLUMN owner_id VARCHAR(64) NOT NULL DEFAULT ''")
        )
    connection.execute(
        text(
            "UPDATE jobs SET owner_id = COALESCE((SELECT servers.owner_id FROM servers "
            "WHERE servers.id = jobs.server_id), '') WHERE owner_id = ''"
        )
    )


OWNER_CLAIM_INDEX: Final = (
    "CREATE INDEX ix_jobs_owner_claim ON jobs "
    "(endpoint_id, claimable_owner_id, claimable_at, created_at, id)"
)
"""Claims where owners take turns: the next owner with waiting jobs, and an owner's oldest
claimable jobs. Not declared on `jobs`, because migrations 4 and 6 create every index declared
there, and on a store older than them this column does not exist yet."""


def _owner_turns_v8(connection: Connection) -> None:
    """Owners take turns at claims (docs/protocol.md, "Claims"): the owner of each waiting job, and
    the index of owners' claimable jobs."""
    inspector = inspect(connection)
    if "claimable_owner_id" not in {c["name"] for c in inspector.get_columns("jobs")}:
        connection.execute(text("ALTER TABLE jobs ADD COLUMN claimable_owner_id VARCHAR(64)"))
    connection.execute(
        text(
            "UPDATE jobs SET claimable_owner_id = owner_id "
            "WHERE claimable_at IS NOT NULL AND claimable_owner_id IS NULL"
        )
    )
    if "ix_jobs_owner_claim" not in {index["name"] for index in inspector.get_indexes("jobs")}:
        connection.execute(text(OWNER_CLAIM_INDEX))


def _labels_v9(connection: Connection) -> None:
    """Labels on endpoints and servers (docs/protocol.md, "Labels"): a JSON object each, NULL
    (no labels) for every existing row. Selectors are matched in the service, over the few
    servers a caller may see, so no index is needed."""
    inspector = inspect(connection)
    for table in ("endpoints", "servers"):
        if "labels_json" not in {c["name"] for c in inspector.get_columns(table)}:
            connection.execute(text(f"ALTER TABLE {table} ADD COLUMN labels_json TEXT"))


def _schedules_v10(connection: Connection) -> None:
    """Recurring schedules, and the schedule and calendar time of each job a firing made
    (docs/protocol.md, "Schedules")."""
    inspector = inspect(connection)
    present = {c["name"] for c in inspector.get_columns("jobs")}
    if "schedule_id" not in present:
        connection.execute(text("ALTER TABLE jobs ADD COLUMN schedule_id VARCHAR(64)"))
    if "scheduled_for" not in present:
        connection.execute(text("ALTER TABLE jobs ADD COLUMN scheduled_for BIGINT"))
    if "schedules" not in inspector.get_table_names():
        schedules.create(connection)


GROUP_INDEXES: Final = {
    "ix_jobs_group_listing": "CREATE INDEX ix_jobs_group_listing ON jobs "
    "(group_id, created_at, id)",
    "ix_jobs_group_state": "CREATE INDEX ix_jobs_group_state ON jobs "
    "(group_id, state, created_at, id)",
    "ix_jobs_held": "CREATE INDEX ix_jobs_held ON jobs (held_group_id, created_at, id)",
}
"""A group's jobs newest first, its counts by state (and its jobs in one state), and its held
jobs in release order (`held_group_id` is NULL but while a job is held). Not declared on `jobs`
for the reason OWNER_CLAIM_INDEX is not."""


def _groups_v11(connection: Connection) -> None:
    """Fan-out groups (docs/protocol.md, "Groups"): their table, and each job's group and
    whether it is held; every existing job is in no group and not held."""
    inspector = inspect(connection)
    present = {c["name"] for c in inspector.get_columns("jobs")}
    for column, kind in (
        ("group_id", "VARCHAR(64)"),
        ("held", "BOOLEAN NOT NULL DEFAULT false"),
        ("held_group_id", "VARCHAR(64)"),
    ):
        if column not in present:
            connection.execute(text(f"ALTER TABLE jobs ADD COLUMN {column} {kind}"))
    if "job_groups" not in inspector.get_table_names():
        job_groups.create(connection)
    indexes = {index["name"] for index in inspector.get_indexes("jobs")}
    for name, statement in GROUP_INDEXES.items():
        if name not in indexes:
            connection.execute(text(statement))


def _retention_v12(connection: Connection) -> None:
    """Retention (docs/operations.md, "Retention"): finished jobs by when they ended, and the
    idempotency record of a job, so that deleting a batch of jobs reads only their rows."""
    inspector = inspect(connection)
    present = {index["name"] for index in inspector.get_indexes("jobs")}
    for index in jobs.indexes:
        if index.name not in present:
            index.create(connection)
    keyed = {index["name"] for index in inspector.get_indexes("idempotency_keys")}
    for index in idempotency_keys.indexes:
        if index.name not in keyed:
            index.create(connection)


DEPENDENCY_INDEX: Final = "CREATE INDEX ix_jobs_dependency_held ON jobs (dependency_held, id)"
"""The jobs still held on their dependencies, in id order, for the sweeper's repair
(`dependency_held` is 1 while a job is, NULL otherwise). Not declared on `jobs` for the reason
OWNER_CLAIM_INDEX is not."""


def _dependencies_v13(connection: Connection) -> None:
    """Dependencies (docs/protocol.md, "Dependencies"): what each job waits on, its table of
    waiters, and the index of jobs still held on them; every existing job waits on nothing."""
    inspector = inspect(connection)
    present = {c["name"] for c in inspector.get_columns("jobs")}
    for column, kind in (
        ("after_json", "TEXT"),
        ("after_group_id", "VARCHAR(64)"),
        ("dependency_held", "INTEGER"),
    ):
        if column not in present:
            connection.execute(text(f"ALTER TABLE jobs ADD COLUMN {column} {kind}"))
    if "job_dependencies" not in inspector.get_table_names():
        job_dependencies.create(connection)
    if "ix_jobs_dependency_held" not in {index["name"] for index in inspector.get_indexes("jobs")}:
        connection.execute(text(DEPENDENCY_INDEX))


KEY_INDEXES: Final = {
    "ix_jobs_key_held": "CREATE INDEX ix_jobs_key_held ON jobs "
    "(held_key, owner_id, created_at, id)",
    "ix_jobs_key_live": "CREATE INDEX ix_jobs_key_live ON jobs (live_key, owner_id)",
}
"""A key's held jobs in release order (`held_key` is NULL but while its key holds a job), and
its live jobs, counted (`live_key` is NULL but while a job takes one of its key's places). Not
declared on `jobs` for the reason OWNER_CLAIM_INDEX is not."""


def _concurrency_keys_v14(connection: Connection) -> None:
    """Concurrency keys (docs/protocol.md, "Concurrency keys"): the keys' table, and each
    job's key, limit and whether its key holds it; every existing job has no key."""
    inspector = inspect(connection)
    present = {c["name"] for c in inspector.get_columns("jobs")}
    for column, kind in (
        ("concurrency_key", "VARCHAR(128)"),
        ("concurrency_limit", "INTEGER"),
        ("key_held", "BOOLEAN NOT NULL DEFAULT false"),
        ("held_key", "VARCHAR(128)"),
        ("live_key", "VARCHAR(128)"),
    ):
        if column not in present:
            if connection.dialect.name == "postgresql" and kind.startswith("VARCHAR"):
                kind += ' COLLATE "C"'
            connection.execute(text(f"ALTER TABLE jobs ADD COLUMN {column} {kind}"))
    if "concurrency_keys" not in inspector.get_table_names():
        concurrency_keys.create(connection)
    indexes = {index["name"] for index in inspector.get_indexes("jobs")}
    for name, statement in KEY_INDEXES.items():
        if name not in indexes:
            connection.execute(text(statement))


PRIORITY_CLAIM_INDEX: Final = (
    "CREATE INDEX ix_jobs_priority_claim ON jobs "
    "(endpoint_id, claimable_rank, claimable_owner_id, claimable_at, created_at, id)"
)
"""Claims by priority, owners taking turns within one (`scheduling/fairness.py`): the next rank
with waiting jobs and its first owner, the next owner of a rank, and an owner's oldest
claimable jobs of a rank, one dive or range each. `claimable_rank` is `9 - priority` while the
job is claimable, NULL otherwise, so the dives pass over no job that does not wait. Not
declared on `jobs` for the reason OWNER_CLAIM_INDEX is not."""


def _priorities_v15(connection: Connection) -> None:
    """Priorities (docs/protocol.md, "Priorities"): each job's priority (5, the default, for
    every existing job) and its claim rank, and the claim index by rank in place of the one by
    owner alone (migration 8's)."""
    inspector = inspect(connection)
    present = {c["name"] for c in inspector.get_columns("jobs")}
    if "priority" not in present:
        connection.execute(text("ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 5"))
    if "claimable_rank" not in present:
        connection.execute(text("ALTER TABLE jobs ADD COLUMN claimable_rank INTEGER"))
    connection.execute(
        text(
            "UPDATE jobs SET claimable_rank = 9 - priority "
            "WHERE claimable_owner_id IS NOT NULL AND claimable_rank IS NULL"
        )
    )
    indexes = {index["name"] for index in inspector.get_indexes("jobs")}
    if "ix_jobs_priority_claim" not in indexes:
        connection.execute(text(PRIORITY_CLAIM_INDEX))
    if "ix_jobs_owner_claim" in indexes:
        # In SQL, not as an `Index` on `jobs`: that would declare it there for migration 4.
        on_table = " ON jobs" if connection.dialect.name == "mysql" else ""
        connection.execute(text(f"DROP INDEX ix_jobs_owner_claim{on_table}"))


SCHEDULE_INDEXES: Final = {
    "ix_schedules_due": "CREATE INDEX ix_schedules_due ON schedules (paused, next_at, id)",
    "ix_schedules_server": "CREATE INDEX ix_schedules_server ON schedules "
    "(server_id, created_at, id)",
    "ix_schedules_owner": "CREATE INDEX ix_schedules_owner ON schedules (owner_id, created_at, id)",
}
"""The indexes of `schedules` as SQL (the migration's: it never makes an `Index` object)."""

_SELECTOR_COLUMNS: Final = {
    "selector": "TEXT",
    "max_parallel": "INTEGER",
    "stop_on_failure": "BOOLEAN NOT NULL DEFAULT false",
    "last_group_id": "VARCHAR(64)",
    "unmatched": "BIGINT NOT NULL DEFAULT 0",
}


def _selector_schedules_v16(connection: Connection) -> None:
    """Selector schedules (docs/protocol.md, "Schedules"): `server_id` may be NULL, and the
    selector, its group's options, the last group and the unmatched count (every existing
    schedule names a server, has made no group, and matched every time).

    SQLite cannot drop a NOT NULL constraint: its table is built again (a new table from the
    current columns, every row copied, the old table dropped with its indexes, the new one
    renamed, the indexes made again), all inside the migration's transaction."""
    inspector = inspect(connection)
    columns = {c["name"]: c for c in inspector.get_columns("schedules")}
    dialect = connection.dialect.name
    if dialect == "sqlite":
        if columns["server_id"]["nullable"] and _SELECTOR_COLUMNS.keys() <= columns.keys():
            _ensure_indexes(connection, "schedules", SCHEDULE_INDEXES)
            return
        rebuilt = Table("schedules_v16", MetaData(), *_schedule_columns())
        rebuilt.create(connection)
        kept = ", ".join(name for name in columns if name in rebuilt.columns)
        connection.execute(text(f"INSERT INTO schedules_v16 ({kept}) SELECT {kept} FROM schedules"))
        connection.execute(text("DROP TABLE schedules"))
        connection.execute(text("ALTER TABLE schedules_v16 RENAME TO schedules"))
        _ensure_indexes(connection, "schedules", SCHEDULE_INDEXES)
        return
    for name, kind in _SELECTOR_COLUMNS.items():
        if name not in columns:
            if dialect == "postgresql" and kind.startswith("VARCHAR"):
                kind += ' COLLATE "C"'
            connection.execute(text(f"ALTER TABLE schedules ADD COLUMN {name} {kind}"))
    if not columns["server_id"]["nullable"]:
        if dialect == "mysql":
            connection.execute(text("ALTER TABLE schedules MODIFY server_id VARCHAR(64) NULL"))
        else:
            connection.execute(text("ALTER TABLE schedules ALTER COLUMN server_id DROP NOT NULL"))
    _ensure_indexes(connection, "schedules", SCHEDULE_INDEXES)


def _ensure_indexes(connection: Connection, table: str, statements: dict[str, str]) -> None:
    present = {index["name"] for index in inspect(connection).get_indexes(table)}
    for name, statement in statements.items():
        if name not in present:
            connection.execute(text(statement))


job_wakeups = Table(
    "job_wakeups",
    MetaData(),  # not `metadata`: made by migration 17, on MySQL only
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("origin", SHORT, nullable=False),
    Column("job_id", ID, nullable=False),
    Column("endpoint_id", ID),
    **TABLE_OPTIONS,
)
"""Committed job changes, announced to the other platform processes on one MySQL database
(`store/mysql_wakeups.py`): appended after each commit, read past the last id every 0.25 s by
each process, deleted after a minute."""


def _mysql_wakeups_v17(connection: Connection) -> None:
    """Wake-ups across the platform processes on one MySQL database: the `job_wakeups` table
    (nothing on the other stores: SQLite has one platform process, PostgreSQL has NOTIFY)."""
    if connection.dialect.name != "mysql":
        return
    if "job_wakeups" not in inspect(connection).get_table_names():
        job_wakeups.create(connection)


PARTIAL_INDEXES: Final = {
    "ix_jobs_priority_claim": (
        "(endpoint_id, claimable_rank, claimable_owner_id, claimable_at, created_at, id)",
        "claimable_rank IS NOT NULL",
    ),
    "ix_jobs_claim": ("(endpoint_id, claimable_at, created_at, id)", "claimable_at IS NOT NULL"),
    "ix_jobs_active": ("(endpoint_id, state)", "state IN ('accepted', 'running')"),
    "ix_jobs_due": ("(deadline_at, id)", "deadline_at IS NOT NULL"),
    "ix_jobs_finished": ("(terminal_at, id)", "terminal_at IS NOT NULL"),
    "ix_jobs_dependency_held": ("(dependency_held, id)", "dependency_held IS NOT NULL"),
    "ix_jobs_key_held": ("(held_key, owner_id, created_at, id)", "held_key IS NOT NULL"),
    "ix_jobs_key_live": ("(live_key, owner_id)", "live_key IS NOT NULL"),
    "ix_jobs_held": ("(held_group_id, created_at, id)", "held_group_id IS NOT NULL"),
    "ix_jobs_group_listing": ("(group_id, created_at, id)", "group_id IS NOT NULL"),
    "ix_jobs_group_state": ("(group_id, state, created_at, id)", "group_id IS NOT NULL"),
}
"""The indexes of `jobs` whose rows most jobs leave (the claim's, the deadlines', the holds')
or never have (groups, keys, dependencies), and what a row must hold to be in each: the
columns and order of migrations 1 to 15's, only the rows every query of the index asks for."""


def _postgres_partial_indexes_v18(connection: Connection) -> None:
    """On PostgreSQL, PARTIAL_INDEXES in place of their full forms. Its B-tree sorts NULLs
    last, so a claim's range past the last waiting rank (`claimable_rank > :rank`) walked an
    entry of every job the endpoint ever ran: claims slowed with the endpoint's history
    (2,200 index rows read a job at 12,000 jobs, `bench/peer_bench.py`). And an update that
    changes an indexed column writes the row's entry anew in every index, not only those whose
    columns changed (MySQL and SQLite sort NULLs first and touch only the changed indexes):
    a partial index takes no entry for a row outside it."""
    if connection.dialect.name != "postgresql":
        return
    for name, (columns, where) in PARTIAL_INDEXES.items():
        connection.execute(text(f"DROP INDEX IF EXISTS {name}"))
        connection.execute(text(f"CREATE INDEX {name} ON jobs {columns} WHERE {where}"))


MIGRATIONS: Final[Sequence[Callable[[Connection], None]]] = (
    _create_v1,
    _idempotency_keys_v2,
    _web_sessions_v3,
    _scale_v4,
    _access_v5,
    _kinds_v6,
    _owners_v7,
    _owner_turns_v8,
    _labels_v9,
    _schedules_v10,
    _groups_v11,
    _retention_v12,
    _dependencies_v13,
    _concurrency_keys_v14,
    _priorities_v15,
    _selector_schedules_v16,
    _mysql_wakeups_v17,
    _postgres_partial_indexes_v18,
)
"""Migration n (1-based) brings the schema from version n-1 to n; never edit a shipped one.

The first three create tables from their current definitions, so a later migration must
accept finding its change already made on a store created after it was written. Migrations 4
and 6 create every index declared on `jobs`: an index over a column added later is made by its
own migration and not declared there (OWNER_CLAIM_INDEX)."""

SCHEMA_VERSION: Final = len(MIGRATIONS)
