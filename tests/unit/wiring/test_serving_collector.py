"""The serving platform's garbage collector (`wiring/collector.py`): what startup made is
frozen out of every collection, CPython's counters are off, and collections come by the clock,
the young generation often, the middle one each second, everything every ten minutes, so that
no collection walks more than a short interval made (at 5,000 Runs the counters let young
collections walk 380,000 objects at once)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from moonrun.wiring import collector
from moonrun.wiring.collector import Collector, generation_at, tune_for_serving

HANG_GUARD_S = 10.0
"""Only a guard against waiting forever; nothing below asserts how long anything took."""


@pytest.fixture
def collector_restored() -> Iterator[list[Collector]]:
    started: list[Collector] = []
    yield started
    for running in started:
        running.stop()
    gc.unfreeze()
    gc.enable()


def test_serving_freezes_what_startup_made_and_collects_by_the_clock(
    collector_restored: list[Collector],
) -> None:
    made_at_startup = [object() for _ in range(100)]
    gc.unfreeze()
    running = tune_for_serving()
    collector_restored.append(running)
    assert gc.get_freeze_count() >= len(made_at_startup)
    assert gc.isenabled() is False
    assert "moonrun-collector" in {thread.name for thread in threading.enumerate()}


def test_the_young_generation_each_tick_the_middle_each_tenth_everything_each_ten_minutes() -> None:
    assert [generation_at(tick) for tick in range(1, 11)] == [0] * 9 + [1]
    assert (generation_at(collector.FULL_EVERY), collector.FULL_EVERY * collector.YOUNG_S) == (
        2,
        600.0,
    )
    assert generation_at(collector.FULL_EVERY + 10) == 1


def test_a_collector_collects_as_its_schedule_says_until_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(collector, "YOUNG_S", 0.001)
    collected: list[int] = []
    enough = threading.Event()

    def collect(generation: int) -> None:
        collected.append(generation)
        if len(collected) >= 20:
            enough.set()

    running = Collector(collect).start()
    assert enough.wait(HANG_GUARD_S)
    running.stop()
    stopped_at = len(collected)
    assert collected == [generation_at(tick) for tick in range(1, stopped_at + 1)]
    assert running.ticks == stopped_at


def test_the_platform_serves_only_after_tuning_its_collector() -> None:
    """`platform serve` tunes the collector once the app is built, right before it serves."""
    import inspect

    from moonrun import cli

    source = inspect.getsource(cli.platform_serve)
    assert source.index("create_app(") < source.index("tune_for_serving()")
    assert source.index("tune_for_serving()") < source.index("server.run()")
