"""Every platform process sweeps (docs/operations.md, "Several platforms"): no leader, so no
single process whose loss stops sweeping, and no lease or lock to hand over. Two sweepers
over one MySQL or PostgreSQL database that find the same passed deadlines at once never apply
one twice: each deadline is applied inside `update_jobs`, which locks the job's row and
decides again on what it reads there, so the later sweeper finds the job changed and writes
nothing. What the duplicate costs is the later sweeper's read and its wait for the row lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from moonrun.scheduling.jobs import JobState
from moonrun.service.scheduling import SchedulingService
from moonrun.store import open_store
from tests.support.harness import World
from tests.support.stores import StoreFactory, mysql_factory, postgres_factory

JOBS = 300
BATCH = 40
"""Small batches, so that the two sweepers' passes overlap many times."""


@pytest.fixture(params=["mysql", "postgres"])
def shared_factory(request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    if request.param == "mysql":
        yield mysql_factory(request.getfixturevalue("mysql_url"))
    else:
        yield postgres_factory(request.getfixturevalue("postgres_url"))


def test_two_platforms_sweeping_the_same_passed_deadlines_apply_each_once(
    shared_factory: StoreFactory,
) -> None:
    world = World(shared_factory)
    other = open_store(shared_factory.url())
    try:
        run = world.run().start(capacity=JOBS)
        jobs = [world.submit() for _ in range(JOBS)]
        while len(run.leases) < JOBS:  # a claim grants 64 at most
            assert run.claim(JOBS - len(run.leases))
        world.clock.advance_s(world.settings.ack_timeout_s + 1)  # no ack came: every one due

        sweepers = [
            world.service,
            SchedulingService(other, world.clock, world.tokens, world.settings),
        ]
        applied = [0, 0]
        passes = [0, 0]
        errors: list[BaseException] = []
        start = threading.Barrier(2)

        def sweep(n: int) -> None:
            start.wait()
            try:
                while True:
                    passes[n] += 1
                    changed = sweepers[n].sweep(BATCH)
                    applied[n] += changed
                    if not changed and not world.store.due_jobs(world.clock.now(), 1):
                        return
            except BaseException as error:  # the test fails on it below
                errors.append(error)

        threads = [threading.Thread(target=sweep, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)

        assert errors == []
        assert sum(applied) == JOBS, (applied, passes)
        for job in jobs:
            stored = world.job(job.id)
            assert stored.state is JobState.RETRYING, stored
            assert [past.attempt for past in stored.history] == [1], stored.history
    finally:
        other.close()
        world.store.close()
