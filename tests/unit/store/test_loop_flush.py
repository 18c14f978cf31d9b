"""FileStore's loop flusher: calls awaited on the event loop share one COMMIT and its fsync,
each write in its own savepoint, and none is answered before that COMMIT returned."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from moonrun.errors import AlreadyExists, StoreUnavailable
from moonrun.http.channels import Channel
from moonrun.scheduling.jobs import Job
from moonrun.store.file import FileStore
from moonrun.store.loop_flush import Committer
from tests.support.harness import World
from tests.support.stores import file_factory


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = World(file_factory(lambda: tmp_path))
    yield world
    world.store.close()


def file_store(world: World) -> FileStore:
    assert isinstance(world.store, FileStore)
    return world.store


def committed_ids(store: FileStore) -> set[str]:
    """Job ids another connection sees: what is committed."""
    with sqlite3.connect(store.path) as connection:
        return {row[0] for row in connection.execute("SELECT id FROM jobs")}


class BlockingCommitter(Committer):
    """Holds every COMMIT until released; says when one is waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def commit_now(self, connection: sqlite3.Connection) -> None:
        self.entered.set()
        assert self.release.wait(30), "the test never released the commit"
        super().commit_now(connection)


class FailingCommitter(Committer):
    def commit_now(self, connection: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("disk I/O error")


class Listener:
    def __init__(self) -> None:
        self.changed: list[str] = []

    def job_changed(self, job: Job, before: Job | None) -> None:
        self.changed.append(job.id)


def create(world: World) -> Job:
    """A user's create of a no-op job: one write through the service."""
    return world.service.create_job(world.owner, world.server.id, kind="noop")


def held_commits(world: World) -> tuple[FileStore, BlockingCommitter, Listener]:
    """The world's store with its COMMITs held until released, and a listener of job events."""
    store = file_store(world)
    committer = BlockingCommitter()
    store.flusher.committer = committer
    listener = Listener()
    world.service.listen(listener)
    return store, committer, listener


async def until(condition: Any) -> None:
    """Let the loop turn until `condition()` holds (no clock involved)."""
    for _ in range(100_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def test_a_lone_call_is_applied_at_once_and_answered_after_its_commit(world: World) -> None:
    """With nothing in flight a call is applied where it is made, with no loop turn before it
    (a loop kept busy by others makes every turn slow), and its COMMIT goes to the committer's
    thread: it is answered once that returned."""
    store = file_store(world)
    committer = BlockingCommitter()
    store.flusher.committer = committer

    async def main() -> Job:
        create = partial(world.service.create_job, kind="noop")
        pending = asyncio.ensure_future(store.run_in_group(create, world.owner, world.server.id))
        await until(committer.entered.is_set)
        assert not pending.done()
        committer.release.set()
        return await pending

    job = asyncio.run(asyncio.wait_for(main(), 30))
    assert job.id in committed_ids(store)


def test_calls_awaited_together_share_one_commit(world: World) -> None:
    """Twenty creates and a claim awaited at once on the loop: two COMMITs, the first call's
    and everyone else's."""
    store = file_store(world)
    run = world.run().start(capacity=64)
    channel = Channel("jobs", 64, inline=True, group=store.run_in_group)
    before = store.groups_committed

    async def main() -> list[Any]:
        creates = [channel.run(world.service.create_job, world.owner, world.server.id, kind="noop")
                   for _ in range(20)]  # fmt: skip
        return await asyncio.gather(*creates, channel.run(world.service.claim, run.session_id, 8))

    *jobs, granted = asyncio.run(main())
    # The first is applied in place (nothing was in flight); the twenty made while its COMMIT
    # was on its way share the next.
    assert store.groups_committed - before == 2
    assert store.flusher.groups == 2
    assert store.flusher.calls == 21
    assert committed_ids(store) >= {job.id for job in jobs}
    assert len(granted) == 8, "the claim saw the creates applied before it in its group"


def test_calls_arriving_while_a_commit_is_in_flight_join_the_next_one(world: World) -> None:
    store = file_store(world)
    committer = BlockingCommitter()
    store.flusher.committer = committer

    async def main() -> None:
        first = [asyncio.ensure_future(store.run_in_group(create, world))]  # applied in place
        await until(committer.entered.is_set)
        later = [asyncio.ensure_future(store.run_in_group(create, world)) for _ in range(10)]
        await until(lambda: len(store.flusher._waiting[asyncio.get_running_loop()]) == 10)
        committer.release.set()
        await asyncio.gather(*first, *later)

    asyncio.run(main())
    assert store.flusher.groups == 2
    assert store.flusher.calls == 11


def test_no_call_is_answered_nor_any_waiter_told_before_the_commit_returned(world: World) -> None:
    """While the COMMIT is held, every caller still waits, another connection sees none of
    the group's writes, and job events are held back; once it returns, all are answered."""
    store, committer, listener = held_commits(world)

    async def main() -> list[Job]:
        calls = [asyncio.ensure_future(store.run_in_group(create, world)) for _ in range(5)]
        await until(committer.entered.is_set)
        for _ in range(1000):
            await asyncio.sleep(0)
        assert not any(call.done() for call in calls)
        assert listener.changed == []
        assert committed_ids(store) == set()
        committer.release.set()
        return list(await asyncio.gather(*calls))

    jobs = asyncio.run(main())
    assert committed_ids(store) == {job.id for job in jobs}
    assert sorted(listener.changed) == sorted(job.id for job in jobs)


def test_a_call_applied_in_place_whose_caller_leaves_still_commits_and_wakes_its_waiters(
    world: World,
) -> None:
    """The caller of a call applied in place is cancelled (its client left) while the COMMIT
    is on its way: the write is committed all the same, its waiters are told, and the calls
    made meanwhile still get their group."""
    store, committer, listener = held_commits(world)

    async def main() -> Job:
        leaving = asyncio.ensure_future(store.run_in_group(create, world))
        await until(committer.entered.is_set)
        later = asyncio.ensure_future(store.run_in_group(create, world))
        for _ in range(100):
            await asyncio.sleep(0)
        leaving.cancel()
        committer.release.set()
        job: Job = await later
        await until(lambda: len(listener.changed) == 2)
        return job

    later_job = asyncio.run(asyncio.wait_for(main(), 30))
    assert later_job.id in committed_ids(store)
    assert len(committed_ids(store)) == 2, "the left caller's job is committed too"
    assert len(set(listener.changed)) == 2


def test_a_failing_unit_rolls_back_alone_and_only_its_caller_sees_the_error(world: World) -> None:
    """A creates a job (applied in place); in the next group B inserts two jobs of which the
    second repeats A's id (its first insert is undone with its savepoint), and C creates a job.
    A and C commit."""
    store = file_store(world)

    def make(job_id: str) -> Job:
        return replace(world.submit(), id=job_id)

    a, b1, c = make("job-a"), make("job-b1"), make("job-c")

    async def main() -> list[Any]:
        return await asyncio.gather(
            store.run_in_group(store.insert_job, a),
            store.run_in_group(store.insert_jobs, [b1, replace(b1, id="job-a")]),
            store.run_in_group(store.insert_job, c),
            return_exceptions=True,
        )

    before = store.groups_committed
    first, second, third = asyncio.run(main())
    assert first is None
    assert third is None
    assert isinstance(second, AlreadyExists)
    assert store.groups_committed - before == 2
    stored = committed_ids(store)
    assert {"job-a", "job-c"} <= stored
    assert "job-b1" not in stored


def test_a_failed_commit_answers_every_call_with_an_error_and_tells_no_waiter(
    world: World,
) -> None:
    store = file_store(world)
    store.flusher.committer = FailingCommitter()
    listener = Listener()
    world.service.listen(listener)
    before = committed_ids(store)

    async def main() -> list[Any]:
        calls = [store.run_in_group(create, world) for _ in range(4)]
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(main())
    assert all(isinstance(answer, StoreUnavailable) for answer in answers), answers
    assert listener.changed == []
    assert committed_ids(store) == before
    store.flusher.committer = Committer()
    job = asyncio.run(store.run_in_group(create, world))
    assert job.id in committed_ids(store), "the connection works again after the failure"


def test_writers_on_threads_and_on_the_loop_take_turns_at_the_connection(world: World) -> None:
    store = file_store(world)
    made: list[str] = []

    def from_thread() -> None:
        for _ in range(30):
            made.append(create(world).id)

    async def main() -> list[Job]:
        jobs = []
        for _ in range(15):
            jobs += await asyncio.gather(*(store.run_in_group(create, world) for _ in range(4)))
        return jobs

    threads = [threading.Thread(target=from_thread) for _ in range(3)]
    for thread in threads:
        thread.start()
    jobs = asyncio.run(main())
    for thread in threads:
        thread.join()
    assert committed_ids(store) >= set(made) | {job.id for job in jobs}
    assert len(made) == 90
    assert len(jobs) == 60
