"""Clocks: the system clock for production, a manual clock for tests and simulations."""

from __future__ import annotations

import threading
import time
from typing import Protocol

from moonrun.scheduling.time import Instant


class Clock(Protocol):
    def now(self) -> Instant:
        """Milliseconds since the epoch, UTC."""
        ...


class SystemClock:
    def now(self) -> Instant:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: Instant = 1_795_000_000_000) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> Instant:
        return self._now

    def advance(self, ms: int) -> Instant:
        if ms < 0:
            raise ValueError("a manual clock never goes backwards")
        with self._lock:
            self._now += ms
            return self._now

    def advance_s(self, seconds: float) -> Instant:
        return self.advance(round(seconds * 1000))
