"""Waiting in the service (`wait_for_claim`, `wait_for_job`): its bounds, and a client that
leaves (docs/operations.md, "Waiting requests").

Each test drives the service on one event loop with what a request lends it (`Lent`): store
work run inline, a place on a channel, and a client that can leave. Nothing here asserts a
duration: every wait is far longer than the test, so a request that answers did not run out.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from moonrun.errors import ChannelBusy, Forbidden, TooManyWaiting
from moonrun.scheduling.jobs import Job
from moonrun.scheduling.records import User
from moonrun.service.config import WaitLimits
from moonrun.service.scheduling import Claim
from moonrun.service.waiting import Waiting, Watch
from tests.support.harness import World
from tests.support.stores import memory_factory

T = TypeVar("T")
LONG_S = 30.0
"""Longer than any test here: a wait that ends did not run out."""
STEPS = 100
"""Event-loop turns a waiter may take to notice something (it needs a few)."""


class Lent:
    """What one request lends the service: inline store work, its place on a channel, and
    a client that leaves when told."""

    def __init__(self, address: str = "192.0.2.1") -> None:
        self.address = address
        self.left = asyncio.Event()
        self.held = True

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        return work(*args)

    def leave(self) -> None:
        self.held = False

    def enter(self) -> None:
        self.held = True

    async def gone(self) -> None:
        await self.left.wait()

    def waiting(self) -> Waiting:
        return Waiting(self.run, self, self.gone, self.address)


@pytest.fixture
def world() -> World:
    built = World(memory_factory())
    built.service.waiters.recheck_s = LONG_S  # only a wake-up or a departure ends a wait early
    return built


def limit(world: World, **limits: Any) -> Watch:
    watch = world.service.waiters
    watch.limits = WaitLimits(**limits)
    return watch


async def steps_until(condition: Callable[[], bool]) -> None:
    for _ in range(STEPS):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("not within a few turns of the event loop")


def read(world: World, user: User, job: Job, lent: Lent | None = None) -> Coroutine[Any, Any, Job]:
    """A blocking read of `job` until it ends."""
    return world.service.wait_for_job(
        lambda: user,
        job.id,
        lambda job: job.state.is_terminal,
        wait_s=LONG_S,
        waiting=(lent or Lent()).waiting(),
    )


def claim(world: World, session_id: str, lent: Lent | None = None) -> Coroutine[Any, Any, Claim]:
    return world.service.wait_for_claim(
        session_id, 1, wait_s=LONG_S, waiting=(lent or Lent()).waiting()
    )


async def started(watch: Watch, work: Awaitable[T], room: str) -> asyncio.Task[T]:
    """`work` as a task, once it waits (its room holds one more)."""
    before = watch.held(room)
    task = asyncio.ensure_future(work)
    await steps_until(lambda: watch.held(room) > before or task.done())
    assert not task.done(), task.result()
    return task


def end(tasks: list[asyncio.Task[Any]], lents: list[Lent]) -> Awaitable[Any]:
    for lent in lents:
        lent.left.set()
    return asyncio.gather(*tasks)


# -- a client that leaves ------------------------------------------------------------------------


def test_a_waiting_read_whose_client_leaves_is_dropped_at_once(world: World) -> None:
    """The read's waiter and its places in the rooms go the moment its client leaves; it
    answers the job as it last read it and holds no place on its channel."""

    async def scenario() -> None:
        watch, lent = world.service.waiters, Lent()
        job = world.submit()
        waiting = await started(watch, read(world, world.owner, job, lent), "reads")
        assert (watch.waiting, lent.held) == (1, False)
        lent.left.set()
        await steps_until(waiting.done)
        assert (watch.waiting, watch.held("reads"), lent.held) == (0, 0, False)
        assert waiting.result().state.value == "queued"

    asyncio.run(scenario())


def test_a_waiting_claim_whose_run_leaves_grants_nothing(world: World) -> None:
    """A Run that went away is not granted the job created after it left."""

    async def scenario() -> None:
        watch, lent = world.service.waiters, Lent()
        run = world.run().start()
        waiting = await started(watch, claim(world, run.session_id, lent), "claims")
        lent.left.set()
        await steps_until(waiting.done)
        job = world.submit()
        assert (waiting.result().jobs, watch.waiting, world.job(job.id).state.value) == (
            [],
            0,
            "queued",
        )

    asyncio.run(scenario())


# -- bounds --------------------------------------------------------------------------------------


def test_one_users_waiting_reads_are_bounded_but_not_another_users(world: World) -> None:
    """Past its bound a user's next blocking read is refused at once (TooManyWaiting, 429);
    another user's read still waits."""

    async def scenario() -> None:
        watch = limit(world, reads_per_user=2)
        job = world.submit()
        lents = [Lent() for _ in range(3)]
        tasks = [
            await started(watch, read(world, world.owner, job, lents[i]), "reads") for i in range(2)
        ]
        with pytest.raises(TooManyWaiting):
            await read(world, world.owner, job)
        tasks.append(await started(watch, read(world, world.helper, job, lents[2]), "reads"))
        assert watch.held("reads") == 3
        await end(tasks, lents)
        assert watch.waiting == 0

    asyncio.run(scenario())


def test_waiting_reads_from_one_address_are_bounded_whoever_makes_them(world: World) -> None:
    """Several users behind one address share its bound; the same user from elsewhere waits."""

    async def scenario() -> None:
        watch = limit(world, reads_per_address=2)
        job = world.submit()
        lents = [Lent("198.51.100.7"), Lent("198.51.100.7"), Lent("203.0.113.9")]
        tasks = [
            await started(watch, read(world, world.owner, job, lents[0]), "reads"),
            await started(watch, read(world, world.helper, job, lents[1]), "reads"),
        ]
        with pytest.raises(TooManyWaiting):
            await read(world, world.admin, job, Lent("198.51.100.7"))
        tasks.append(await started(watch, read(world, world.owner, job, lents[2]), "reads"))
        await end(tasks, lents)

    asyncio.run(scenario())


def test_waiting_reads_never_take_the_room_of_runs_claims(world: World) -> None:
    """With every read's place taken, a Run's claim still waits, and gets the job created."""

    async def scenario() -> None:
        watch = limit(world, reads=2)
        job = world.submit(not_before=world.clock.now() + 3_600_000)
        lents = [Lent() for _ in range(3)]
        tasks: list[asyncio.Task[Any]] = [
            await started(watch, read(world, user, job, lent), "reads")
            for user, lent in zip((world.owner, world.helper), lents, strict=False)
        ]
        with pytest.raises(TooManyWaiting):
            await read(world, world.admin, job)
        run = world.run().start()
        waiting = await started(watch, claim(world, run.session_id, lents[2]), "claims")
        created = world.submit()
        granted = await asyncio.wait_for(waiting, LONG_S)
        assert [g.job_id for g in granted.jobs] == [created.id]
        await end(tasks, lents)

    asyncio.run(scenario())


def test_claims_over_their_bound_answer_at_once_and_other_endpoints_still_wait(
    world: World,
) -> None:
    """Past an endpoint's bound its next claim answers at once, empty (as a wait that ran
    out); another endpoint's claim still waits."""

    async def scenario() -> None:
        watch = limit(world, claims_per_endpoint=1)
        run, other = world.run().start(), world.run(world.other_endpoint).start()
        lents = [Lent(), Lent()]
        tasks = [await started(watch, claim(world, run.session_id, lents[0]), "claims")]
        assert (await claim(world, run.session_id)).jobs == []
        tasks.append(await started(watch, claim(world, other.session_id, lents[1]), "claims"))
        assert watch.held("claims") == 2
        await end(tasks, lents)

    asyncio.run(scenario())


# -- what a wait answers -------------------------------------------------------------------------


def test_a_read_woken_by_a_change_answers_from_a_read_with_access_checked(world: World) -> None:
    """The wake-up is only a hint: the answer is read again as the reader, who lost the right
    to see the job while waiting, so the read is refused."""

    async def scenario() -> None:
        watch = world.service.waiters
        job = world.submit()
        waiting = await started(watch, read(world, world.helper, job), "reads")
        world.directory.remove_server_admin(world.owner, world.server.id, world.helper.id)
        world.service.cancel_job(world.owner, job.id)
        with pytest.raises(Forbidden):
            await asyncio.wait_for(waiting, LONG_S)
        assert watch.waiting == 0

    asyncio.run(scenario())


# -- stopping (the platform's SIGTERM) ------------------------------------------------------


def test_a_stopping_watch_answers_every_waiter_at_once_with_what_it_read_last() -> None:
    watch = Watch()
    reads: list[int] = []

    class Place:
        def leave(self) -> None: ...

        def enter(self) -> None: ...

    async def run(work, *args):  # type: ignore[no-untyped-def]
        return work(*args)

    async def never_gone() -> None:
        await asyncio.Event().wait()

    def read() -> int:
        reads.append(len(reads))
        return len(reads)

    async def scenario() -> int:
        waiting = Waiting(run, Place(), never_gone)
        stopper = threading.Timer(0.2, watch.stop)
        stopper.start()
        value = await watch.wait_until(
            read,
            lambda _: False,
            on=("job", "job_1"),
            rooms=(),
            deadline=time.monotonic() + 3600,
            waiting=waiting,
        )
        stopper.join()
        return value

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == 1
    assert (reads, watch.waiting) == ([0], 0)
    assert watch.stopping


class Crowded(Lent):
    """A request whose channel is full the first `times` it takes its place again."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.refusals = times
        self.tries = 0

    def enter(self) -> None:
        self.tries += 1
        if self.refusals:
            self.refusals -= 1
            raise ChannelBusy("the jobs channel is at its limit of 32")
        super().enter()


def test_a_waiting_claim_whose_channel_is_full_when_woken_waits_for_a_place_and_is_granted(
    world: World,
) -> None:
    """Admitted once, a waiting claim is not refused because others' work fills its channel
    at the instant it looks again: it waits for a place (a short pause) and then looks."""

    async def scenario() -> None:
        crowded = Crowded(times=3)
        run = world.run().start()
        waiting = await started(
            world.service.waiters, claim(world, run.session_id, crowded), "claims"
        )
        created = world.submit()
        granted = await asyncio.wait_for(waiting, LONG_S)
        assert [g.job_id for g in granted.jobs] == [created.id]
        assert crowded.tries == 4
        assert crowded.held

    asyncio.run(scenario())


def test_a_waiting_claim_whose_channel_stays_full_answers_what_it_read_at_its_deadline(
    world: World,
) -> None:
    async def scenario() -> None:
        crowded = Crowded(times=10**6)
        run = world.run().start()
        waiting = world.service.wait_for_claim(
            run.session_id, 1, wait_s=0.3, waiting=crowded.waiting()
        )
        task = await started(world.service.waiters, waiting, "claims")
        world.submit()
        answered = await asyncio.wait_for(task, LONG_S)
        assert answered.jobs == []
        assert crowded.tries > 1

    asyncio.run(scenario())


def test_a_fleet_of_10000_runs_keeps_every_claim_and_cancel_watch_waiting() -> None:
    """Past the bound a claim answers at once and its Run pauses before it claims again, so a
    job for it waits that long: the bound holds a whole fleet's claims (at 4,096, 5,000 Runs
    had about 900 of theirs answered at once at any moment)."""
    watch = Watch()

    async def wait_all() -> int:
        waiters = [
            watch.register("endpoint", f"e{n % 10_000}", watch.claim_rooms(f"e{n % 10_000}"))
            for n in range(20_000)
        ]
        return len(waiters)

    assert asyncio.run(wait_all()) == 20_000
