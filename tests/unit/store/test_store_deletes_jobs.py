"""`Store.finished_jobs` and `Store.delete_jobs` (retention), over every store: finished jobs
are found by when they ended, and deleted with their idempotency records, never a job the
caller's check refuses as stored."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from moonrun.scheduling.jobs import Job, JobState, Outcome, Terminal
from moonrun.store.protocol import IdempotencyRecord, Store
from tests.support.stores import StoreFactory
from tests.unit.store.test_store_contract import T0, make_job


@pytest.fixture
def store(store_factory: StoreFactory) -> Iterator[Store]:
    store = store_factory.open()
    yield store
    store.close()


def ended(job: Job, at: int) -> Job:
    """The job succeeded at `at` (a new version of its record)."""
    return replace(
        job,
        state=JobState.SUCCEEDED,
        version=job.version + 1,
        updated_at=at,
        terminal=Terminal(Outcome.SUCCEEDED, 1, at),
    )


def finished(store: Store, job_id: str, at: int) -> Job:
    """A job inserted queued and then ended at `at`."""
    job = make_job(job_id)
    store.insert_job(job)
    done = ended(job, at)
    assert store.replace_job(done, expected=job)
    return done


def is_terminal(job: Job) -> bool:
    return job.state.is_terminal


def test_finished_jobs_are_found_by_when_they_ended_earliest_first_up_to_the_limit(
    store: Store,
) -> None:
    for n, at in enumerate([T0 + 300, T0 + 100, T0 + 200, T0 + 900]):
        finished(store, f"job-{n}", at)
    store.insert_job(make_job("job-waiting"))

    found = store.finished_jobs(T0 + 300, limit=2)
    rest = store.finished_jobs(T0 + 300, limit=10)

    assert [job.id for job in found] == ["job-1", "job-2"]
    assert [job.id for job in rest] == ["job-1", "job-2", "job-0"]


def test_delete_jobs_deletes_finished_jobs_with_their_idempotency_records(store: Store) -> None:
    job, other = make_job("job-keyed"), make_job("job-kept")
    store.insert_jobs([job], IdempotencyRecord("user-1", "key-1", "f" * 64, (job.id,), T0))
    store.insert_jobs([other], IdempotencyRecord("user-1", "key-2", "f" * 64, (other.id,), T0))
    for stored in (job, other):
        assert store.replace_job(ended(stored, T0 + 10), expected=stored)

    deleted = store.delete_jobs([job.id, "job-unknown"], is_terminal)

    assert [gone.id for gone in deleted] == [job.id]
    assert store.get_job(job.id) is None
    assert store.idempotency_record("user-1", "key-1") is None
    assert store.get_job(other.id) is not None
    assert store.idempotency_record("user-1", "key-2") is not None
    assert store.finished_jobs(T0 + 10, limit=10) == [store.get_job(other.id)]
    assert store.job_counts().get(JobState.SUCCEEDED) == 1


def test_delete_jobs_never_deletes_a_job_its_check_refuses_as_stored(store: Store) -> None:
    waiting = make_job("job-waiting")
    store.insert_job(waiting)
    done = finished(store, "job-done", T0 + 10)

    deleted = store.delete_jobs([waiting.id, done.id], is_terminal)

    assert [job.id for job in deleted] == [done.id]
    assert store.get_job(waiting.id) == waiting
    assert store.job_counts() == {JobState.QUEUED: 1}
    assert store.list_jobs(server_ids=None, state=None, limit=10) == [waiting]


def test_a_batch_key_goes_with_the_first_job_of_its_request(store: Store) -> None:
    first, second = make_job("job-a"), make_job("job-b")
    ids = (first.id, second.id)
    store.insert_jobs([first, second], IdempotencyRecord("user-1", "batch", "f" * 64, ids, T0))
    for stored in (first, second):
        assert store.replace_job(ended(stored, T0 + 10), expected=stored)

    store.delete_jobs([second.id], is_terminal)
    kept = store.idempotency_record("user-1", "batch")
    store.delete_jobs([first.id], is_terminal)

    assert kept is not None
    assert kept.job_ids == ids
    assert store.idempotency_record("user-1", "batch") is None


def test_a_deleted_job_can_be_made_again_under_its_id_and_key(store: Store) -> None:
    """Nothing of a deleted job stays behind: its id and its key are free again."""
    job = make_job("job-again")
    record = IdempotencyRecord("user-1", "key", "f" * 64, (job.id,), T0)
    store.insert_jobs([job], record)
    assert store.replace_job(ended(job, T0 + 10), expected=job)
    store.delete_jobs([job.id], is_terminal)

    store.insert_jobs([job], record)

    assert store.get_job(job.id) == job
    assert store.job_counts() == {JobState.QUEUED: 1}
