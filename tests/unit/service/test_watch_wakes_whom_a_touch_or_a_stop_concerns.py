"""What the watch wakes besides a job's change: a touch of a job (its logs completed) wakes
that job's readers only, and counts them; a stop wakes every waiter at once, even when one
was left behind by an event loop that has closed since (the platform's signal handler may
stop the watch after its loop ended)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from moonrun.service.waiting import ENDPOINT, JOB, Waiter, Waiting, Watch
from tests.unit.service.test_waiting import steps_until

T = TypeVar("T")


def test_a_touched_job_wakes_its_readers_and_counts_them() -> None:
    async def scenario() -> None:
        watch = Watch()
        reader = watch.register(JOB, "job-1")
        watch.job_touched("job-1")  # the one waiter of the watch
        await asyncio.sleep(0)
        assert (reader.event.is_set(), watch.wakeups) == (True, 1)
        reader.event.clear()
        other = watch.register(JOB, "job-2")
        claims = watch.register(ENDPOINT, "ep-1")
        watch.job_touched("job-3")  # nobody reads it
        watch.job_touched("job-1")
        await asyncio.sleep(0)
        assert [w.event.is_set() for w in (reader, other, claims)] == [True, False, False]
        assert watch.wakeups == 2

    asyncio.run(scenario())


def test_a_touch_while_nobody_waits_wakes_nobody() -> None:
    watch = Watch()
    watch.job_touched("job-1")
    assert watch.wakeups == 0


def left_behind(watch: Watch) -> Waiter:
    """A waiter registered on an event loop that has closed since, and never unregistered."""

    async def register() -> Waiter:
        return watch.register(JOB, "job-1")

    return asyncio.run(register())


def test_stopping_passes_over_a_waiter_whose_loop_has_closed() -> None:
    watch = Watch()
    left_behind(watch)
    watch.stop()
    assert watch.stopping


def test_peers_missed_passes_over_a_waiter_whose_loop_has_closed() -> None:
    watch = Watch()
    left_behind(watch)
    watch.peers_missed()
    assert watch.wakeups == 1


async def inline(work: Callable[..., T], *args: Any) -> T:
    return work(*args)


class Place:
    def leave(self) -> None: ...

    def enter(self) -> None: ...


def test_a_stop_wakes_a_waiting_request_at_once() -> None:
    """Waiting far longer than the test (its next look an hour away): the stop, not a
    recheck, ends it, within a few turns of the event loop."""
    watch = Watch()
    watch.recheck_s = 3600.0
    reads: list[int] = []

    def read() -> int:
        reads.append(len(reads))
        return len(reads)

    async def never_gone() -> None:
        await asyncio.Event().wait()

    async def scenario() -> int:
        waiting = asyncio.ensure_future(
            watch.wait_until(
                read,
                lambda _: False,
                on=(JOB, "job-1"),
                rooms=(),
                deadline=time.monotonic() + 7200,  # far beyond the test
                waiting=Waiting(inline, Place(), never_gone),
            )
        )
        await steps_until(lambda: watch.waiting == 1 and len(reads) == 1)
        for _ in range(10):  # well into its pause
            await asyncio.sleep(0)
        watch.stop()
        await steps_until(waiting.done)
        return waiting.result()

    assert (asyncio.run(scenario()), watch.waiting) == (1, 0)
