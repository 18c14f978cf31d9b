"""PostgreSQL's plans of the hot queries, on the same skewed store as the other stores'
(tests/unit/store/test_query_plans.py: 3,000 jobs of one endpoint, 89% succeeded), read with
`EXPLAIN (FORMAT JSON)` after ANALYZE.

PostgreSQL takes no index hints: it chooses by cost from its statistics, so these tests check
what it chooses once it has them (a table never analysed is planned blind, and autovacuum
analyses it soon). Every hot query reads `jobs` through one of its indexes, never a scan of
the table nor a sort of its rows (but the few rows of an id prefix's range); a claim's reads
walk the claim-by-priority index. The small tables (sessions, users, tokens, counts) may be
read whole: a planner rightly prefers that for a handful of rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from moonrun.store.sql import Cursor
from tests.conftest import build_factory
from tests.unit.store.test_query_plans import SORTS_FEW_ROWS, Skewed, hot_queries

Node = tuple[str, str | None, str | None]
"""(node type, table, index) of one node of a plan."""

CLAIM_PATH = (
    "first_claim_rank",
    "next_claim_rank",
    "next_claim_owner",
    "claimable_of_owners",
    "claimable_of_owners, two owners",
)
"""The reads of a claim: each walks ix_jobs_priority_claim."""


def _nodes(plan: dict[str, Any], found: list[Node]) -> list[Node]:
    found.append((plan["Node Type"], plan.get("Relation Name"), plan.get("Index Name")))
    for child in plan.get("Plans", []):
        _nodes(child, found)
    return found


@pytest.fixture(scope="module")
def plans(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, list[Node]]]:
    """Every hot query's plan on a skewed PostgreSQL store after ANALYZE."""
    skewed = Skewed(build_factory("postgres", request, tmp_path_factory))
    try:
        skewed.store._read(lambda cursor: cursor.execute("ANALYZE"))

        def plan(sql: str, parameters: dict[str, Any]) -> list[Node]:
            def work(cursor: Cursor) -> Any:
                cursor.execute("EXPLAIN (FORMAT JSON) " + sql, parameters)
                return cursor.fetchall()[0][0]

            found = skewed.store._read(work)
            return _nodes((found[0] if isinstance(found, list) else found)["Plan"], [])

        yield {name: plan(sql, p) for name, (sql, p) in hot_queries(skewed.store._sql).items()}
    finally:
        skewed.store.close()


def test_no_hot_query_scans_or_sorts_the_jobs_table_after_analyze(
    plans: dict[str, list[Node]],
) -> None:
    offenders = {
        name: nodes
        for name, nodes in plans.items()
        if ("Seq Scan", "jobs", None) in nodes
        or (name not in SORTS_FEW_ROWS and any(node == "Sort" for node, _, _ in nodes))
    }
    assert offenders == {}


def test_every_hot_query_of_jobs_reads_it_through_an_index(plans: dict[str, list[Node]]) -> None:
    unindexed = {
        name: nodes
        for name, nodes in plans.items()
        if any(table == "jobs" for _, table, _ in nodes)
        and not any(index for _, table, index in nodes if table == "jobs")
        and not any(node == "Bitmap Index Scan" for node, _, _ in nodes)
    }
    assert unindexed == {}


@pytest.mark.parametrize("query", CLAIM_PATH)
def test_a_claims_reads_walk_the_claim_by_priority_index(
    query: str, plans: dict[str, list[Node]]
) -> None:
    assert {index for _, table, index in plans[query] if table == "jobs"} == {
        "ix_jobs_priority_claim"
    }
