"""A PostgresStore read or write waits for the database as few times as it can: a user's one
job (with its Idempotency-Key, if any) is one statement in autocommit, and so is a job read
with its server; any other write is `BEGIN`, each of the unit's statements, then its
job-count changes and `COMMIT` in one round trip. Before, psycopg's `transaction()` block and
an `executemany` of the counts took two more a write (PostgreSQL end to end 0.89x MySQL in
`bench/peer_bench.py`). Counted here on the wire, in libpq's trace of the connection's
messages, where every round trip ends with a `Sync` (the extended protocol) or is one `Query`
(the simple one)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterator

import pytest

from moonrun.errors import AlreadyExists
from moonrun.scheduling.jobs import Job, JobState
from moonrun.scheduling.records import Server
from moonrun.store import postgres
from moonrun.store.postgres import PostgresStore
from moonrun.store.protocol import IdempotencyRecord
from tests.support.jobkit import ENDPOINT, T0, claimed, queued_job
from tests.support.stores import wipe_postgres


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    wipe_postgres(postgres_url)
    opened = PostgresStore(postgres_url, pool_size=1)  # one connection: the one traced
    yield opened
    opened.close()


@pytest.fixture
def other(store: PostgresStore, postgres_url: str) -> Iterator[PostgresStore]:
    """Another platform's store on the same database, whose writes come in between."""
    opened = PostgresStore(postgres_url, pool_size=1)
    yield opened
    opened.close()


def touched(job: Job) -> Job:
    """`job` as another write left it: nothing but its version and time moved."""
    return dataclasses.replace(job, version=job.version + 1, updated_at=job.updated_at + 1)


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


def test_one_job_is_inserted_with_its_count_in_one_statement(store: PostgresStore) -> None:
    sent = round_trips(store, lambda: store.insert_job(queued_job(job_id="job-a")))

    assert sent == ["Sync"]  # one extended-protocol statement, in autocommit
    assert store.job_counts()[JobState.QUEUED] == 1
    assert store.get_job("job-a") == queued_job(job_id="job-a")


def test_one_job_with_its_idempotency_key_is_one_statement_too(store: PostgresStore) -> None:
    key = IdempotencyRecord("usr-1", "key-1", "print-1", ("job-a",), T0)

    sent = round_trips(store, lambda: store.insert_jobs([queued_job(job_id="job-a")], key))

    assert sent == ["Sync"]
    assert store.idempotency_record("usr-1", "key-1") == key
    assert store.job_counts()[JobState.QUEUED] == 1


def test_a_key_used_again_leaves_neither_the_job_nor_its_count(store: PostgresStore) -> None:
    store.insert_jobs(
        [queued_job(job_id="job-a")], IdempotencyRecord("usr-1", "key-1", "p", ("job-a",), T0)
    )
    again = IdempotencyRecord("usr-1", "key-1", "p", ("job-b",), T0)

    with pytest.raises(AlreadyExists, match="Idempotency-Key"):
        store.insert_jobs([queued_job(job_id="job-b")], again)

    assert store.get_job("job-b") is None
    assert store.job_counts()[JobState.QUEUED] == 1


def test_a_job_id_taken_leaves_neither_the_key_nor_a_count(store: PostgresStore) -> None:
    store.insert_job(queued_job(job_id="job-a"))

    with pytest.raises(AlreadyExists):
        store.insert_jobs(
            [queued_job(job_id="job-a")], IdempotencyRecord("usr-1", "key-2", "p", ("job-a",), T0)
        )

    assert store.idempotency_record("usr-1", "key-2") is None
    assert store.job_counts()[JobState.QUEUED] == 1


def test_a_batch_is_begin_its_inserts_and_its_counts_with_the_commit(
    store: PostgresStore,
) -> None:
    batch = [queued_job(job_id="job-a"), queued_job(job_id="job-b")]

    sent = round_trips(store, lambda: store.insert_jobs(batch))

    assert sent[0] == "BEGIN"
    assert sent[-1].startswith("INSERT INTO job_counts")
    assert sent[-1].endswith("; COMMIT")
    assert store.job_counts()[JobState.QUEUED] == 2


def test_one_job_update_is_its_read_then_its_swap_with_its_count_in_one_statement(
    store: PostgresStore,
) -> None:
    store.insert_job(queued_job(job_id="job-a"))

    sent = round_trips(store, lambda: store.update_jobs(["job-a"], claimed))

    assert sent == ["Sync", "Sync"]  # the read, then the swap (no BEGIN, no COMMIT)
    assert store.get_job("job-a") == claimed(queued_job(job_id="job-a"))
    counts = store.job_counts()
    assert counts.get(JobState.QUEUED, 0) == 0
    assert counts[JobState.ACCEPTED] == 1


def test_several_jobs_update_is_begin_the_locked_read_one_statement_of_updates_and_the_commit(
    store: PostgresStore,
) -> None:
    """Their swaps in one statement (a data-modifying `WITH` clause each): one round trip
    where each job's own UPDATE took one (a batch of acks or results: N+3 -> 4)."""
    jobs = [queued_job(job_id=f"job-{n}") for n in range(4)]
    store.insert_jobs(jobs)

    sent = round_trips(store, lambda: store.update_jobs([job.id for job in jobs], claimed))

    assert len(sent) == 4, sent
    assert sent[0] == "BEGIN"
    assert sent[-1].endswith("; COMMIT")
    assert [store.get_job(job.id) for job in jobs] == [claimed(job) for job in jobs]
    counts = store.job_counts()
    assert counts.get(JobState.QUEUED, 0) == 0
    assert counts[JobState.ACCEPTED] == 4


def test_a_large_update_swaps_its_jobs_a_statement_per_fifty(store: PostgresStore) -> None:
    jobs = [queued_job(job_id=f"job-{n:03}") for n in range(120)]
    store.insert_jobs(jobs)

    sent = round_trips(store, lambda: store.update_jobs([job.id for job in jobs], claimed))

    assert len(sent) == 6, sent  # BEGIN, the locked read, three statements, COMMIT
    assert store.job_counts()[JobState.ACCEPTED] == 120
    assert store.get_job("job-119") == claimed(jobs[-1])


def test_a_several_jobs_update_whose_swap_loses_stores_none_of_them(
    store: PostgresStore,
) -> None:
    """Under the row locks no swap can lose; if one ever did, none of the batch is kept."""
    jobs = [queued_job(job_id=f"job-{n}") for n in range(3)]
    store.insert_jobs(jobs)
    original = store._swap

    def stale_swap(job: Job, expected: Job, old: object = None) -> tuple[str, dict[str, object]]:
        statement, parameters = original(job, expected, old)  # type: ignore[arg-type]
        if job.id == "job-1":  # as if another write came between: its swap finds no row
            parameters["expected_version"] = expected.version - 1
        return statement, parameters

    store._swap = stale_swap  # type: ignore[method-assign]
    with pytest.raises(AssertionError, match="changed under its row lock"):
        store.update_jobs([job.id for job in jobs], claimed)

    assert [store.get_job(job.id) for job in jobs] == jobs
    assert store.job_counts()[JobState.QUEUED] == 3


def test_a_write_that_changes_no_count_commits_alone(store: PostgresStore) -> None:
    sent = round_trips(store, lambda: store.update_jobs(["job-missing", "job-gone"], claimed))

    assert sent[0] == "BEGIN"
    assert sent[-1] == "COMMIT"


def test_one_job_changed_by_another_write_meanwhile_is_read_and_changed_again(
    store: PostgresStore, other: PostgresStore
) -> None:
    store.insert_job(queued_job(job_id="job-a"))
    seen: list[int] = []
    first = queued_job(job_id="job-a").version

    def change(job: Job) -> Job:
        seen.append(job.version)
        if len(seen) == 1:
            other.replace_job(touched(job), job)
        return claimed(job)

    done = store.update_jobs(["job-a"], change)

    (before, after) = done["job-a"]
    assert seen == [first, first + 1]  # the second call saw the other write
    assert before == touched(queued_job(job_id="job-a"))
    assert store.get_job("job-a") == after == claimed(before)
    counts = store.job_counts()
    assert counts.get(JobState.QUEUED, 0) == 0
    assert counts[JobState.ACCEPTED] == 1


def test_one_job_that_keeps_changing_is_written_under_its_lock_in_the_end(
    store: PostgresStore, other: PostgresStore
) -> None:
    store.insert_job(queued_job(job_id="job-a"))
    calls = 0

    def change(job: Job) -> Job:
        nonlocal calls
        calls += 1
        if calls <= postgres.OPTIMISTIC_TRIES:  # every optimistic try loses
            other.replace_job(touched(job), job)
        return claimed(job)

    done = store.update_jobs(["job-a"], change)

    assert calls == postgres.OPTIMISTIC_TRIES + 1
    assert store.get_job("job-a") == done["job-a"][1]
    assert store.job_counts()[JobState.ACCEPTED] == 1


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
        store.update_jobs(["job-a", "job-b"], fails_midway)  # type: ignore[arg-type]

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


def test_a_server_is_read_with_its_admins_in_order_in_one_round_trip(
    store: PostgresStore,
) -> None:
    # Every job create and job read checks the server: its admins came in a second statement.
    server = Server("srv-1", "web-1", "end-1", "usr-1", T0, admin_ids=("usr-9", "usr-3", "usr-5"))
    store.insert_server(server)
    alone = Server("srv-2", "web-2", "end-1", "usr-1", T0)
    store.insert_server(alone)

    found: list[Server | None] = []
    sent = round_trips(store, lambda: found.append(store.get_server("srv-1")))

    assert sent == ["Sync"]
    assert found == [server]
    assert store.get_server("srv-2") == alone
    assert store.get_server("srv-missing") is None


def test_a_job_is_read_with_its_server_in_one_round_trip(store: PostgresStore) -> None:
    server = Server("srv-1", "web-1", "end-1", "usr-1", T0, admin_ids=("usr-9", "usr-3"))
    store.insert_server(server)
    store.insert_job(queued_job(job_id="job-a"))

    found: list[object] = []
    sent = round_trips(store, lambda: found.append(store.job_and_server("job-a")))

    assert sent == ["Sync"]
    assert found == [(queued_job(job_id="job-a"), server)]


def test_a_claim_reads_its_candidates_then_grants_each_by_one_swap(store: PostgresStore) -> None:
    store.insert_job(queued_job(job_id="job-a"))

    granted: list[list[Job]] = []
    sent = round_trips(store, lambda: granted.append(store.claim_jobs(ENDPOINT, T0, 1, claimed)))

    assert sent == ["Sync", "Sync", "Sync"]  # the rank, the candidates, the swap: no BEGIN
    assert granted == [[claimed(queued_job(job_id="job-a"))]]
    assert store.job_counts()[JobState.ACCEPTED] == 1


def test_a_claim_whose_job_another_platform_granted_first_takes_the_next_one(
    store: PostgresStore, other: PostgresStore
) -> None:
    first, second = queued_job(job_id="job-a"), queued_job(job_id="job-b", now=T0 + 1)
    store.insert_jobs([first, second])
    calls: list[str] = []

    def grant(job: Job) -> Job:
        calls.append(job.id)
        if len(calls) == 1:  # another platform grants the same job meanwhile
            other.replace_job(claimed(job, now=T0 + 5, generation=9), job)
        return claimed(job, now=T0 + 5)

    taken = store.claim_jobs(ENDPOINT, T0 + 5, 1, grant)

    assert calls == ["job-a", "job-b"]  # the locking claim skipped what the other took
    assert taken == [claimed(second, now=T0 + 5)]
    assert store.get_job("job-a") == claimed(first, now=T0 + 5, generation=9)
    counts = store.job_counts()
    assert counts[JobState.ACCEPTED] == 2
    assert counts.get(JobState.QUEUED, 0) == 0
