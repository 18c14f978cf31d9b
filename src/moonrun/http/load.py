"""How far behind the event loop runs, and the refusal of new work while it is too far behind.

Every request of the platform is served on one event loop; when it falls behind, every answer
is late by as much, and a Run that times out tries again, which makes it later still. So the
loop's lag is measured (a tick that should wake every `interval_s` notes how late it woke),
and while it passes `HttpSettings.overload_lag_s` the Run routes that bring new work
(joins, registrations, reconciliations, logs, artifacts) answer 503 `overloaded` with
`Retry-After`, and claims answer an empty grant at once. Heartbeats, acks, progress and
results are always served: they keep what is already held alive (docs/protocol.md,
"Overload").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from moonrun.errors import Overloaded


class LoopLag:
    """The event loop's lag in seconds (`lag_s`): the lateness of the latest tick, or half the
    previous figure when that is more (a stall is remembered for a few ticks)."""

    def __init__(
        self,
        interval_s: float = 0.1,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.interval_s = interval_s
        self.lag_s = 0.0
        self._clock = clock
        self._sleep = sleep

    def tick(self, late_s: float) -> None:
        """A tick woke `late_s` seconds after it should have."""
        self.lag_s = max(late_s, self.lag_s / 2)

    async def run(self, stop: Callable[[], bool]) -> None:
        """Measure until `stop()` holds."""
        while not stop():
            due = self._clock() + self.interval_s
            await self._sleep(self.interval_s)
            self.tick(max(0.0, self._clock() - due))


def check_load(lag: LoopLag, limit_s: float, retry_after_s: int) -> None:
    """Overloaded (with how long to stay away) while the loop lags more than `limit_s`."""
    if lag.lag_s > limit_s:
        raise Overloaded(
            f"the platform is {lag.lag_s:.1f} s behind on its work; try again later",
            retry_after_s=retry_after_s,
        )


def overloaded(lag: LoopLag, limit_s: float) -> bool:
    """Whether the loop lags more than `limit_s`."""
    return lag.lag_s > limit_s
