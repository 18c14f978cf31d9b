"""On PostgreSQL, a job is in the claim, deadline and hold indexes only while it is there.

PostgreSQL writes a row's entry anew in every index of `jobs` on each update that changes an
indexed column, and sorts NULLs last: with full indexes, each finished job kept an entry in
every one of them, and a claim whose plan walked the claim index read an entry of every job
the endpoint had ever run (schema.py, `_postgres_partial_indexes_v18`; docs/benchmarks.md,
"PostgreSQL: the indexes hold only what they are asked for"). Counted by ANALYZE, which sets
each index's `reltuples` from the rows it sampled: all of them, in a table this small.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from moonrun.scheduling.jobs import JobState
from moonrun.store.postgres import PostgresStore
from moonrun.store.schema import PARTIAL_INDEXES
from moonrun.store.sql import Cursor
from tests.support.jobkit import T0, accepted, queued_job, reported, running_job, send_result
from tests.support.stores import wipe_postgres

FINISHED = 40
WAITING = 3


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    wipe_postgres(postgres_url)
    opened = PostgresStore(postgres_url, pool_size=2)
    yield opened
    opened.close()


def entries(store: PostgresStore) -> dict[str, int]:
    """Each index of `jobs` and how many entries it holds (ANALYZE reads every row of so few)."""

    def work(cursor: Cursor) -> dict[str, int]:
        cursor.execute("ANALYZE jobs")
        cursor.execute(
            "SELECT index.relname, index.reltuples FROM pg_index "
            "JOIN pg_class AS index ON index.oid = pg_index.indexrelid "
            "JOIN pg_class AS tab ON tab.oid = pg_index.indrelid WHERE tab.relname = 'jobs'"
        )
        return {name: int(count) for name, count in cursor.fetchall()}

    return store._read(work)


def test_finished_jobs_leave_the_claim_deadline_and_hold_indexes(store: PostgresStore) -> None:
    for n in range(FINISHED):
        running = running_job(job_id=f"job-done-{n}")
        store.insert_job(
            accepted(send_result(running, reported(), now=T0 + 5_000), JobState.SUCCEEDED)
        )
    for n in range(WAITING):
        store.insert_job(queued_job(job_id=f"job-waiting-{n}"))

    held = entries(store)

    claim = {name: held[name] for name in ("ix_jobs_priority_claim", "ix_jobs_claim")}
    assert claim == {"ix_jobs_priority_claim": WAITING, "ix_jobs_claim": WAITING}
    assert held["ix_jobs_finished"] == FINISHED
    never = set(PARTIAL_INDEXES) - {"ix_jobs_priority_claim", "ix_jobs_claim", "ix_jobs_finished"}
    assert {name: held[name] for name in never} == dict.fromkeys(never, 0)
    assert held["ix_jobs_listing"] == FINISHED + WAITING  # a full index, for comparison
