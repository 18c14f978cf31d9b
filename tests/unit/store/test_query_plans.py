"""The SQL stores' hot queries walk their intended index, whatever ANALYZE finds.

With many finished jobs on one endpoint, statistics can make a planner judge an index
unselective and prefer a full scan of `jobs` (the claim's capacity check once did, after
`ANALYZE`). Every hot query pins its index (`@ix_name` in store/queries.py); these tests read
the plan the database itself chooses (SQLite's EXPLAIN QUERY PLAN, MySQL's EXPLAIN) for the
exact text the store runs (its own `Queries`), on a small but skewed store: 3,000 jobs of one
endpoint and one server (89% succeeded, 10% queued, 1% running), one queued job of another
owner on another server, and one session, user, API token and console session, before and
after gathering statistics.

A plan is written as steps (table, access, index): SEARCH is a lookup or range of the index
(SQLite SEARCH; MySQL const, eq_ref, ref, range), SCAN walks a whole table or index in order
(SQLite SCAN; MySQL index, ALL), SORT is a temporary B-tree or filesort, and MIN FROM INDEX is
MySQL's "Select tables optimized away" (a MIN read by one index dive while planning).
`PRIMARY` is the table's primary-key index in both databases.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, replace
from typing import Any, Final

import pytest

from moonrun.scheduling.groups import Group
from moonrun.scheduling.jobs import Concurrency, Job, JobState
from moonrun.scheduling.records import Endpoint, Session, User
from moonrun.store.file import FileStore
from moonrun.store.queries import Queries
from moonrun.store.sql import Cursor, SqlStore
from tests.conftest import build_factory
from tests.support.jobkit import (
    ENDPOINT,
    T0,
    accepted,
    queued_job,
    reported,
    running_job,
    send_result,
)
from tests.support.stores import StoreFactory, file_factory

Step = tuple[str, str, str | None]
"""(table, SEARCH | SCAN | SORT, index): one step of a plan."""

JOBS = 3_000
SERVER = "srv-1"
OWNER = "usr-1"
"""The owner of every job of the skewed store but one (tests/support/jobkit.py's)."""
OTHER_OWNER = "usr-2"
"""The owner of one queued job, on another server of the same endpoint."""
GROUP = "grp_1"
"""A fan-out group of a few of the skewed store's queued jobs (held but one)."""
KEY = "backup"
"""A concurrency key of a few more queued jobs (held by it but one)."""
SESSION = "ses-1"
USER = "usr-1"
API_TOKEN_HASH = "a" * 64
WEB_HASH = "w" * 64
NOW = T0 + 3_600_000
"""An hour after the first job: every queued job is claimable, every running one due."""
ANALYZED = (
    "jobs",
    "job_dependencies",
    "job_counts",
    "sessions",
    "endpoints",
    "users",
    "api_tokens",
    "web_sessions",
)
"""The tables the hot queries read (SQLite's ANALYZE takes every table)."""
MIDDLE = (T0 + JOBS // 2, f"job-{JOBS // 2:05d}")
"""A listing cursor (created_at, id) halfway through the jobs."""


def _search(index: str) -> list[Step]:
    return [("jobs", "SEARCH", index)]


def _sqlite_union_of_two(index: str) -> list[Step]:
    """SQLite's plan of `SELECT * FROM (a) UNION ALL SELECT * FROM (b)`, each part a search
    of `index` whose few rows are then read in turn."""
    return [
        ("", "COMPOUND QUERY", None),
        ("", "LEFT-MOST SUBQUERY", None),
        ("", "CO-ROUTINE (subquery-1)", None),
        *_search(index),
        ("", "SCAN (subquery-1)", None),
        ("", "UNION ALL", None),
        ("", "CO-ROUTINE (subquery-3)", None),
        *_search(index),
        ("", "SCAN (subquery-3)", None),
    ]


EXPECTED_PLANS: dict[str, list[Step]] = {
    "get_job": _search("PRIMARY"),
    "claimable": _search("ix_jobs_claim"),
    "next_claimable": _search("ix_jobs_claim"),
    # The most urgent priority first, owners taking turns within it: one dive for the next
    # rank with waiting jobs (and its first owner), one per owner of a rank, then one range of
    # each owner's claimable jobs of the rank, for the owner with thousands waiting as for the
    # one with a single job, in one statement.
    "next_claim_rank": _search("ix_jobs_priority_claim"),
    "first_claim_rank": _search("ix_jobs_priority_claim"),
    "next_claim_owner": _search("ix_jobs_priority_claim"),
    "claimable_of_owners": _search("ix_jobs_priority_claim"),
    "claimable_of_owners, two owners": _sqlite_union_of_two("ix_jobs_priority_claim"),
    "due": _search("ix_jobs_due"),
    # Retention: the finished jobs that ended longest ago, then each batch deleted by its ids,
    # their idempotency records by the index of their first job.
    "finished": _search("ix_jobs_finished"),
    "delete_jobs": _search("PRIMARY"),
    "delete_idempotency_of": [("idempotency_keys", "SEARCH", "ix_idempotency_keys_job")],
    "active": _search("ix_jobs_active"),
    "active_deadlines": _search("ix_jobs_active"),
    "session_with_endpoint": [
        ("sessions", "SEARCH", "PRIMARY"),
        ("endpoints", "SEARCH", "PRIMARY"),
    ],
    "counts": [("job_counts", "SCAN", "PRIMARY")],
    # Not on the scheduling path, but every user API request and console page authenticates.
    "user_by_api_token": [("api_tokens", "SEARCH", "PRIMARY"), ("users", "SEARCH", "PRIMARY")],
    "web_session_user": [("web_sessions", "SEARCH", "PRIMARY"), ("users", "SEARCH", "PRIMARY")],
    # The unfiltered first page walks the listing index newest first and stops at the limit.
    "list_jobs": [("jobs", "SCAN", "ix_jobs_listing")],
    "list_jobs after": _search("ix_jobs_listing"),
    "list_jobs by state": _search("ix_jobs_state_listing"),
    "list_jobs by state after": _search("ix_jobs_state_listing"),
    "list_jobs by server": _search("ix_jobs_server_listing"),
    "list_jobs by server after": _search("ix_jobs_server_listing"),
    "list_jobs by server and state": _search("ix_jobs_server_state_listing"),
    "list_jobs by server and state after": _search("ix_jobs_server_state_listing"),
    "list_jobs by kind": _search("ix_jobs_kind_listing"),
    "list_jobs by kind and state": _search("ix_jobs_kind_listing"),
    "list_jobs by server and kind": _search("ix_jobs_server_kind_listing"),
    "list_jobs by server and kind after": _search("ix_jobs_server_kind_listing"),
    # A prefix of 7 or more characters holds few ids: their range of the primary key, sorted.
    "list_jobs by id prefix": [*_search("PRIMARY"), ("", "SORT", None)],
    "list_jobs by server and id prefix": [*_search("PRIMARY"), ("", "SORT", None)],
    # Fan-out groups: a group's jobs, counts and held jobs are ranges of its own indexes,
    # whatever other jobs the store holds; the sweeper finds groups with held jobs by dives.
    "list_jobs by group": _search("ix_jobs_group_listing"),
    "list_jobs by group after": _search("ix_jobs_group_listing"),
    "list_jobs by group and state": _search("ix_jobs_group_state"),
    "group_counts": _search("ix_jobs_group_state"),
    "group_held_count": _search("ix_jobs_held"),
    "group_held_locked": _search("ix_jobs_held"),
    "first_held_group": _search("ix_jobs_held"),
    "next_held_group": _search("ix_jobs_held"),
    # Concurrency keys: a key's live and held jobs are ranges of their own indexes, whatever
    # other jobs the store holds; the sweeper finds keys with held jobs by dives.
    "key_live_count": _search("ix_jobs_key_live"),
    "key_held_count": _search("ix_jobs_key_held"),
    "key_held_locked": _search("ix_jobs_key_held"),
    "first_held_key": _search("ix_jobs_key_held"),
    "next_held_key": _search("ix_jobs_key_held"),
    # Dependencies: a job's waiters are one range of job_dependencies' key; the sweeper walks
    # the jobs still held on theirs as one range of their index.
    "waiters": [("job_dependencies", "SEARCH", "PRIMARY")],
    "dependency_held": _search("ix_jobs_dependency_held"),
}
"""What each hot query must do, the same on SQLite and MySQL (but see MYSQL_PLANS)."""

MYSQL_PLANS: dict[str, list[Step]] = {
    # One dive into ix_jobs_claim while planning (MySQL's "Select tables optimized away"),
    # not a walk of the endpoint's whole claimable range; SQLite's plan text cannot tell the
    # two apart, MySQL's can.
    "next_claimable": [("", "MIN FROM INDEX", None)],
    # MySQL writes a UNION ALL as its parts.
    "claimable_of_owners, two owners": _search("ix_jobs_priority_claim") * 2,
}
"""Where MySQL's plan is written differently from EXPECTED_PLANS."""


def hot_queries(sql: Queries) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each hot statement the store runs, with representative parameters."""
    claim = {"endpoint_id": ENDPOINT, "now": NOW, "limit": 16}
    queries = {
        "get_job": (sql.get_job, {"id": MIDDLE[1]}),
        "claimable": (sql.claimable, claim),
        "next_claimable": (sql.next_claimable, {"endpoint_id": ENDPOINT}),
        "first_claim_rank": (sql.next_claim_rank, {"endpoint_id": ENDPOINT, "rank": -1}),
        "next_claim_rank": (sql.next_claim_rank, {"endpoint_id": ENDPOINT, "rank": 4}),
        "next_claim_owner": (
            sql.next_claim_owner,
            {"endpoint_id": ENDPOINT, "rank": 4, "after": OWNER},
        ),
        "claimable_of_owners": (
            sql.claimable_of_owners(1),
            {"endpoint_id": ENDPOINT, "rank": 4, "now": NOW, "owner0": OWNER, "limit0": 16},
        ),
        "claimable_of_owners, two owners": (
            sql.claimable_of_owners(2),
            {
                "endpoint_id": ENDPOINT,
                "rank": 4,
                "now": NOW,
                "owner0": OWNER,
                "limit0": 8,
                "owner1": OTHER_OWNER,
                "limit1": 8,
            },
        ),
        "due": (sql.due, {"now": NOW, "limit": 500}),
        "finished": (sql.finished, {"ended_by": NOW, "limit": 200}),
        "delete_jobs": (sql.delete_jobs(2), {"id0": "job-00001", "id1": "job-00002"}),
        "delete_idempotency_of": (
            sql.delete_idempotency_of(2),
            {"id0": "job-00001", "id1": "job-00002"},
        ),
        "active": (sql.active, {"endpoint_id": ENDPOINT}),
        "active_deadlines": (sql.active_deadlines, {"endpoint_id": ENDPOINT}),
        "session_with_endpoint": (sql.session_with_endpoint, {"id": SESSION}),
        "counts": (sql.counts, {}),
        "user_by_api_token": (sql.user_by_api_token, {"token_hash": API_TOKEN_HASH}),
        "web_session_user": (sql.web_session_user, {"token_hash": WEB_HASH, "now": NOW}),
    }
    for by_server in (False, True):
        for by_state in (False, True):
            for after in (False, True):
                name = "list_jobs" + " by server" * by_server
                name += (" and state" if by_server else " by state") * by_state
                name += " after" * after
                parameters: dict[str, Any] = {"limit": 51}
                if by_server:
                    parameters["server_id"] = SERVER
                if by_state:
                    parameters["state"] = JobState.QUEUED.value
                if after:
                    parameters["after_created"], parameters["after_id"] = MIDDLE
                queries[name] = (sql.list_jobs(by_server, by_state, after), parameters)
    kind = {"limit": 51, "kind": "noop"}
    server_kind = {**kind, "server_id": SERVER}
    after = {"after_created": MIDDLE[0], "after_id": MIDDLE[1]}
    prefix = {"limit": 51, "id_low": "job-015", "id_high": "job-015~"}
    queries["list_jobs by kind"] = (sql.list_jobs(False, False, False, True), kind)
    queries["list_jobs by kind and state"] = (
        sql.list_jobs(False, True, False, True),
        {**kind, "state": JobState.QUEUED.value},
    )
    queries["list_jobs by server and kind"] = (sql.list_jobs(True, False, False, True), server_kind)
    queries["list_jobs by server and kind after"] = (
        sql.list_jobs(True, False, True, True),
        {**server_kind, **after},
    )
    queries["list_jobs by id prefix"] = (sql.list_jobs(False, False, False, False, True), prefix)
    queries["list_jobs by server and id prefix"] = (
        sql.list_jobs(True, False, False, False, True),
        {**prefix, "server_id": SERVER},
    )
    group = {"limit": 51, "group_id": GROUP}
    queries["list_jobs by group"] = (sql.list_jobs(False, False, False, by_group=True), group)
    queries["list_jobs by group after"] = (
        sql.list_jobs(False, False, True, by_group=True),
        {**group, **after},
    )
    queries["list_jobs by group and state"] = (
        sql.list_jobs(False, True, False, by_group=True),
        {**group, "state": JobState.QUEUED.value},
    )
    queries["group_counts"] = (sql.group_counts, {"group_id": GROUP})
    queries["group_held_count"] = (sql.group_held_count, {"group_id": GROUP})
    queries["group_held_locked"] = (sql.group_held_locked, {"group_id": GROUP, "limit": 4})
    queries["first_held_group"] = (sql.first_held_group, {})
    queries["next_held_group"] = (sql.next_held_group, {"after": GROUP})
    scope = {"owner_id": USER, "key": KEY}
    queries["key_live_count"] = (sql.key_live_count, scope)
    queries["key_held_count"] = (sql.key_held_count, scope)
    queries["key_held_locked"] = (sql.key_held_locked, {**scope, "limit": 4})
    queries["first_held_key"] = (sql.first_held_key, {})
    queries["next_held_key"] = (sql.next_held_key, scope)
    queries["waiters"] = (sql.waiters(2), {"on0": "job-00003", "on1": GROUP})
    queries["dependency_held"] = (sql.dependency_held, {"after": "job-wait-0100", "limit": 50})
    return queries


# -- the skewed store --------------------------------------------------------------------------


def skewed_jobs() -> Iterator[Job]:
    """JOBS jobs of one endpoint and server, 1 ms apart: 89% succeeded, 10% queued (of ten
    priorities, most of them the default), 1% running."""
    for n in range(JOBS):
        job_id, at = f"job-{n:05d}", T0 + n
        if n % 100 == 0:
            yield running_job(job_id=job_id, now=at)
        elif n % 10 == 5:
            priority = 5 if n % 30 != 5 else n // 30 % 10
            yield replace(queued_job(job_id=job_id, now=at), priority=priority)
        else:
            finished = send_result(running_job(job_id=job_id, now=at), reported(), now=at + 2_000)
            yield accepted(finished, JobState.SUCCEEDED)


def load(store: SqlStore) -> None:
    store.insert_endpoint(
        Endpoint(
            id=ENDPOINT,
            name="host-1",
            created_at=T0,
            join_token_hash="join-hash-1",
            join_token_expires_at=T0 + 900_000,
            joined_at=T0,
            generation=1,
            current_session_id=SESSION,
        )
    )
    store.insert_session(
        Session(
            id=SESSION,
            endpoint_id=ENDPOINT,
            generation=1,
            boot_id="boot-1",
            capacity=4,
            run_version="0.1.0",
            created_at=T0,
            last_seen_at=T0,
            expires_at=T0 + 50_000,
        )
    )
    store.insert_user(User(id=USER, name="ada", platform_admin=True, created_at=T0))
    store.insert_api_token(API_TOKEN_HASH, USER, T0)
    store.insert_web_session(WEB_HASH, USER, T0, NOW + 3_600_000)
    store.insert_jobs(list(skewed_jobs()))
    other = queued_job(job_id="job-other", now=T0 + JOBS)
    store.insert_jobs([replace(other, server_id="srv-2", owner_id=OTHER_OWNER)])
    members = [
        replace(
            queued_job(job_id=f"job-group-{n}", now=T0 + JOBS),
            server_id=f"srv-g{n}",
            group_id=GROUP,
            held=n > 0,
        )
        for n in range(5)
    ]
    store.insert_jobs(members, None, Group(GROUP, USER, "role=web", "deploy.web", T0, 5, 1))
    keyed = [
        replace(
            queued_job(job_id=f"job-key-{n}", now=T0 + JOBS),
            owner_id=USER,
            concurrency=Concurrency(KEY, 1),
            key_held=n > 0,
        )
        for n in range(5)
    ]
    store.insert_jobs(keyed)
    # Jobs waiting on others: many waiters of a few jobs, a few still held.
    store.insert_jobs(
        [
            replace(
                queued_job(job_id=f"job-wait-{n:04d}", now=T0 + JOBS),
                after=(f"job-{n % 7:05d}",),
                held=n % 50 == 0,
            )
            for n in range(500)
        ]
    )


class Skewed:
    """A skewed store on FileStore or MySQLStore, analysed on request."""

    def __init__(self, factory: StoreFactory) -> None:
        self.factory = factory
        opened = factory.open()
        assert isinstance(opened, SqlStore)
        self.store = opened
        load(opened)

    def analyze(self) -> None:
        """Gather statistics (ANALYZE; ANALYZE TABLE on MySQL), then reopen the store so that
        every connection plans with them."""
        if isinstance(self.store, FileStore):
            with closing(sqlite3.connect(self.store.path, isolation_level=None)) as connection:
                connection.execute("ANALYZE")
        else:

            def work(cursor: Cursor) -> None:
                cursor.execute(f"ANALYZE TABLE {', '.join(ANALYZED)}")
                cursor.fetchall()

            self.store._read(work)
        reopened = self.factory.reopen(self.store)
        assert isinstance(reopened, SqlStore)
        self.store = reopened

    def plan(self, sql: str, parameters: dict[str, Any]) -> list[Step]:
        """The steps the database plans for `sql`, on one of the store's own connections."""
        if self.store._sql.dialect == "sqlite":
            return self.store._read(lambda cursor: _sqlite_plan(cursor, sql, parameters))
        return self.store._read(lambda cursor: _mysql_plan(cursor, sql, parameters))

    def plans(self) -> dict[str, list[Step]]:
        """The plan of every hot query, as the store's own text."""
        return {
            name: self.plan(sql, parameters)
            for name, (sql, parameters) in hot_queries(self.store._sql).items()
        }


@dataclass(frozen=True)
class Found:
    """Every hot query's plan on one skewed store, before and after ANALYZE."""

    before: dict[str, list[Step]]
    after: dict[str, list[Step]]


_FOUND: dict[str, Found] = {}


@pytest.fixture(params=["file", "mysql"])
def durable_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> StoreFactory:
    """FileStore and MySQLStore, whose plans the store pins (`@ix_name`). PostgreSQL takes no
    index hints and chooses by cost: its plans after ANALYZE are checked in
    test_query_plans_postgres.py (docs/operations.md, "PostgreSQL")."""
    return build_factory(request.param, request, tmp_path_factory)


@pytest.fixture
def found(durable_factory: StoreFactory) -> Found:
    """The plans on FileStore and on MySQLStore: the first test of each store loads a skewed
    store and reads them; the others reuse what it found (plans are facts of the code)."""
    if durable_factory.name not in _FOUND:
        skewed = Skewed(durable_factory)
        try:
            before = skewed.plans()
            skewed.analyze()
            _FOUND[durable_factory.name] = Found(before, skewed.plans())
        finally:
            skewed.store.close()
    return _FOUND[durable_factory.name]


# -- reading plans -----------------------------------------------------------------------------


_SQLITE_STEP = re.compile(
    r"(?P<access>SEARCH|SCAN) (?:TABLE )?(?P<table>\w+)"
    r"(?: USING (?:COVERING )?INDEX (?P<index>\w+)| USING (?P<pk>INTEGER PRIMARY KEY))?"
)


def _sqlite_plan(cursor: Cursor, sql: str, parameters: dict[str, Any]) -> list[Step]:
    cursor.execute("EXPLAIN QUERY PLAN " + sql, parameters)
    details = [str(row[3]) for row in cursor.fetchall()]
    steps: list[Step] = []
    for detail in details:
        if detail.startswith("USE TEMP B-TREE"):
            steps.append(("", "SORT", None))
            continue
        found = _SQLITE_STEP.fullmatch(detail.split(" (")[0])
        if found is None:
            steps.append(("", detail, None))
            continue
        table, index = found["table"], found["index"]
        if found["pk"] or (index is not None and _sqlite_pk_index(cursor, table) == index):
            index = "PRIMARY"
        steps.append((table, found["access"], index))
    return steps


def _sqlite_pk_index(cursor: Cursor, table: str) -> str | None:
    """The automatic index SQLite made for `table`'s primary key."""
    cursor.execute(f"PRAGMA index_list({table})")
    return next((str(row[1]) for row in cursor.fetchall() if row[3] == "pk"), None)


_MYSQL_ACCESS = {
    "system": "SEARCH",
    "const": "SEARCH",
    "eq_ref": "SEARCH",
    "ref": "SEARCH",
    "range": "SEARCH",
    "index": "SCAN",
    "ALL": "SCAN",
}


def _mysql_plan(cursor: Cursor, sql: str, parameters: dict[str, Any]) -> list[Step]:
    cursor.execute("EXPLAIN " + sql, parameters)
    rows = cursor.fetchall()
    columns = [str(column[0]) for column in getattr(cursor, "description", ())]
    steps: list[Step] = []
    for row in rows:
        step = dict(zip(columns, row, strict=True))
        extra = str(step["Extra"] or "")
        if step["table"] is None and extra == "Select tables optimized away":
            steps.append(("", "MIN FROM INDEX", None))
            continue
        table = str(step["table"] or "")
        access = _MYSQL_ACCESS.get(str(step["type"]), f"{step['type']} {extra}".strip())
        steps.append((table, access, step["key"]))
        if "Using filesort" in extra or "Using temporary" in extra:
            steps.append(("", "SORT", None))
    return steps


# -- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("query", list(EXPECTED_PLANS))
def test_hot_query_walks_its_intended_index_after_analyze(
    query: str, durable_factory: StoreFactory, found: Found
) -> None:
    """After ANALYZE of a skewed store, the query uses exactly the index meant for it."""
    expected = EXPECTED_PLANS[query]
    if durable_factory.name == "mysql":
        expected = MYSQL_PLANS.get(query, expected)
    assert expected == found.after[query]


@pytest.mark.parametrize("query", list(EXPECTED_PLANS))
def test_hot_query_plan_is_the_same_before_and_after_analyze(
    query: str, durable_factory: StoreFactory, found: Found
) -> None:
    """What ANALYZE finds in a skewed store does not change the query's plan."""
    assert found.before[query] == found.after[query]


SORTS_FEW_ROWS: Final = frozenset({"list_jobs by id prefix", "list_jobs by server and id prefix"})
"""Searches by id prefix sort what the prefix's range of ids holds: the service asks for 7
characters or more (`job_` and three of 32 letters), about 1 in 32,768 jobs."""


def test_no_hot_query_scans_the_jobs_table_or_sorts_after_analyze(found: Found) -> None:
    """No hot query reads `jobs` without an index, or sorts rows (but the few rows of an id
    prefix's range), once statistics exist."""
    expected: dict[str, list[Step]] = {}
    offenders = {
        name: steps
        for name, steps in found.after.items()
        if ("jobs", "SCAN", None) in steps
        or (name not in SORTS_FEW_ROWS and any(access == "SORT" for _, access, _ in steps))
    }
    assert expected == offenders


def test_skewed_store_turns_an_unpinned_capacity_check_into_a_full_scan(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Control (SQLite): without its pin, the capacity check's read of the endpoint's active
    jobs becomes a full scan of `jobs` after ANALYZE, so this store is skewed enough to catch
    an unpinned query."""
    skewed = Skewed(file_factory(lambda: tmp_path_factory.mktemp("store")))
    try:
        unpinned = skewed.store._sql.active.replace(" INDEXED BY ix_jobs_active", "")
        parameters = {"endpoint_id": ENDPOINT}
        before = skewed.plan(unpinned, parameters)
        skewed.analyze()
        after = skewed.plan(unpinned, parameters)
    finally:
        skewed.store.close()
    assert (_search("ix_jobs_active"), [("jobs", "SCAN", None)]) == (before, after)
