"""`update_jobs`, the one atomic step of every ack, result and cancel: each job read, changed
and written once, an unchanged job not written, an unknown one left out, and a batch larger
than one locked read (500 ids) still each job once. On MemoryStore and FileStore (the store
contract's MySQL runs are left to `make test`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.scheduling.jobs import Job, JobState
from moonrun.store.file import FileStore
from moonrun.store.memory import MemoryStore
from moonrun.store.protocol import Store
from tests.unit.store.test_store_contract import T0, make_job, with_state


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened: Store = MemoryStore() if request.param == "memory" else FileStore(tmp_path / "p.db")
    yield opened
    opened.close()


def jobs(count: int) -> list[Job]:
    return [make_job(f"job-{n:04d}", created_at=T0 + n) for n in range(count)]


def test_each_job_is_changed_once_and_only_a_changed_one_is_written(store: Store) -> None:
    stored = jobs(3)
    store.insert_jobs(stored)
    seen: list[str] = []

    def change(job: Job) -> Job:
        seen.append(job.id)
        return job if job.id == "job-0001" else with_state(job, JobState.CANCELLED)

    done = store.update_jobs(["job-0002", "job-0000", "job-0001", "job-9999"], change)

    assert sorted(seen) == ["job-0000", "job-0001", "job-0002"]
    assert sorted(done) == ["job-0000", "job-0001", "job-0002"]
    assert [(before.version, after.version) for before, after in done.values()] == [
        (1, 2) if job_id != "job-0001" else (1, 1) for job_id in done
    ]
    states = {job.id: (job.state, job.version) for job in store.get_jobs(list(done)).values()}
    assert states == {
        "job-0000": (JobState.CANCELLED, 2),
        "job-0001": (JobState.QUEUED, 1),
        "job-0002": (JobState.CANCELLED, 2),
    }


def test_more_jobs_than_one_locked_read_are_each_changed_once(store: Store) -> None:
    stored = jobs(1001)
    store.insert_jobs(stored)
    seen: list[str] = []

    def change(job: Job) -> Job:
        seen.append(job.id)
        return with_state(job, JobState.CANCELLED)

    done = store.update_jobs([job.id for job in stored], change)

    assert (len(seen), len(set(seen)), len(done)) == (1001, 1001, 1001)
    assert store.job_counts()[JobState.CANCELLED] == 1001


def test_no_ids_change_nothing(store: Store) -> None:
    assert store.update_jobs([], lambda job: job) == {}
