"""A PostgresStore write waits for the database as few times as MySQL's: `BEGIN`, each of the
unit's statements, then its job-count changes and `COMMIT` in one round trip. psycopg's
`transaction()` block and an `executemany` of the counts took two more a write (PostgreSQL
end to end 0.89x MySQL in `bench/peer_bench.py`); counted here on the wire, in libpq's trace
of the connection's messages, where every round trip ends with a `Sync` (the extended
protocol) or is one `Query` (the simple one)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator

import pytest

from moonrun.errors import AlreadyExists
from moonrun.scheduling.jobs import JobState
from moonrun.store import postgres
from moonrun.store.postgres import PostgresStore
from tests.support.jobkit import claimed, queued_job
from tests.support.stores import wipe_postgres


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    wipe_postgres(postgres_url)
    opened = PostgresStore(postgres_url, pool_size=1)  # one connection: the one traced
    yield opened
    opened.close()


def round_trips(store: PostgresStore, write: Callable[[], object]) -> list[str]:
    """What `write` sent that waited for an answer: each `Query` message's text, and
    `Sync` for each batch of extended-protocol messages."""
    psycopg = postgres._driver()[0]
    with tempfile.TemporaryFile("w+") as trace:
        with store._pool.connection() as connection:
            connection.pgconn.trace(trace.fileno())
            connection.pgconn.set_trace_flags(
                psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
            )
        try:
            write()
        finally:
            with store._pool.connection() as connection:
                connection.pgconn.untrace()
        trace.flush()
        os.lseek(trace.fileno(), 0, os.SEEK_SET)
        lines = trace.read().splitlines()
    sent = [line.split("\t") for line in lines if line.startswith("F\t")]
    return [
        fields[3].strip(' "') if fields[2] == "Query" else "Sync"
        for fields in sent
        if fields[2] == "Sync" or (fields[2] == "Query" and fields[3].strip(' "'))
    ]  # an empty Query is the pool's check of a connection, not the write's


def test_a_job_insert_is_begin_the_insert_and_its_counts_with_the_commit(
    store: PostgresStore,
) -> None:
    sent = round_trips(store, lambda: store.insert_job(queued_job(job_id="job-a")))

    assert len(sent) == 3, sent
    assert sent[0] == "BEGIN"
    assert sent[2].startswith("INSERT INTO job_counts")
    assert sent[2].endswith("; COMMIT")
    assert store.job_counts()[JobState.QUEUED] == 1


def test_a_job_update_is_begin_the_locked_read_the_update_and_the_counts_with_the_commit(
    store: PostgresStore,
) -> None:
    job = queued_job(job_id="job-a")
    store.insert_job(job)

    sent = round_trips(store, lambda: store.update_jobs(["job-a"], claimed))

    assert len(sent) == 4, sent
    assert sent[0] == "BEGIN"
    assert sent[-1].endswith("; COMMIT")
    counts = store.job_counts()
    assert counts.get(JobState.QUEUED, 0) == 0
    assert counts[JobState.ACCEPTED] == 1


def test_a_write_that_changes_no_count_commits_alone(store: PostgresStore) -> None:
    sent = round_trips(store, lambda: store.update_jobs(["job-missing"], claimed))

    assert sent[0] == "BEGIN"
    assert sent[-1] == "COMMIT"


def test_a_refused_write_rolls_back_its_rows_and_its_counts(store: PostgresStore) -> None:
    store.insert_job(queued_job(job_id="job-a"))

    with pytest.raises(AlreadyExists):
        store.insert_jobs([queued_job(job_id="job-b"), queued_job(job_id="job-a")])

    assert store.get_job("job-b") is None
    assert store.job_counts()[JobState.QUEUED] == 1
    with store._pool.connection() as connection:
        idle = postgres._driver()[0].pq.TransactionStatus.IDLE
        assert connection.info.transaction_status == idle


def test_a_unit_that_raises_leaves_nothing_and_the_connection_idle(
    store: PostgresStore,
) -> None:
    store.insert_job(queued_job(job_id="job-a"))

    def fails_midway(job: object) -> object:
        raise RuntimeError("the unit's own error")

    with pytest.raises(RuntimeError, match="the unit's own error"):
        store.update_jobs(["job-a"], fails_midway)  # type: ignore[arg-type]

    assert store.get_job("job-a") == queued_job(job_id="job-a")
    with store._pool.connection() as connection:
        idle = postgres._driver()[0].pq.TransactionStatus.IDLE
        assert connection.info.transaction_status == idle


def test_count_changes_are_inlined_only_from_state_names_and_numbers() -> None:
    statement = postgres._counts_and_commit(
        [{"state": "queued", "shard": 3, "delta": -1}, {"state": "claimed", "shard": 3, "delta": 1}]
    )
    assert "('queued', 3, -1), ('claimed', 3, 1)" in statement
    with pytest.raises(ValueError, match="not a job state's name"):
        postgres._counts_and_commit([{"state": "x'); DROP TABLE jobs; --", "shard": 0, "delta": 1}])
    with pytest.raises(ValueError, match="invalid literal"):
        postgres._counts_and_commit([{"state": "queued", "shard": "1; COMMIT", "delta": 1}])
