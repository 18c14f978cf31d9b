"""The firing loop: decides due schedules about every `interval_s` (`service/schedules.py`)."""

from __future__ import annotations

import logging

import anyio

from moonrun.errors import MoonrunError
from moonrun.service.schedules import FIRE_BATCH, Schedules
from moonrun.service.sweeper import Runner

log = logging.getLogger("moonrun.schedules")

FIRE_INTERVAL_S = 0.25
"""How often due schedules are looked for: a due time fires well within a second. One
indexed query that finds nothing costs about what a heartbeat does."""


class Firer:
    """Runs `Schedules.fire_due` on `channel` until stopped, at once again after a full batch."""

    def __init__(
        self, schedules: Schedules, channel: Runner, interval_s: float = FIRE_INTERVAL_S
    ) -> None:
        self._schedules, self._channel, self._interval_s = schedules, channel, interval_s

    async def run(self, stop: anyio.Event) -> None:
        while not stop.is_set():
            try:
                decided = await self._channel.run(self._schedules.fire_due)
            except MoonrunError as error:  # the store is down: the sweeper reports it
                log.warning("firing failed", extra={"fields": {"error": error.message}})
                decided = 0
            if decided >= FIRE_BATCH:
                continue
            with anyio.move_on_after(self._interval_s):
                await stop.wait()
