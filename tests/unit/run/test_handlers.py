"""The built-in `noop` and `sleep` handlers, run directly with a `JobContext`
(tests/support/run_kit.py) on a clock the test steps; and how handlers are loaded (built-ins,
entry-point plugins)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from moonrun.run import handlers as handlers_module
from moonrun.run.handlers import ENTRY_POINT_GROUP, HandlerResult, JobContext, load_handlers
from moonrun.run.handlers.command import CommandHandler
from moonrun.run.handlers.noop import NoopHandler
from moonrun.run.handlers.sleep import SleepHandler
from tests.support.run_kit import (
    Sink,
    finished,
    job_context,
)

T0_MS = 1_795_000_000_000


# -- noop and sleep -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_noop_succeeds_at_once() -> None:
    """noop: succeeded, progress 100 %."""
    context = job_context("noop", None)

    result = await finished(NoopHandler(), context)

    assert (result, context.percent) == (HandlerResult("succeeded", output={}), 100.0)


class SteppingClock:
    """A clock that moves to the next reading each time it is read, noting the progress seen."""

    def __init__(self, readings: list[int]) -> None:
        self.readings = readings
        self.reads = 0
        self.context: JobContext | None = None
        self.percents_seen: list[float | None] = []

    def __call__(self) -> int:
        if self.context is not None:
            self.percents_seen.append(self.context.percent)
        reading = self.readings[min(self.reads, len(self.readings) - 1)]
        self.reads += 1
        return reading


@pytest.mark.anyio
async def test_sleep_succeeds_once_its_seconds_have_passed() -> None:
    """sleep 0.3 s: it sleeps on until its clock says 0.3 s have passed, then succeeded with
    the seconds slept."""
    sink = Sink()
    clock = SteppingClock([T0_MS, T0_MS + 150, T0_MS + 300])
    context = job_context("sleep", {"seconds": 0.3}, sink, started_at_ms=T0_MS, now_ms=clock)
    clock.context = context

    result = await finished(SleepHandler(), context)

    assert result == HandlerResult("succeeded", output={"slept_s": 0.3})
    assert (clock.reads, clock.percents_seen) == (3, pytest.approx([None, 0.0, 50.0]))
    assert (context.percent, context.message) == (100.0, "slept")
    assert sink.lines == [("stdout", "slept 0.3 s")]


async def loop_turns(condition: Callable[[], bool], turns: int = 50) -> None:
    """Let the event loop turn until `condition()` holds; fail after `turns` turns. A turn
    runs what is ready, never a timer that is not due: this counts steps, not seconds."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    assert condition(), f"not within {turns} turns of the event loop"


@pytest.mark.anyio
async def test_sleep_reports_progress_as_its_clock_advances() -> None:
    """Each tick reports the share of time passed and what is left, on the handler's clock."""
    clock = SteppingClock([T0_MS + 970, T0_MS + 980, T0_MS + 990, T0_MS + 1000])
    context = job_context("sleep", {"seconds": 1}, started_at_ms=T0_MS, now_ms=clock)
    clock.context = context

    result = await finished(SleepHandler(), context)

    assert result.outcome == "succeeded"
    assert clock.percents_seen == pytest.approx([None, 97.0, 98.0, 99.0])
    assert (context.percent, context.message) == (100.0, "slept")


@pytest.mark.anyio
async def test_sleep_goes_by_its_clock_not_by_real_time() -> None:
    """An hour's sleep ends as soon as the clock says the hour has passed (the hang guard,
    far below an hour, would fail a sleep that waited for real time)."""
    clock = SteppingClock([T0_MS + 3_599_990, T0_MS + 3_600_000])
    context = job_context("sleep", {"seconds": 3600}, started_at_ms=T0_MS, now_ms=clock)

    result = await finished(SleepHandler(), context)

    assert result == HandlerResult("succeeded", output={"slept_s": 3600})
    assert clock.reads == 2


@pytest.mark.anyio
async def test_sleep_is_cancellable() -> None:
    """Setting context.cancelled ends a long sleep at once with outcome cancelled: within a
    few turns of the event loop, not at the next of its once-a-second ticks."""
    clock = SteppingClock([T0_MS])
    context = job_context("sleep", {"seconds": 60}, started_at_ms=T0_MS, now_ms=clock)
    work = asyncio.create_task(SleepHandler().run(context))
    await loop_turns(lambda: clock.reads == 1)

    context.cancelled.set()
    await loop_turns(work.done)

    assert work.result() == HandlerResult("cancelled")


@pytest.mark.anyio
async def test_sleep_cancelled_before_it_starts_does_not_sleep() -> None:
    """A cancel already requested (seen at the first poll) ends the sleep at once."""
    context = job_context("sleep", {"seconds": 60})
    context.cancelled.set()

    result = await finished(SleepHandler(), context)

    assert result == HandlerResult("cancelled")


@pytest.mark.anyio
async def test_sleep_resumes_with_only_the_remaining_time() -> None:
    """An attempt started 59.8 s ago sleeping 60 s: resumed, it waits only the 0.2 s left
    (its first progress says so), then succeeds."""
    clock = SteppingClock([T0_MS + 59_800, T0_MS + 60_000])
    context = job_context("sleep", {"seconds": 60}, started_at_ms=T0_MS, now_ms=clock)
    clock.context = context

    result = await finished(SleepHandler(), context)

    assert result.outcome == "succeeded"
    assert clock.percents_seen == pytest.approx([None, 100 * (1 - 200 / 60_000)])


@pytest.mark.anyio
async def test_sleep_whose_time_passed_while_run_was_down_ends_at_once() -> None:
    """Resumed after its whole time passed: succeeded without sleeping again (it reads its
    clock once, and never waits for a next reading)."""
    clock = SteppingClock([T0_MS + 10_000])
    context = job_context("sleep", {"seconds": 5}, started_at_ms=T0_MS, now_ms=clock)

    result = await finished(SleepHandler(), context)

    assert (result.outcome, clock.reads) == ("succeeded", 1)


@pytest.mark.anyio
@pytest.mark.parametrize(("fail", "retryable"), [("retryable", True), ("fatal", False)])
async def test_sleep_fails_as_asked(fail: str, retryable: bool) -> None:
    """fail=retryable|fatal: failed, code sleep_failed, retryable as asked."""
    context = job_context("sleep", {"seconds": 0, "fail": fail})

    result = await finished(SleepHandler(), context)

    expected = HandlerResult(
        "failed", retryable, {"code": "sleep_failed", "message": "failed as asked"}
    )
    assert result == expected


@pytest.mark.anyio
@pytest.mark.parametrize(
    "payload",
    [
        {"seconds": -1},
        {"seconds": "5"},
        {"seconds": True},
        {"seconds": 604_801},
        {"seconds": float("inf")},
        {"seconds": float("nan")},
        {"seconds": 1, "fail": "sometimes"},
        {"seconds": 1, "fail": True},
    ],
    ids=repr,
)
async def test_sleep_with_a_bad_payload_fails_bad_payload(payload: Any) -> None:
    """Malformed seconds or fail: failed, code bad_payload, not retryable, no sleeping."""
    context = job_context("sleep", payload)

    result = await finished(SleepHandler(), context)

    assert (result.outcome, result.retryable, result.error and result.error["code"]) == (
        "failed",
        False,
        "bad_payload",
    )


# -- handler loading ----------------------------------------------------------------------------


class EchoHandler:
    resumable = True

    async def run(self, context: JobContext) -> HandlerResult:
        return HandlerResult("succeeded", output=context.payload)


@dataclass
class FakeEntryPoint:
    name: str
    target: Any

    def load(self) -> Any:
        if isinstance(self.target, Exception):
            raise self.target
        return self.target


def install_plugins(monkeypatch: pytest.MonkeyPatch, *plugins: FakeEntryPoint) -> list[str]:
    groups: list[str] = []

    def entry_points(*, group: str) -> list[FakeEntryPoint]:
        groups.append(group)
        return list(plugins)

    monkeypatch.setattr(handlers_module, "entry_points", entry_points)
    return groups


def test_load_handlers_ships_noop_sleep_and_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no plugin installed, the three built-in kinds."""
    install_plugins(monkeypatch)

    handlers = load_handlers()

    assert {kind: type(h) for kind, h in handlers.items()} == {
        "noop": NoopHandler,
        "sleep": SleepHandler,
        "command": CommandHandler,
    }
    assert (handlers["noop"].resumable, handlers["sleep"].resumable) == (True, True)
    assert handlers["command"].resumable is False


def test_load_handlers_adds_plugins_from_the_entry_point_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A `moonrun.handlers` entry point named `echo` handles kind echo (an instance of it)."""
    groups = install_plugins(monkeypatch, FakeEntryPoint("echo", EchoHandler))

    handlers = load_handlers()

    assert groups == [ENTRY_POINT_GROUP]
    assert ENTRY_POINT_GROUP == "moonrun.handlers"
    assert isinstance(handlers["echo"], EchoHandler)
    assert set(handlers) == {"noop", "sleep", "command", "echo"}


def test_a_plugin_may_replace_a_built_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin named like a built-in kind takes its place."""
    install_plugins(monkeypatch, FakeEntryPoint("sleep", EchoHandler))

    assert isinstance(load_handlers()["sleep"], EchoHandler)


def test_a_broken_plugin_is_skipped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A plugin that fails to load is left out (its kind then fails unknown_kind); Run goes on."""
    install_plugins(
        monkeypatch,
        FakeEntryPoint("broken", ImportError("no module named nowhere")),
        FakeEntryPoint("echo", EchoHandler),
    )

    with caplog.at_level(logging.WARNING, logger="moonrun.run.handlers"):
        handlers = load_handlers()

    assert set(handlers) == {"noop", "sleep", "command", "echo"}
    assert [r.getMessage() for r in caplog.records] == ["handler plugin failed to load"]


def test_the_installed_package_registers_the_built_ins_as_entry_points() -> None:
    """pyproject's moonrun.handlers entry points name the same three classes."""
    handlers = load_handlers()

    assert {kind: type(handlers[kind]) for kind in ("noop", "sleep", "command")} == {
        "noop": NoopHandler,
        "sleep": SleepHandler,
        "command": CommandHandler,
    }
