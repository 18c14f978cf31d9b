"""Waiting requests (long-poll claims, blocking job reads): woken by committed job changes.

The service tells `Watch` about every job write it committed (`job_changed`, from any
thread); a request waiting on that job, or on claimable work for that job's endpoint, is
woken on the event loop at once. Wake-ups are a shortcut, never the truth: a woken request
reads the store again, and every wait also looks again within `recheck_s` (jittered), so a
change made by another platform process over the same MySQL store is seen within that time.
On PostgreSQL the processes also tell one another (`Announcer` sends this process's changes to
its `Peers`; what the others announce arrives as `peer_changed`), so a change made on one
process wakes the waiters of every other at once; the re-check only covers a lost
notification.

A waiting request lends the service what it needs to wait well (`Waiting`): where its store
work runs, its place on its channel (given up while it waits), and a way to learn that its
client left (its waiter is then dropped at once). How many may wait is bounded in rooms
(`WaitLimits`): Runs' claims per endpoint and in all, users' reads per user, per client
address and in all, so that no number of waiting reads can keep a Run's claim from waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from moonrun.errors import ChannelBusy, TooManyWaiting
from moonrun.scheduling.jobs import Job
from moonrun.service.config import WaitLimits

T = TypeVar("T")

FULL_CHANNEL_PAUSE_S = 0.05
"""How long, at most, a waiting request whose channel is full at its next look waits for a
place (jittered), instead of being refused."""
JOB = "job"
"""Waiters on one job (keyed by its id): woken when it changes."""
GROUP = "group"
"""Waiters on a fan-out group (keyed by its id): woken when one of its jobs changes state."""
ENDPOINT = "endpoint"
"""Waiters on an endpoint's work (keyed by its id): woken when one of its jobs becomes
claimable or one of its active jobs ends (a place of its capacity frees)."""
CANCELS = "cancels"
"""Waiters for cancel intents of an endpoint's active attempts (keyed by the endpoint's id):
woken when one of its accepted or running jobs is asked to cancel."""


class Place(Protocol):
    """A request's place on its channel: given up while it waits, taken again to go on."""

    def leave(self) -> None: ...

    def enter(self) -> None: ...


class Runner(Protocol):
    """Runs store work where the request's channel runs it (its own threads, or inline)."""

    def __call__(self, work: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a request lends the service while it waits."""

    run: Runner
    place: Place
    gone: Callable[[], Awaitable[object]]
    """Returns once the request's client has left (its connection closed)."""
    address: str = ""
    """The client's address: reads are bounded per address too."""


@dataclass(frozen=True, slots=True)
class Room:
    """A bound on waiting requests: at most `limit` of them hold `key` at once."""

    key: str
    limit: int
    what: str
    """Who waits in it, for the refusal's message."""


@dataclass(eq=False)
class Waiter:
    """A waiting request: the event set when it should look again."""

    loop: asyncio.AbstractEventLoop
    event: asyncio.Event
    wanted: Callable[[Job], bool] | None = None
    """Woken only by a change into a record this accepts (by any change without it)."""
    rooms: Sequence[Room] = ()
    gone: bool = False
    """Its client left: it looks no more."""

    def client_left(self) -> bool:
        return self.gone


class Watch:
    """Who waits for which job or endpoint, how many wait in each room, and waking them."""

    def __init__(self, limits: WaitLimits | None = None) -> None:
        self.limits = limits or WaitLimits()
        self.recheck_s = self.limits.recheck_s
        self.draw: Callable[[], float] = random.random
        """Uniform in [0, 1): each look-again pause is between half `recheck_s` and all of
        it, so that waits which started together do not look again together."""
        self._lock = threading.Lock()
        self._waiters: dict[tuple[str, str], set[Waiter]] = {}
        self._held: dict[str, int] = {}
        """Room key -> requests waiting in it (rooms nobody waits in are left out)."""
        self._waiting = 0
        self.wakeups = 0
        """Waiters woken so far (for tests)."""
        self.stopping = False
        """The platform is stopping: every wait answers with what it read last, at once."""

    def _stopped(self) -> bool:
        # A call, not the attribute: `stop()` sets it from elsewhere while a wait is asleep.
        return self.stopping

    def stop(self) -> None:
        """Wake every waiting request to answer now, and let none wait from here on: a
        stopping platform does not hold Runs' claims and users' reads until its shutdown
        timeout. Safe from a signal handler or another thread."""
        self.stopping = True
        with self._lock:
            waiters = [waiter for held in self._waiters.values() for waiter in held]
        for waiter in waiters:
            with contextlib.suppress(RuntimeError):  # a loop already closed has no waiter left
                waiter.loop.call_soon_threadsafe(waiter.event.set)

    @property
    def waiting(self) -> int:
        """Requests waiting right now."""
        return self._waiting

    def held(self, room: str) -> int:
        """Requests waiting in a room right now (`claims` and `reads` count every one)."""
        return self._held.get(room, 0)

    def claim_rooms(self, endpoint_id: str) -> tuple[Room, ...]:
        limits = self.limits
        return (
            Room("claims", limits.claims, "claims"),
            Room(f"claims:{endpoint_id}", limits.claims_per_endpoint, "claims of this endpoint"),
        )

    def read_rooms(self, user_id: str, address: str) -> tuple[Room, ...]:
        limits = self.limits
        return (
            Room("reads", limits.reads, "job reads"),
            Room(f"reads:user:{user_id}", limits.reads_per_user, "job reads of this user"),
            Room(f"reads:address:{address}", limits.reads_per_address, "job reads from here"),
        )

    def job_changed(self, job: Job, before: Job | None) -> None:
        """A job write was committed: wake its readers, its endpoint's waiting claims when
        the job became claimable or freed a place of the endpoint's capacity, and its group's
        readers when it changed state."""
        if self._waiting == 0:
            return
        with self._lock:
            woken = [
                waiter
                for waiter in self._waiters.get((JOB, job.id), ())
                if waiter.wanted is None or waiter.wanted(job)
            ]
            if concerns_claims(job, before):
                woken.extend(self._waiters.get((ENDPOINT, job.endpoint_id), ()))
            if (
                job.state.is_active
                and job.cancel is not None
                and (before is None or before.cancel is None)
            ):
                woken.extend(self._waiters.get((CANCELS, job.endpoint_id), ()))
            if job.group_id is not None and (before is None or before.state is not job.state):
                woken.extend(self._waiters.get((GROUP, job.group_id), ()))
            self.wakeups += len(woken)
        for waiter in woken:
            waiter.loop.call_soon_threadsafe(waiter.event.set)

    def peer_changed(self, job_id: str, endpoint_id: str | None) -> None:
        """Another platform process committed a change of the job (and, with `endpoint_id`,
        one that concerns that endpoint's waiting claims): wake every reader of the job, and
        those claims, to read the store again (the record itself did not travel)."""
        if self._waiting == 0:
            return
        with self._lock:
            woken = list(self._waiters.get((JOB, job_id), ()))
            if endpoint_id is not None:
                woken.extend(self._waiters.get((ENDPOINT, endpoint_id), ()))
            self.wakeups += len(woken)
        for waiter in woken:
            waiter.loop.call_soon_threadsafe(waiter.event.set)

    def peers_missed(self) -> None:
        """Other processes' changes may have gone unheard (the listener was away): wake every
        waiter to read the store again."""
        if self._waiting == 0:
            return
        with self._lock:
            woken = [waiter for held in self._waiters.values() for waiter in held]
            self.wakeups += len(woken)
        for waiter in woken:
            with contextlib.suppress(RuntimeError):  # its loop closed: nothing left to wake
                waiter.loop.call_soon_threadsafe(waiter.event.set)

    def job_touched(self, job_id: str) -> None:
        """Something beside the job record that its readers may wait for changed (its logs
        were completed): wake every reader of the job, to read it again."""
        if self._waiting == 0:
            return
        with self._lock:
            woken = list(self._waiters.get((JOB, job_id), ()))
            self.wakeups += len(woken)
        for waiter in woken:
            waiter.loop.call_soon_threadsafe(waiter.event.set)

    def register(
        self,
        topic: str,
        key: str,
        rooms: Sequence[Room] = (),
        wanted: Callable[[Job], bool] | None = None,
    ) -> Waiter:
        """A new waiter on `(topic, key)`, holding a place in each of `rooms`; TooManyWaiting
        (and nothing held) when one of them is full."""
        waiter = Waiter(asyncio.get_running_loop(), asyncio.Event(), wanted, rooms)
        with self._lock:
            for room in rooms:
                if self._held.get(room.key, 0) >= room.limit:
                    raise TooManyWaiting(f"{room.limit} {room.what} are waiting already")
            for room in rooms:
                self._held[room.key] = self._held.get(room.key, 0) + 1
            self._waiters.setdefault((topic, key), set()).add(waiter)
            self._waiting += 1
        return waiter

    def unregister(self, waiter: Waiter, topic: str, key: str) -> None:
        with self._lock:
            waiters = self._waiters[(topic, key)]
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[(topic, key)]
            for room in waiter.rooms:
                left = self._held[room.key] - 1
                if left:
                    self._held[room.key] = left
                else:
                    del self._held[room.key]
            self._waiting -= 1

    @contextmanager
    def job(self, job_id: str, wanted: Callable[[Job], bool] | None = None) -> Iterator[Waiter]:
        """Woken whenever the job changes into a record `wanted` accepts (any change without
        it), for as long as the block runs (in no room: for the platform's own use)."""
        waiter = self.register(JOB, job_id, (), wanted)
        try:
            yield waiter
        finally:
            self.unregister(waiter, JOB, job_id)

    async def wait_until(
        self,
        read: Callable[[], T],
        done: Callable[[T], bool],
        *,
        on: tuple[str, str],
        rooms: Sequence[Room],
        deadline: float,
        waiting: Waiting,
        wanted: Callable[[Job], bool] | None = None,
        due_s: Callable[[T], float | None] | None = None,
    ) -> T:
        """`read()` (through `waiting.run`) until `done` holds of what it read, the
        `deadline` (`time.monotonic()`) passes or the client leaves; what it read last.

        Waits on `on` (a topic and a key) in `rooms` (TooManyWaiting at once, before any read,
        when one is full). Between reads, the request holds no place on its channel; it looks
        again when woken, after `recheck_s`, or after `due_s(what it read)` seconds when that
        says something becomes due sooner.
        """
        topic, key = on
        waiter = self.register(topic, key, rooms, wanted)
        listener = asyncio.create_task(_notice_gone(waiting.gone, waiter))
        try:
            while True:
                waiter.event.clear()  # registered, then read: no wake-up falls in between
                value = await waiting.run(read)
                remaining = deadline - time.monotonic()
                if done(value) or remaining <= 0 or waiter.client_left() or self.stopping:
                    return value
                pause = min(remaining, self.recheck_s * (0.5 + 0.5 * self.draw()))
                due = due_s(value) if due_s is not None else None
                if due is not None:
                    pause = min(pause, max(0.001, due))
                waiting.place.leave()
                await _wait_for(waiter.event, pause)
                if waiter.client_left():  # nobody reads the answer: no place, no store read for it
                    return value
                if self._stopped():  # answered with what was read last: an empty grant, a view
                    return value
                if not await self._place_again(waiter, waiting, deadline):
                    return value
        finally:
            listener.cancel()
            self.unregister(waiter, topic, key)

    async def _place_again(self, waiter: Waiter, waiting: Waiting, deadline: float) -> bool:
        """Take the request's place on its channel again to look once more; while the
        channel is full, wait (a short jittered pause, or a wake-up) and try again: a request
        already admitted is not refused because others' work fills its channel at that
        instant (a fleet's claims, re-checking together, did so at 2,000 Runs on MySQL).
        False if it should answer with what it read last (its deadline passed, its client
        left, the platform stops)."""
        while True:
            try:
                waiting.place.enter()
                return True
            except ChannelBusy:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            waiter.event.clear()
            pause = FULL_CHANNEL_PAUSE_S * (0.5 + 0.5 * self.draw())
            await _wait_for(waiter.event, min(remaining, pause))
            if waiter.client_left() or self._stopped():
                return False


def concerns_claims(job: Job, before: Job | None) -> bool:
    """Whether a change may let a waiting claim of the job's endpoint be granted: the job
    became claimable, or it left an active state (a place of the endpoint's capacity freed)."""
    frees = before is not None and before.state.is_active and not job.state.is_active
    return job.claimable_at is not None or frees


class Peers(Protocol):
    """The other platform processes over the same store (`store/pg_wakeups.py` on
    PostgreSQL), told of this process's committed job changes so that they wake their own
    waiters (`Watch.peer_changed`)."""

    def announce(self, job_id: str, endpoint_id: str | None) -> None: ...


class Announcer:
    """Tells `peers` of every committed job write (a `JobEvents` for `SchedulingService.listen`):
    the job's id, and its endpoint's when the change concerns the endpoint's waiting claims."""

    def __init__(self, peers: Peers) -> None:
        self._peers = peers

    def job_changed(self, job: Job, before: Job | None) -> None:
        self._peers.announce(job.id, job.endpoint_id if concerns_claims(job, before) else None)


async def _notice_gone(gone: Callable[[], Awaitable[object]], waiter: Waiter) -> None:
    """Mark the waiter gone, and wake it, once its client has left."""
    await gone()
    waiter.gone = True
    waiter.event.set()


async def _wait_for(event: asyncio.Event, timeout_s: float) -> None:
    """Until `event` is set or `timeout_s` passed (whichever comes first)."""
    if event.is_set() or timeout_s <= 0:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
