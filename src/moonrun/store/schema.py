"""The one SQL schema (SQLAlchemy Core) that FileStore and MySQLStore share, and its migrations.

Every time is a BIGINT of milliseconds since the epoch. Nested values of the job record are
flat columns, so each scheduling fact is plain SQL. `claimable_at` and `deadline_at` are the
record's own derived values (`Job.claimable_at`, `Job.deadline_at`), stored for the claim and
sweeper indexes.
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
)

ID = String(64)
HASH = String(64)
SHORT = String(64)

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
    Column("kind", SHORT, nullable=False),
    Column("payload_json", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("backoff_initial_s", Double, nullable=False),
    Column("backoff_multiplier", Double, nullable=False),
    Column("backoff_max_s", Double, nullable=False),
    Column("backoff_jitter", Double, nullable=False),
    Column("eligible_at", BigInteger, nullable=False),
    Column("claimable_at", BigInteger),
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
    Column("cancel_result", String(16)),
    Column("cancel_resolved_at", BigInteger),
    Column("failure_reason", String(32)),
    Column("failure_attempt", Integer),
    Column("failure_at", BigInteger),
    Column("failure_code", SHORT),
    Column("failure_message", Text),
    Column("result_attempt", Integer),
    Column("result_outcome", String(16)),
    Column("result_retryable", Boolean),
    Column("result_error_code", SHORT),
    Column("result_error_message", Text),
    Column("result_output_json", Text),
    Column("result_fingerprint", HASH),
    Column("result_at", BigInteger),
    Column("terminal_outcome", String(16)),
    Column("terminal_attempt", Integer),
    Column("terminal_at", BigInteger),
    Column("terminal_error_code", SHORT),
    Column("terminal_error_message", Text),
    Column("reconcile_outcome", String(16)),
    Column("reconcile_at", BigInteger),
    Column("reconcile_generation", BigInteger),
    Column("history_json", Text, nullable=False),
    Index("ix_jobs_claim", "endpoint_id", "claimable_at", "created_at", "id"),
    Index("ix_jobs_active", "endpoint_id", "state"),
    Index("ix_jobs_deadline", "deadline_at"),
    Index("ix_jobs_server_listing", "server_id", "created_at", "id"),
    Index("ix_jobs_listing", "created_at", "id"),
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
    **TABLE_OPTIONS,
)

sessions = Table(
    "sessions",
    metadata,
    Column("id", ID, primary_key=True),
    Column("endpoint_id", ID, nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("boot_id", String(128), nullable=False),
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
    Column("password_hash", String(255)),
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
    Column("idempotency_key", String(255), primary_key=True),
    Column("fingerprint", HASH, nullable=False),
    Column("job_id", ID, nullable=False),
    Column("created_at", BigInteger, nullable=False),
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

V1_TABLES: Final = (jobs, endpoints, sessions, users, api_tokens, servers, server_admins)
DATA_TABLES: Final = (*V1_TABLES, idempotency_keys, web_sessions)


def _create_v1(connection: Connection) -> None:
    metadata.create_all(connection, tables=list(V1_TABLES))


def _idempotency_keys_v2(connection: Connection) -> None:
    idempotency_keys.create(connection)


def _web_sessions_v3(connection: Connection) -> None:
    web_sessions.create(connection)


MIGRATIONS: Final[Sequence[Callable[[Connection], None]]] = (
    _create_v1,
    _idempotency_keys_v2,
    _web_sessions_v3,
)
"""Migration n (1-based) brings the schema from version n-1 to n; never edit a shipped one."""

SCHEMA_VERSION: Final = len(MIGRATIONS)
