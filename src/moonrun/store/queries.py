"""The SQL both SQL stores run: written once as text, rendered for SQLite or MySQL at open.

Placeholders are written `:name` (SQLite's named style) and rendered as `%(name)s` for
PyMySQL. `@index` pins the index a query must use (`INDEXED BY` in SQLite, `FORCE INDEX` in
MySQL), so no plan depends on what `ANALYZE` finds: with a million finished jobs, statistics
can make a planner prefer a full scan to an index it judges unselective. Column lists come
from the one schema (`store/schema.py`), so text and tables cannot drift apart.
"""

from __future__ import annotations

import functools
import re
from typing import Final, Literal

from moonrun.store.schema import endpoints, job_groups, jobs, schedules, servers, sessions, users

Dialect = Literal["sqlite", "mysql", "postgresql"]

JOB_COLUMNS: Final = tuple(column.name for column in jobs.columns)
ENDPOINT_COLUMNS: Final = tuple(column.name for column in endpoints.columns)
SESSION_COLUMNS: Final = tuple(column.name for column in sessions.columns)
USER_COLUMNS: Final = tuple(column.name for column in users.columns)
SERVER_COLUMNS: Final = tuple(column.name for column in servers.columns)
GROUP_COLUMNS: Final = tuple(column.name for column in job_groups.columns)
SCHEDULE_COLUMNS: Final = tuple(column.name for column in schedules.columns)

COUNT_SHARDS: Final = 16
"""MySQL spreads the per-state job counts over this many rows, so that concurrent writers on
different connections rarely wait for one another's counter row (SQLite has one writer and
uses shard 0 only)."""


def _columns(table: str, names: tuple[str, ...]) -> str:
    return ", ".join(f"{table}.{name}" for name in names)


JOB: Final = _columns("jobs", JOB_COLUMNS)
_ENDPOINT: Final = _columns("endpoints", ENDPOINT_COLUMNS)
_SESSION: Final = _columns("sessions", SESSION_COLUMNS)
_USER: Final = _columns("users", USER_COLUMNS)
_SERVER: Final = _columns("servers", SERVER_COLUMNS)
_GROUP: Final = _columns("job_groups", GROUP_COLUMNS)
_SCHEDULE: Final = _columns("schedules", SCHEDULE_COLUMNS)

_AFTER: Final = (
    " AND created_at <= :after_created AND (created_at < :after_created OR id < :after_id)"
)
"""Strictly after the cursor (created_at, id) in newest-first order, as one index range."""

_LISTINGS: Final = {
    # (by server, by state) -> the index whose order is the listing's order
    (True, True): ("ix_jobs_server_state_listing", "server_id = :server_id AND state = :state"),
    (True, False): ("ix_jobs_server_listing", "server_id = :server_id"),
    (False, True): ("ix_jobs_state_listing", "state = :state"),
    (False, False): ("ix_jobs_listing", "1 = 1"),
}
_KIND_LISTINGS: Final = {
    # by server -> the index of a listing by kind (a state is then checked row by row)
    True: ("ix_jobs_server_kind_listing", "server_id = :server_id AND kind = :kind"),
    False: ("ix_jobs_kind_listing", "kind = :kind"),
}


class Queries:
    """Every statement of the SQL stores, rendered for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        render = self.render
        self.get_job = render(f"SELECT {JOB} FROM jobs WHERE id = :id")
        self.insert_job = render(
            f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) "
            f"VALUES ({', '.join(':' + name for name in JOB_COLUMNS)})"
        )
        self.claimable = render(
            f"SELECT {JOB} FROM jobs @ix_jobs_claim "
            "WHERE endpoint_id = :endpoint_id AND claimable_at <= :now "
            "ORDER BY claimable_at, created_at, id LIMIT :limit"
        )
        # Claims take the most urgent rank first and owners take turns within it
        # (scheduling/fairness.py): the next rank with waiting jobs, with its first owner, is
        # one dive into ix_jobs_priority_claim, the next owner of a rank another, and an
        # owner's oldest claimable jobs of a rank one range of it, however many jobs other
        # ranks and owners (or this one) have waiting. A rank of -1 asks for the first rank.
        self.next_claim_rank = render(
            "SELECT claimable_rank, claimable_owner_id FROM jobs @ix_jobs_priority_claim "
            "WHERE endpoint_id = :endpoint_id AND claimable_rank > :rank "
            "ORDER BY claimable_rank, claimable_owner_id LIMIT 1"
        )
        self.next_claim_owner = render(
            "SELECT claimable_owner_id FROM jobs @ix_jobs_priority_claim "
            "WHERE endpoint_id = :endpoint_id AND claimable_rank = :rank "
            "AND claimable_owner_id > :after ORDER BY claimable_owner_id LIMIT 1"
        )
        self.next_claimable = render(
            "SELECT MIN(claimable_at) FROM jobs @ix_jobs_claim WHERE endpoint_id = :endpoint_id"
        )
        self.due = render(
            f"SELECT {JOB} FROM jobs @ix_jobs_due WHERE deadline_at <= :now "
            "ORDER BY deadline_at, id LIMIT :limit"
        )
        self.finished = render(
            f"SELECT {JOB} FROM jobs @ix_jobs_finished WHERE terminal_at <= :ended_by "
            "ORDER BY terminal_at, id LIMIT :limit"
        )
        self.active = render(
            f"SELECT {JOB} FROM jobs @ix_jobs_active "
            "WHERE endpoint_id = :endpoint_id AND state IN ('accepted', 'running')"
        )
        self.active_deadlines = render(
            "SELECT id, deadline_at FROM jobs @ix_jobs_active "
            "WHERE endpoint_id = :endpoint_id AND state IN ('accepted', 'running')"
        )
        self.counts = render("SELECT state, SUM(n) FROM job_counts GROUP BY state")
        if dialect == "mysql":
            self.count_delta = render(
                "INSERT INTO job_counts (state, shard, n) VALUES (:state, :shard, :delta) "
                "ON DUPLICATE KEY UPDATE n = n + VALUES(n)"
            )
        else:
            self.count_delta = render(
                "INSERT INTO job_counts (state, shard, n) VALUES (:state, :shard, :delta) "
                "ON CONFLICT (state, shard) DO UPDATE SET n = job_counts.n + excluded.n"
            )
        self.remember_idempotent = render(
            "INSERT INTO idempotency_keys (user_id, idempotency_key, fingerprint, job_id, "
            "job_ids_json, created_at) VALUES (:user_id, :idempotency_key, :fingerprint, "
            ":job_id, :job_ids_json, :created_at)"
        )
        self.idempotent = render(
            "SELECT fingerprint, job_id, job_ids_json, created_at FROM idempotency_keys "
            "WHERE user_id = :user_id AND idempotency_key = :idempotency_key"
        )

        self.insert_endpoint = self._insert("endpoints", ENDPOINT_COLUMNS)
        self.get_endpoint = render(f"SELECT {_ENDPOINT} FROM endpoints WHERE id = :id")
        self.endpoint_by_join_token = render(
            f"SELECT {_ENDPOINT} FROM endpoints WHERE join_token_hash = :token_hash"
        )
        self.replace_endpoint = render(
            "UPDATE endpoints SET "
            + ", ".join(f"{name} = :{name}" for name in ENDPOINT_COLUMNS if name != "id")
            + " WHERE id = :id AND version = :expected_version"
        )
        self.list_endpoints = render(f"SELECT {_ENDPOINT} FROM endpoints ORDER BY created_at, id")
        self.servers_on_endpoint = render(
            "SELECT COUNT(*) FROM servers WHERE endpoint_id = :endpoint_id"
        )
        self.delete_endpoint = render("DELETE FROM endpoints WHERE id = :endpoint_id")
        self.delete_sessions = render("DELETE FROM sessions WHERE endpoint_id = :endpoint_id")
        self.delete_advertisement = render(
            "DELETE FROM endpoint_kinds WHERE endpoint_id = :endpoint_id"
        )
        # An upsert, so that two registrations of one endpoint at once (two platform
        # processes) cannot both find no row and then collide on the key.
        upsert = (
            "ON DUPLICATE KEY UPDATE kinds_json = VALUES(kinds_json), "
            "advertised_at = VALUES(advertised_at)"
            if dialect == "mysql"
            else "ON CONFLICT (endpoint_id) DO UPDATE SET kinds_json = excluded.kinds_json, "
            "advertised_at = excluded.advertised_at"
        )
        self.upsert_advertisement = render(
            "INSERT INTO endpoint_kinds (endpoint_id, kinds_json, advertised_at) "
            f"VALUES (:endpoint_id, :kinds_json, :advertised_at) {upsert}"
        )
        self.get_advertisement = render(
            "SELECT endpoint_id, kinds_json, advertised_at FROM endpoint_kinds "
            "WHERE endpoint_id = :endpoint_id"
        )

        self.insert_session = self._insert("sessions", SESSION_COLUMNS)
        self.get_session = render(f"SELECT {_SESSION} FROM sessions WHERE id = :id")
        self.session_with_endpoint = render(
            f"SELECT {_SESSION}, {_ENDPOINT} FROM sessions @pk_sessions "
            "JOIN endpoints @pk_endpoints ON endpoints.id = sessions.endpoint_id "
            "WHERE sessions.id = :id"
        )
        self.extend_session = render(
            "UPDATE sessions SET last_seen_at = :seen_at, expires_at = :expires_at "
            "WHERE id = :id AND expires_at < :expires_at"
        )
        self.record_beat = render(
            "UPDATE sessions SET last_seen_at = :seen_at WHERE id = :id AND last_seen_at < :seen_at"
        )
        self.latest_session = render(
            f"SELECT {_SESSION} FROM sessions WHERE endpoint_id = :endpoint_id "
            "ORDER BY generation DESC, last_seen_at DESC LIMIT 1"
        )
        self.mark_session_reconciled = render(
            "UPDATE sessions SET reconciled_at = :at WHERE id = :id"
        )

        self.insert_user = self._insert("users", USER_COLUMNS)
        self.get_user = render(f"SELECT {_USER} FROM users WHERE id = :id")
        self.user_by_name = render(f"SELECT {_USER} FROM users WHERE name = :name")
        self.list_users = render(f"SELECT {_USER} FROM users ORDER BY created_at, id")
        self.insert_api_token = render(
            "INSERT INTO api_tokens (token_hash, user_id, created_at) "
            "VALUES (:token_hash, :user_id, :created_at)"
        )
        self.user_by_api_token = render(
            f"SELECT {_USER} FROM users @pk_users "
            "JOIN api_tokens @pk_api_tokens ON api_tokens.user_id = users.id "
            "WHERE api_tokens.token_hash = :token_hash"
        )
        self.delete_api_tokens = render("DELETE FROM api_tokens WHERE user_id = :user_id")
        self.set_password_hash = render(
            "UPDATE users SET password_hash = :password_hash WHERE id = :id"
        )
        self.set_user_disabled = render("UPDATE users SET disabled = :disabled WHERE id = :id")
        self.insert_web_session = render(
            "INSERT INTO web_sessions (token_hash, user_id, created_at, expires_at) "
            "VALUES (:token_hash, :user_id, :created_at, :expires_at)"
        )
        self.web_session_user = render(
            f"SELECT {_USER} FROM users @pk_users "
            "JOIN web_sessions @pk_web_sessions ON web_sessions.user_id = users.id "
            "WHERE web_sessions.token_hash = :token_hash AND web_sessions.expires_at > :now"
        )
        self.delete_web_session = render("DELETE FROM web_sessions WHERE token_hash = :token_hash")

        self.insert_server = self._insert("servers", SERVER_COLUMNS)
        self.job_and_server = render(
            f"SELECT {JOB}, {_SERVER}, server_admins.user_id FROM jobs "
            "LEFT JOIN servers ON servers.id = jobs.server_id "
            "LEFT JOIN server_admins ON server_admins.server_id = servers.id "
            "WHERE jobs.id = :id ORDER BY server_admins.position"
        )
        self.get_server_with_admins = render(
            f"SELECT {_SERVER}, server_admins.user_id FROM servers "
            "LEFT JOIN server_admins ON server_admins.server_id = servers.id "
            "WHERE servers.id = :id ORDER BY server_admins.position"
        )
        self.replace_server = render(
            "UPDATE servers SET "
            + ", ".join(f"{name} = :{name}" for name in SERVER_COLUMNS if name != "id")
            + " WHERE id = :id AND version = :expected_version"
        )
        self.list_servers = render(f"SELECT {_SERVER} FROM servers ORDER BY created_at, id")
        self.servers_of_user = render(
            f"SELECT {_SERVER} FROM servers WHERE owner_id = :user_id OR id IN "
            "(SELECT server_id FROM server_admins WHERE user_id = :user_id) "
            "ORDER BY created_at, id"
        )
        self.delete_admins = render("DELETE FROM server_admins WHERE server_id = :server_id")
        self.live_jobs_of_server = render(
            "SELECT COUNT(*) FROM jobs WHERE server_id = :server_id "
            "AND state NOT IN ('succeeded', 'failed', 'cancelled')"
        )
        self.delete_server = render("DELETE FROM servers WHERE id = :server_id")
        self.insert_admin = render(
            "INSERT INTO server_admins (server_id, user_id, position) "
            "VALUES (:server_id, :user_id, :position)"
        )
        self.insert_group = self._insert("job_groups", GROUP_COLUMNS)
        self.get_group = render(f"SELECT {_GROUP} FROM job_groups WHERE id = :id")
        self.groups_of = render(
            f"SELECT {_GROUP} FROM job_groups WHERE creator_id = :creator_id "
            "ORDER BY created_at DESC, id DESC LIMIT :limit"
        )
        # Releases of one group take turns on its row (SQLite has one writer).
        self.lock_group = render(
            "SELECT id FROM job_groups WHERE id = :id"
            + (" FOR UPDATE" if dialect != "sqlite" else "")
        )
        self.group_counts = render(
            "SELECT state, COUNT(*) FROM jobs @ix_jobs_group_state "
            "WHERE group_id = :group_id GROUP BY state"
        )
        self.group_held_count = render(
            "SELECT COUNT(*) FROM jobs @ix_jobs_held WHERE held_group_id = :group_id"
        )
        self.group_held_locked = render(
            f"SELECT {JOB} FROM jobs @ix_jobs_held WHERE held_group_id = :group_id "
            "ORDER BY created_at, id LIMIT :limit" + (" FOR UPDATE" if dialect != "sqlite" else "")
        )
        self.first_held_group = render(
            "SELECT held_group_id FROM jobs @ix_jobs_held WHERE held_group_id IS NOT NULL "
            "ORDER BY held_group_id LIMIT 1"
        )
        self.next_held_group = render(
            "SELECT held_group_id FROM jobs @ix_jobs_held WHERE held_group_id > :after "
            "ORDER BY held_group_id LIMIT 1"
        )
        # Releases of one owner's key take turns on its row, made by the first (SQLite has
        # one writer); the upsert locks the row on MySQL and PostgreSQL, the read again.
        self.declare_key = render(
            "INSERT INTO concurrency_keys (owner_id, concurrency_key, concurrency_limit) "
            "VALUES (:owner_id, :key, :limit) "
            + (
                "ON DUPLICATE KEY UPDATE "
                if dialect == "mysql"
                else "ON CONFLICT (owner_id, concurrency_key) DO UPDATE SET "
            )
            + "concurrency_limit = CASE WHEN :declare THEN :limit "
            "ELSE concurrency_keys.concurrency_limit END"
        )
        self.lock_key = render(
            "SELECT concurrency_limit FROM concurrency_keys "
            "WHERE owner_id = :owner_id AND concurrency_key = :key"
            + (" FOR UPDATE" if dialect != "sqlite" else "")
        )
        self.key_live_count = render(
            "SELECT COUNT(*) FROM jobs @ix_jobs_key_live WHERE live_key = :key "
            "AND owner_id = :owner_id"
        )
        self.key_held_count = render(
            "SELECT COUNT(*) FROM jobs @ix_jobs_key_held WHERE held_key = :key "
            "AND owner_id = :owner_id"
        )
        self.key_held_locked = render(
            f"SELECT {JOB} FROM jobs @ix_jobs_key_held WHERE held_key = :key "
            "AND owner_id = :owner_id ORDER BY created_at, id LIMIT :limit"
            + (" FOR UPDATE" if dialect != "sqlite" else "")
        )
        self.first_held_key = render(
            "SELECT held_key, owner_id FROM jobs @ix_jobs_key_held WHERE held_key IS NOT NULL "
            "ORDER BY held_key, owner_id LIMIT 1"
        )
        if dialect == "postgresql":
            # A row comparison is one range of the index to PostgreSQL; the OR below is two
            # bitmap scans and a sort there (tests/unit/store/test_query_plans_postgres.py).
            # `IS NOT NULL` says it to the planner: ix_jobs_key_held holds only held jobs there.
            self.next_held_key = render(
                "SELECT held_key, owner_id FROM jobs WHERE held_key IS NOT NULL "
                "AND (held_key, owner_id) > (:key, :owner_id) ORDER BY held_key, owner_id LIMIT 1"
            )
        else:
            self.next_held_key = render(
                "SELECT held_key, owner_id FROM jobs @ix_jobs_key_held WHERE held_key >= :key "
                "AND (held_key > :key OR owner_id > :owner_id) ORDER BY held_key, owner_id LIMIT 1"
            )
        self.insert_dependency = render(
            "INSERT INTO job_dependencies (on_id, job_id) VALUES (:on_id, :job_id)"
        )
        self.dependency_held = render(
            f"SELECT {JOB} FROM jobs @ix_jobs_dependency_held "
            "WHERE dependency_held = 1 AND id > :after ORDER BY id LIMIT :limit"
        )
        self.delete_schedules_of_server = render(
            "DELETE FROM schedules WHERE server_id = :server_id"
        )
        self.insert_schedule = self._insert("schedules", SCHEDULE_COLUMNS)
        self.get_schedule = render(f"SELECT {_SCHEDULE} FROM schedules WHERE id = :id")
        self.replace_schedule = render(
            "UPDATE schedules SET "
            + ", ".join(f"{name} = :{name}" for name in SCHEDULE_COLUMNS if name != "id")
            + " WHERE id = :id AND version = :expected_version"
        )
        self.delete_schedule = render("DELETE FROM schedules WHERE id = :id")
        self.list_schedules = render(f"SELECT {_SCHEDULE} FROM schedules ORDER BY created_at, id")
        self.schedules_of_server = render(
            f"SELECT {_SCHEDULE} FROM schedules @ix_schedules_server "
            "WHERE server_id = :server_id ORDER BY created_at, id"
        )
        self.due_schedules = render(
            f"SELECT {_SCHEDULE} FROM schedules @ix_schedules_due "
            "WHERE paused = :paused AND next_at <= :now ORDER BY next_at, id LIMIT :limit"
        )
        self.selector_schedules = render(
            f"SELECT {_SCHEDULE} FROM schedules @ix_schedules_owner "
            "WHERE owner_id = :owner_id AND selector IS NOT NULL ORDER BY created_at, id"
        )
        self.job_exists = render("SELECT COUNT(*) FROM jobs WHERE id = :id")
        self.group_exists = render("SELECT COUNT(*) FROM job_groups WHERE id = :id")
        self.schema_version = render("SELECT version FROM schema_version")

    def render(self, text: str) -> str:
        """`text` in this dialect: placeholders and index pins (`@ix_name` for an index,
        `@pk_table` for a table's primary key)."""
        if self.dialect in ("mysql", "postgresql"):
            text = text.replace("%", "%%")
            text = re.sub(r"(?<![:\w]):([a-z_][a-z0-9_]*)", r"%(\1)s", text)
        if self.dialect == "postgresql":
            # PostgreSQL takes no index hints: its plans are pinned by the indexes alone
            # (tests/unit/store/test_query_plans.py checks them on skewed statistics).
            return re.sub(r" @(pk|ix)_\w+", "", text)
        if self.dialect == "mysql":
            text = re.sub(r"@pk_(\w+)", "FORCE INDEX (PRIMARY)", text)
            return re.sub(r"@(ix_\w+)", r"FORCE INDEX (\1)", text)
        # SQLite names a primary key's index sqlite_autoindex_<table>_1: the schema declares
        # the key before any unique column (tests/unit/store/test_query_plans.py checks the plans).
        text = re.sub(r"@pk_(\w+)", r"INDEXED BY sqlite_autoindex_\1_1", text)
        return re.sub(r"@(ix_\w+)", r"INDEXED BY \1", text)

    def _union_all(self, parts: list[str]) -> str:
        """The rows of every part, each part with its own ORDER BY and LIMIT (SQLite takes
        those only in a subquery)."""
        if len(parts) == 1:
            return parts[0]
        if self.dialect in ("mysql", "postgresql"):
            return " UNION ALL ".join(f"({part})" for part in parts)
        return " UNION ALL ".join(f"SELECT * FROM ({part})" for part in parts)

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def claimable_of_owners(self, count: int, locked: bool = True) -> str:
        """The oldest claimable jobs of one rank (`:rank`) of `count` owners of an endpoint
        (`:owner<n>`, at most `:limit<n>` each) in one statement, locked (MySQL, skipping rows
        another transaction holds) until the write ends; not locked if not `locked` (a read
        outside any write, whose jobs are then swapped one by one: PostgresStore)."""
        if self.dialect == "postgresql":
            lock = " FOR UPDATE SKIP LOCKED" if locked else ""
            # PostgreSQL locks no rows of a UNION: each owner's part is a LATERAL subquery.
            owners = ", ".join(f"(:owner{n}, CAST(:limit{n} AS BIGINT))" for n in range(count))
            return self.render(
                f"SELECT part.* FROM (VALUES {owners}) AS wants(owner, n) CROSS JOIN LATERAL "
                f"(SELECT {JOB} FROM jobs WHERE endpoint_id = :endpoint_id "
                "AND claimable_rank = :rank "
                "AND claimable_owner_id = wants.owner AND claimable_at <= :now "
                f"ORDER BY claimable_at, created_at, id LIMIT wants.n{lock}) AS part"
            )
        lock = " FOR UPDATE SKIP LOCKED" if self.dialect != "sqlite" and locked else ""
        parts = [
            f"SELECT {JOB} FROM jobs @ix_jobs_priority_claim "
            "WHERE endpoint_id = :endpoint_id AND claimable_rank = :rank "
            f"AND claimable_owner_id = :owner{n} "
            f"AND claimable_at <= :now ORDER BY claimable_at, created_at, id LIMIT :limit{n}{lock}"
            for n in range(count)
        ]
        return self.render(self._union_all(parts))

    def _insert(self, table: str, names: tuple[str, ...]) -> str:
        return self.render(
            f"INSERT INTO {table} ({', '.join(names)}) "
            f"VALUES ({', '.join(':' + name for name in names)})"
        )

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one Queries per store, a few shapes each
    def update_job(self, names: tuple[str, ...]) -> str:
        """Set only `names` (the columns that changed), under the version compare-and-swap."""
        assignments = ", ".join(f"{name} = :{name}" for name in names)
        return self.render(
            f"UPDATE jobs SET {assignments} WHERE id = :id AND version = :expected_version"
        )

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def get_jobs(self, count: int) -> str:
        marks = ", ".join(f":id{n}" for n in range(count))
        return self.render(f"SELECT {JOB} FROM jobs WHERE id IN ({marks})")

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def waiters(self, count: int) -> str:
        """The jobs that named any of `count` ids (`:on<n>`) as a dependency: ranges of the
        key of job_dependencies."""
        marks = ", ".join(f":on{n}" for n in range(count))
        return self.render(
            f"SELECT job_id FROM job_dependencies @pk_job_dependencies WHERE on_id IN ({marks})"
        )

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def delete_waiters_of(self, count: int) -> str:
        """Forget who waited on `count` deleted jobs (`:on<n>`): ranges of the key."""
        marks = ", ".join(f":on{n}" for n in range(count))
        return self.render(f"DELETE FROM job_dependencies WHERE on_id IN ({marks})")

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def get_jobs_locked(self, count: int) -> str:
        """`get_jobs` inside a write transaction, locking the rows (MySQL) until it ends."""
        return self.get_jobs(count) + (" FOR UPDATE" if self.dialect != "sqlite" else "")

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def delete_jobs(self, count: int) -> str:
        marks = ", ".join(f":id{n}" for n in range(count))
        return self.render(f"DELETE FROM jobs WHERE id IN ({marks})")

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def delete_idempotency_of(self, count: int) -> str:
        """The idempotency records whose request made these jobs first (by its job index)."""
        marks = ", ".join(f":id{n}" for n in range(count))
        return self.render(f"DELETE FROM idempotency_keys WHERE job_id IN ({marks})")

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def admins_of(self, count: int) -> str:
        marks = ", ".join(f":id{n}" for n in range(count))
        return self.render(
            f"SELECT server_id, user_id FROM server_admins WHERE server_id IN ({marks}) "
            "ORDER BY server_id, position"
        )

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def list_jobs(
        self,
        by_server: bool,
        by_state: bool,
        after: bool,
        by_kind: bool = False,
        by_prefix: bool = False,
        by_group: bool = False,
    ) -> str:
        """Newest first (created_at, id descending), walking the listing's own index; by id
        prefix, the primary key's range of ids with that prefix (few rows, sorted after); by
        group, the group's own listing (a kind or prefix then checked row by row)."""
        if by_group:
            index = "ix_jobs_group_state" if by_state else "ix_jobs_group_listing"
            where = "group_id = :group_id"
            where += " AND state = :state" if by_state else ""
            where += " AND kind = :kind" if by_kind else ""
            where += " AND id >= :id_low AND id < :id_high" if by_prefix else ""
        elif by_prefix:
            index = "pk_jobs"
            where = "id >= :id_low AND id < :id_high"
            where += " AND server_id = :server_id" if by_server else ""
            where += " AND kind = :kind" if by_kind else ""
            where += " AND state = :state" if by_state else ""
        elif by_kind:
            index, where = _KIND_LISTINGS[by_server]
            where += " AND state = :state" if by_state else ""
        else:
            index, where = _LISTINGS[(by_server, by_state)]
        return self.render(
            f"SELECT {JOB} FROM jobs @{index} WHERE {where}{_AFTER if after else ''} "
            "ORDER BY created_at DESC, id DESC LIMIT :limit"
        )
