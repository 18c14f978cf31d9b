"""Channels: each request path has its own concurrency limit and its own worker threads.

A request is admitted only if its channel has room, else it is refused at once with 429
`channel_busy`; the Runs' control and jobs channels instead keep a short line (`line`
requests, each waiting at most LINE_WAIT_S): signed requests of known Runs only, so the line
is bounded by the fleet, and a heartbeat that arrives in the instant a store stall filled its
channel waits a moment instead of failing (at 2,000 Runs over MySQL a stall of a few tens of
milliseconds refused about 20 heartbeats and 20 claims in 30 s). Store and file work runs on
the channel's own thread limiter,
so a channel whose work blocks (a stuck artifact disk, say) cannot take threads from another.
Over a store whose calls are short and local (MemoryStore, and FileStore, whose reads come
from the page cache and whose writes wait for one fsync), store work runs inline on the event
loop instead: measured end to end, a thread hop and the GIL handoffs around it cost more than
the work (FileStore: 730 against 510 no-op jobs/s, p50 5.3 against 7.2 ms). Artifacts always
get threads (they write files of any size), and so does CPU-heavy work (password hashing).
Over FileStore the inline work is handed to the store's loop flusher (`group`): the calls made
while a COMMIT is on its way share the next one, and each is answered once it is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from moonrun.errors import ChannelBusy

T = TypeVar("T")

LINE_WAIT_S = 1.0
"""How long a request waits in its channel's line for a place before it is refused: well
inside a Run's control (5 s) and jobs (10 s) timeouts."""

Group = Callable[..., Awaitable[Any]]
"""Applies inline work in the store's next group commit, answered once that is committed
(FileStore's `run_in_group`)."""


class Admission:
    """One request's place on a channel; a waiting request gives it up while it waits."""

    __slots__ = ("_channel", "held")

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self.held = False

    def enter(self) -> None:
        """Take a place now, or ChannelBusy."""
        channel = self._channel
        if channel.in_flight >= channel.limit:
            raise ChannelBusy(f"the {channel.name} channel is at its limit of {channel.limit}")
        channel.in_flight += 1
        self.held = True

    async def enter_in_line(self) -> None:
        """Take a place now, or wait for one in the channel's line (at most LINE_WAIT_S);
        ChannelBusy when the channel has no line, its line is full, or no place came."""
        channel = self._channel
        if channel.in_flight < channel.limit or len(channel.waiting) >= channel.line:
            self.enter()
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        channel.waiting.append(turn)
        try:
            async with asyncio.timeout(LINE_WAIT_S):
                await turn
        except TimeoutError:
            if not turn.done() or turn.cancelled():  # else the place came as time ran out
                raise ChannelBusy(
                    f"the {channel.name} channel stayed at its limit of {channel.limit} for "
                    f"{LINE_WAIT_S:g} s"
                ) from None
        except BaseException:  # the request was cancelled (its client left) while in line
            if turn.done() and not turn.cancelled():
                self.held = True  # handed a place meanwhile: passed on to the next
                self.leave()
            raise
        finally:
            with contextlib.suppress(ValueError):  # handed over: already out of the line
                channel.waiting.remove(turn)
        self.held = True

    def leave(self) -> None:
        """Give the place up: to the first request in the channel's line, if one waits."""
        if not self.held:
            return
        self.held = False
        channel = self._channel
        waiting = channel.waiting
        while waiting:
            turn = waiting.popleft()
            if not turn.done():  # one that gave up is left out
                turn.set_result(None)  # the place passes on; in_flight stays as it is
                return
        channel.in_flight -= 1

    def __enter__(self) -> Admission:
        self.enter()
        return self

    def __exit__(self, *_: object) -> None:
        self.leave()


class Channel:
    """One request path: at most `limit` requests in flight, on `limit` threads of its own,
    and up to `line` more waiting for a place (LINE_WAIT_S at most)."""

    def __init__(
        self,
        name: str,
        limit: int,
        *,
        line: int = 0,
        inline: bool = False,
        group: Group | None = None,
    ) -> None:
        self.name = name
        self.limit = limit
        self.line = line
        self.waiting: deque[asyncio.Future[None]] = deque()
        """The requests waiting for a place, first come first."""
        self.inline = inline
        self._group = group
        self._threads = _Threads(max(limit, 1), f"moonrun-{name}")
        self.in_flight = 0

    def admit(self) -> Admission:
        """`with channel.admit():` holds one of the channel's places for a request, or refuses
        it now (ChannelBusy)."""
        return Admission(self)

    async def run(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run store work on one of this channel's threads, or inline on the event loop when
        the channel is inline (its store's calls are short and local): in the store's next
        group commit when it has one."""
        if self.inline:
            if self._group is not None:
                call = functools.partial(work, *args, **kwargs) if kwargs else work
                result: T = await self._group(call, *(() if kwargs else args))
                return result
            return work(*args, **kwargs)
        return await self.thread(work, *args, **kwargs)

    async def thread(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `work` on one of this channel's threads, inline channel or not: for work that
        takes long without the store (hashing a password takes tens of milliseconds)."""
        call = functools.partial(work, *args, **kwargs) if kwargs else work
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._threads.submit(call, () if kwargs else args, future)
        return await future

    def close(self) -> None:
        """Let the channel's threads end once their work is done."""
        self._threads.close()


class _Threads:
    """Up to `size` threads, started as work needs them, taking work from one queue.

    Every request makes at least one trip here, so it is kept to a queue put and one wake-up
    of the event loop (an executor and its future-chaining cost about as much again).
    """

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started = 0
        self._idle = 0

    def submit(self, work: Callable[..., Any], args: Any, future: asyncio.Future[Any]) -> None:
        with self._lock:
            start = self._idle == 0 and self._started < self._size
            if start:
                self._started += 1
            else:
                self._idle -= 1  # this item will wake an idle thread
        self._work.put((work, args, future, future.get_loop()))
        if start:
            threading.Thread(target=self._serve, name=self._name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            work, args, future, loop = item
            try:
                outcome, failed = work(*args), False
            except BaseException as error:
                outcome, failed = error, True
            with self._lock:  # counted idle before its answer can bring the next request
                self._idle += 1
            # A closed loop (RuntimeError) has nobody left waiting for this answer.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, outcome, failed)

    def close(self) -> None:
        with self._lock:
            started = self._started
        for _ in range(started):
            self._work.put(None)


def _settle(future: asyncio.Future[Any], outcome: Any, failed: bool) -> None:
    if future.cancelled():
        return
    if failed:
        if isinstance(outcome, StopIteration):  # a future refuses it, and would never settle
            wrapped = RuntimeError(f"work raised StopIteration: {outcome!r}")
            outcome = wrapped.with_traceback(outcome.__traceback__)
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


@dataclass(frozen=True)
class Channels:
    """The platform's request paths; none shares a limit or a thread with another."""

    control: Channel
    jobs: Channel
    sessions: Channel
    """Registrations: apart from the control channel, so that a fleet registering at once
    (several writes each, on threads) never takes the places its heartbeats need."""
    logs: Channel
    artifacts: Channel
    user: Channel
    ops: Channel
    anonymous: Channel
    """Requests nobody has vouched for yet (no credentials, or a console page without a
    session), while their bodies arrive: bounded apart from what Runs and signed-in users
    need, and never a place on their own route's channel."""

    def close(self) -> None:
        for channel in (
            self.control,
            self.jobs,
            self.sessions,
            self.logs,
            self.artifacts,
            self.user,
            self.ops,
            self.anonymous,
        ):
            channel.close()

    @classmethod
    def with_limits(
        cls,
        control: int = 16,
        jobs: int = 32,
        control_line: int = 64,
        jobs_line: int = 128,
        sessions: int = 8,
        logs: int = 8,
        artifacts: int = 4,
        user: int = 16,
        ops: int = 4,
        anonymous: int = 64,
        *,
        inline: bool = False,
        group: Group | None = None,
    ) -> Channels:
        """Channels with these limits (the Runs' control and jobs channels with lines of these
        lengths); `inline` runs store work on the event loop (for a store whose calls are
        short and local), in `group`'s commits when given. Artifacts always get threads."""
        return cls(
            Channel("control", control, line=control_line, inline=inline, group=group),
            Channel("jobs", jobs, line=jobs_line, inline=inline, group=group),
            Channel("sessions", sessions, inline=inline, group=group),
            Channel("logs", logs, inline=inline, group=group),
            Channel("artifacts", artifacts),
            Channel("user", user, inline=inline, group=group),
            Channel("ops", ops, inline=inline, group=group),
            Channel("anonymous", anonymous, inline=inline, group=group),
        )
