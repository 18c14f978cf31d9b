"""SIGKILL while FileStore's loop flusher commits groups: no answered write is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.process.test_crash_and_race import kill_and_check
from tests.support.stores import file_factory

# A real child process, SIGKILLed: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes


def test_sigkill_during_loop_flushes_loses_no_answered_write(tmp_path: Path) -> None:
    """Eight tasks on one event loop await their creates, claims, acks, progress and results
    through the loop's flusher, which commits them in groups; however often the process is
    killed in the middle, every write a task was answered for is stored, whole."""
    factory = file_factory(lambda: tmp_path)
    acknowledged, (groups, calls) = kill_and_check(factory, threads=8, mode="crash-loop")
    assert acknowledged, "the children never acknowledged anything"
    assert calls > groups, "no group held more than one call: nothing was grouped"
