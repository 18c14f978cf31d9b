"""The serving platform's garbage collector (`wiring/collector.py`): what startup made is
frozen out of every collection, and collections come far less often than CPython's defaults,
so that a full one does not stall thousands of Runs' requests every few seconds."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from moonrun.wiring.collector import THRESHOLDS, tune_for_serving


@pytest.fixture
def collector_restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.usefixtures("collector_restored")
def test_serving_freezes_what_startup_made_and_collects_less_often() -> None:
    made_at_startup = [object() for _ in range(100)]
    gc.unfreeze()
    tune_for_serving()
    assert gc.get_freeze_count() >= len(made_at_startup)
    assert gc.get_threshold() == THRESHOLDS


def test_each_generation_waits_longer_than_cpythons_default() -> None:
    defaults = (700, 10, 10)
    assert all(ours > theirs for ours, theirs in zip(THRESHOLDS, defaults, strict=True))


def test_the_platform_serves_only_after_tuning_its_collector() -> None:
    """`platform serve` tunes the collector once the app is built, right before it serves."""
    import inspect

    from moonrun import cli

    source = inspect.getsource(cli.platform_serve)
    assert source.index("create_app(") < source.index("tune_for_serving()")
    assert source.index("tune_for_serving()") < source.index("server.run()")
