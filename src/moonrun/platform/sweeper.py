"""The sweeper: applies passed deadlines found through the store's deadline index.

Correctness never waits for it (every message applies a passed deadline lazily); it makes
sure that jobs whose Run went silent move on even when nobody asks about them.
"""

from __future__ import annotations

import logging

import anyio

from moonrun.errors import MoonrunError, StoreUnavailable
from moonrun.platform.channels import Channel
from moonrun.platform.service import SchedulingService

log = logging.getLogger("moonrun.sweeper")


class Sweeper:
    """Sweeps every `interval_s`, and at once again while whole batches come back.

    Its passes also tell whether the store answers: `store_failure` is the error of the latest
    pass while that pass could not reach the store, and None again once one could (`/healthz`
    reports it).
    """

    def __init__(self, service: SchedulingService, channel: Channel, interval_s: float) -> None:
        self._service = service
        self._channel = channel
        self._interval_s = interval_s
        self.running = False
        self.swept = 0
        self.store_failure: str | None = None

    async def run(self, stop: anyio.Event) -> None:
        self.running = True
        try:
            while not stop.is_set():
                try:
                    applied = await self._channel.run(self._service.sweep)
                except MoonrunError as error:  # the store is down: log, and try again later
                    log.warning("sweep failed", extra={"fields": {"error": error.message}})
                    if isinstance(error, StoreUnavailable):
                        self.store_failure = error.message
                    applied = 0
                else:
                    self.store_failure = None
                self.swept += applied
                if applied >= self._service.settings.sweep_batch:
                    continue
                with anyio.move_on_after(self._interval_s):
                    await stop.wait()
        finally:
            self.running = False
