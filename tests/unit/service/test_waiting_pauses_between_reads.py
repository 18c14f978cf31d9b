"""How long a waiting request pauses between two reads of the store (`Watch.wait_until`):
between half `recheck_s` and all of it (jittered by `draw`), never past its deadline, sooner
when something becomes due; it reads once more when time is left, however little, and not
once the deadline is reached.

A manual clock: `time.monotonic` as `wait_until` sees it, and a pause that only records its
length and moves that clock on (a wake-up, an event already set, ends it at once, as the real
one does). Nothing here waits on the wall clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from moonrun.service import waiting as waiting_module
from moonrun.service.waiting import Waiting, Watch

T = TypeVar("T")
START = 1000.0
MOST_PAUSES = 50
"""More pauses than any wait below takes: a wait past it would never end."""


class Clock:
    """`time` as `wait_until` reads it; pauses move it on."""

    def __init__(self) -> None:
        self.now = START
        self.pauses: list[float] = []
        self.calls = 0

    def monotonic(self) -> float:
        return self.now

    async def pause(self, event: asyncio.Event, timeout_s: float) -> None:
        self.calls += 1
        if self.calls > MOST_PAUSES:  # a pause of nothing moves no clock on: a wait that never ends
            raise AssertionError(f"still pausing after {MOST_PAUSES} pauses: {self.pauses[:5]}")
        if event.is_set() or timeout_s <= 0:
            return
        self.pauses.append(round(timeout_s, 6))
        self.now += timeout_s
        await asyncio.sleep(0)


class Place:
    def __init__(self) -> None:
        self.held = True
        self.left = 0

    def leave(self) -> None:
        self.held = False
        self.left += 1

    def enter(self) -> None:
        self.held = True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(waiting_module, "time", clock)
    monkeypatch.setattr(waiting_module, "_wait_for", clock.pause)
    return clock


def watch_drawing(draw: float, recheck_s: float = 10.0) -> Watch:
    watch = Watch()
    watch.recheck_s = recheck_s
    watch.draw = lambda: draw
    return watch


async def never_gone() -> None:
    await asyncio.Event().wait()


async def inline(work: Callable[..., T], *args: Any) -> T:
    return work(*args)


def wait(
    watch: Watch,
    clock: Clock,
    *,
    for_s: float,
    due_s: Callable[[int], float | None] | None = None,
    place: Place | None = None,
) -> int:
    """Wait `for_s` on the manual clock for something that never comes; how many reads."""
    reads: list[int] = []

    def read() -> int:
        reads.append(len(reads))
        return len(reads)

    async def scenario() -> int:
        return await watch.wait_until(
            read,
            lambda _: False,
            on=("job", "job_1"),
            rooms=(),
            deadline=clock.now + for_s,
            waiting=Waiting(inline, place or Place(), never_gone),
            due_s=due_s,
        )

    answer = asyncio.run(scenario())
    assert answer == len(reads)
    return answer


@pytest.mark.parametrize(("draw", "pause"), [(0.0, 5.0), (0.5, 7.5), (0.25, 6.25), (0.999, 9.995)])
def test_a_pause_is_between_half_the_recheck_and_all_of_it(
    clock: Clock, draw: float, pause: float
) -> None:
    reads = wait(watch_drawing(draw), clock, for_s=3 * pause + 1)
    assert clock.pauses[:3] == [pause] * 3
    assert reads == len(clock.pauses) + 1


def test_the_last_pause_ends_at_the_deadline_and_a_last_read_answers(clock: Clock) -> None:
    """7.5 s, 7.5 s, then the half second left (under a second is still time to wait); at
    the deadline exactly the wait answers what it read, without a pause of nothing."""
    reads = wait(watch_drawing(0.5), clock, for_s=15.5)
    assert (clock.pauses, reads, clock.now) == ([7.5, 7.5, 0.5], 4, START + 15.5)


def test_a_wait_of_no_time_reads_once_and_does_not_pause(clock: Clock) -> None:
    place = Place()
    assert (wait(watch_drawing(0.5), clock, for_s=0, place=place), clock.pauses) == (1, [])
    assert (place.held, place.left) == (True, 0)


def test_a_wait_looks_again_when_something_becomes_due_sooner(clock: Clock) -> None:
    """Due in 2 s: the pause is 2 s, not the recheck's 7.5 s; a due time already past is
    looked at after a millisecond; nothing due: the recheck's pause."""
    dues: list[float | None] = [2.0, -3.0, None]
    reads = wait(watch_drawing(0.5), clock, for_s=10.0, due_s=lambda read: dues[min(read, 3) - 1])
    assert (clock.pauses[:3], reads) == ([2.0, 0.001, 7.5], len(clock.pauses) + 1)


def test_a_wait_on_a_stopping_watch_answers_its_first_read_keeping_its_place(
    clock: Clock,
) -> None:
    watch, place = watch_drawing(0.5), Place()
    watch.stop()
    assert (wait(watch, clock, for_s=60.0, place=place), clock.pauses) == (1, [])
    assert (place.held, place.left, watch.waiting) == (True, 0, 0)
