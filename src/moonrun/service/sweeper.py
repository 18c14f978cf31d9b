"""The sweeper: applies passed deadlines found through the store's deadline index, and prunes
finished jobs past their retention.

Correctness never waits for it (every message applies a passed deadline lazily); it makes
sure that jobs whose Run went silent move on even when nobody asks about them. Pruning runs on
a thread of the ops channel (it deletes files), a bounded batch at a time, each batch its own
short transaction, with the event loop serving between them (docs/operations.md, "Retention").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import anyio

from moonrun.errors import MoonrunError, StoreUnavailable
from moonrun.scheduling.jobs import Job
from moonrun.scheduling.retention import PRUNE_BATCH_LIMIT
from moonrun.service.scheduling import SchedulingService

T = TypeVar("T")

log = logging.getLogger("moonrun.sweeper")

RELEASE_PAGES = 512
"""Free pages a pass gives back to the file system at most: 2 MiB of a FileStore's 4 KiB pages,
measured at 15 to 20 ms of its write lock on a loaded 2-core machine (2,048 took 65 to 80 ms);
more waits for the next pass, which comes at once."""

PRUNE_PACE = 4.0
"""While a retention backlog lasts, the sweeper rests this many times as long as its last
prune batch took, so that pruning holds the store a fifth of the time at most and serving the
rest: back to back, pruning 100,000 jobs halved the peer bench's throughput beside it
(`bench/retention_bench.py --part serving`, docs/benchmarks.md). Passed deadlines are not
paced: they are due now."""

STALLED_AFTER_S = 10.0
"""A pass that has not come back for this long counts as a store that does not answer (a
database server that hangs rather than refuses: its queries wait, they do not fail)."""


class Runner(Protocol):
    """Where a pass runs: the HTTP service hands in its ops channel (`http/channels.py`)."""

    async def run(self, work: Callable[[], T]) -> T: ...

    async def thread(self, work: Callable[[], T]) -> T: ...


def rest_s(
    deadlines_whole: bool, prune_more: bool, prune_took_s: float, interval_s: float
) -> float:
    """How long the sweeper rests before its next pass: not at all while whole batches of
    passed deadlines come back, `PRUNE_PACE` times its last prune batch while a retention
    backlog lasts (never longer than the interval), else the interval."""
    if deadlines_whole:
        return 0.0
    if prune_more:
        return min(interval_s, PRUNE_PACE * prune_took_s)
    return interval_s


class Sweeper:
    """Sweeps every `interval_s`, at once again while whole batches of passed deadlines come
    back, and at a pace while a retention backlog lasts (`rest_s`).

    Its passes also tell whether the store answers (`/healthz` reports it): see
    `store_failure`.
    """

    def __init__(
        self,
        service: SchedulingService,
        channel: Runner,
        interval_s: float,
        *,
        stalled_after_s: float = STALLED_AFTER_S,
        monotonic: Callable[[], float] = time.monotonic,
        forget: Callable[[Job], None] = lambda job: None,
        on_pruned: Callable[[int], None] = lambda count: None,
    ) -> None:
        self._service = service
        self._channel = channel
        self._interval_s = interval_s
        self._stalled_after_s = stalled_after_s
        self._monotonic = monotonic
        self._failure: str | None = None
        self._pass_began: float | None = None
        self._forget = forget
        self._on_pruned = on_pruned
        self._release = False
        """Deleted rows may have left free pages to give back."""
        self.running = False
        self.swept = 0
        self.pruned = 0

    @property
    def store_failure(self) -> str | None:
        """Why the store does not answer, or None: the error of the latest pass while that
        pass could not reach the store, or a pass that has not come back for
        `stalled_after_s`; None again after a pass that could."""
        began = self._pass_began
        if began is not None:
            waited = self._monotonic() - began
            if waited >= self._stalled_after_s:
                return f"the store has not answered for {waited:.0f} s"
        return self._failure

    async def run(self, stop: anyio.Event) -> None:
        self.running = True
        try:
            while not stop.is_set():
                self._pass_began = self._monotonic()
                try:
                    applied = await self._channel.run(self._service.sweep)
                except MoonrunError as error:  # the store is down: log, and try again later
                    log.warning("sweep failed", extra={"fields": {"error": error.message}})
                    if isinstance(error, StoreUnavailable):
                        self._failure = error.message
                    applied = 0
                else:
                    self._failure = None
                finally:
                    self._pass_began = None
                self.swept += applied
                began = self._monotonic()
                _, more = await self._prune()
                whole = applied >= self._service.settings.sweep_batch
                rest = rest_s(whole, more, self._monotonic() - began, self._interval_s)
                if rest > 0:
                    with anyio.move_on_after(rest):
                        await stop.wait()
        finally:
            self.running = False

    async def _prune(self) -> tuple[int, bool]:
        """One batch of retention, then some of the space it freed given back; answers how
        many jobs it deleted, and whether more is waiting (a whole batch, or a whole release)."""
        settings = self._service.settings
        if settings.retain_finished_s <= 0:
            return 0, False
        try:
            deleted = await self._channel.thread(self._prune_batch)
            released = await self._channel.thread(self._release_space) if self._release else 0
        except MoonrunError as error:
            log.warning("prune failed", extra={"fields": {"error": error.message}})
            if isinstance(error, StoreUnavailable):
                self._failure = error.message
            return 0, False
        if deleted:
            self.pruned += deleted
            self._on_pruned(deleted)
        whole = min(settings.prune_batch, PRUNE_BATCH_LIMIT)
        return deleted, deleted >= whole or released >= RELEASE_PAGES

    def _prune_batch(self) -> int:
        deleted = len(self._service.prune(self._forget))
        self._release = self._release or deleted > 0
        return deleted

    def _release_space(self) -> int:
        released = self._service.release_space(RELEASE_PAGES)
        self._release = released >= RELEASE_PAGES
        return released
