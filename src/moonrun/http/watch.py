"""Wake-ups for waiting requests: a long-polling claim, a blocking read of a job.

The service tells `Watch` about every job write it committed (`job_changed`, from any
thread); a request waiting on that job, or on claimable work for that job's endpoint, is
woken on the event loop at once. Wake-ups are a shortcut, never the truth: a woken request
reads the store again, and every wait also ends after `recheck_s`, so a change made by another
platform process over the same MySQL store is seen within that time.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from moonrun.errors import ChannelBusy
from moonrun.scheduling.jobs import Job


@dataclass(eq=False)
class Waiter:
    """A waiting request: the event set when it should look again, and for a job's reader the
    latest committed record it wanted (so it may answer without reading the store again)."""

    loop: asyncio.AbstractEventLoop
    event: asyncio.Event
    wanted: Callable[[Job], bool] | None = None
    latest: Job | None = None


class Watch:
    """Who waits for which job or endpoint, and waking them."""

    def __init__(self, recheck_s: float = 1.0, max_waiting: int = 4096) -> None:
        self.recheck_s = recheck_s
        self.max_waiting = max_waiting
        self._lock = threading.Lock()
        self._jobs: dict[str, set[Waiter]] = {}
        self._endpoints: dict[str, set[Waiter]] = {}
        self._waiting = 0
        self.wakeups = 0
        """Waiters woken so far (for tests)."""

    @property
    def waiting(self) -> int:
        """Requests waiting right now."""
        return self._waiting

    def job_changed(self, job: Job, before: Job | None) -> None:
        """A job write was committed: wake its readers, and its endpoint's waiting claims when
        the job became claimable or freed a place of the endpoint's capacity."""
        if self._waiting == 0:
            return
        frees = before is not None and before.state.is_active and not job.state.is_active
        with self._lock:
            woken = []
            for waiter in self._jobs.get(job.id, ()):
                if waiter.wanted is None or waiter.wanted(job):
                    if waiter.latest is None or waiter.latest.version < job.version:
                        waiter.latest = job  # notices of one job may arrive out of order
                    woken.append(waiter)
            if job.claimable_at is not None or frees:
                woken.extend(self._endpoints.get(job.endpoint_id, ()))
            self.wakeups += len(woken)
        for waiter in woken:
            waiter.loop.call_soon_threadsafe(waiter.event.set)

    def has_room(self) -> bool:
        """Whether another request may wait now (registering is refused beyond the limit)."""
        return self._waiting < self.max_waiting

    @contextmanager
    def job(self, job_id: str, wanted: Callable[[Job], bool] | None = None) -> Iterator[Waiter]:
        """Woken whenever the job changes into a record `wanted` accepts (any change without
        it), for as long as the block runs."""
        with self._registered(self._jobs, job_id, wanted) as waiter:
            yield waiter

    @contextmanager
    def claims(self, endpoint_id: str) -> Iterator[Waiter]:
        """Woken whenever the endpoint may have claimable work."""
        with self._registered(self._endpoints, endpoint_id) as waiter:
            yield waiter

    @contextmanager
    def _registered(
        self,
        table: dict[str, set[Waiter]],
        key: str,
        wanted: Callable[[Job], bool] | None = None,
    ) -> Iterator[Waiter]:
        waiter = Waiter(asyncio.get_running_loop(), asyncio.Event(), wanted)
        with self._lock:
            if self._waiting >= self.max_waiting:
                raise ChannelBusy(f"{self.max_waiting} requests are waiting already")
            table.setdefault(key, set()).add(waiter)
            self._waiting += 1
        try:
            yield waiter
        finally:
            with self._lock:
                waiters = table[key]
                waiters.discard(waiter)
                if not waiters:
                    del table[key]
                self._waiting -= 1


async def wait_for(event: asyncio.Event, timeout_s: float) -> None:
    """Until `event` is set or `timeout_s` passed (whichever comes first)."""
    if event.is_set() or timeout_s <= 0:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
