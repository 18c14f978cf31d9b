"""Channels: each request path has its own concurrency limit and its own worker threads.

A request is admitted only if its channel has room, else it is refused at once with 429
`channel_busy` (never queued). Store and file work runs on the channel's own thread limiter,
so a channel whose work blocks (a stuck artifact disk, say) cannot take threads from another.
Over a store that never blocks (MemoryStore), the service channels run their work inline on
the event loop instead: a thread hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from moonrun.errors import ChannelBusy

T = TypeVar("T")


class Admission:
    """One request's place on a channel; a waiting request gives it up while it waits."""

    __slots__ = ("_channel", "held")

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self.held = False

    def enter(self) -> None:
        channel = self._channel
        if channel.in_flight >= channel.limit:
            raise ChannelBusy(f"the {channel.name} channel is at its limit of {channel.limit}")
        channel.in_flight += 1
        self.held = True

    def leave(self) -> None:
        if self.held:
            self._channel.in_flight -= 1
            self.held = False


class Channel:
    """One request path: at most `limit` requests in flight, on `limit` threads of its own."""

    def __init__(self, name: str, limit: int, *, inline: bool = False) -> None:
        self.name = name
        self.limit = limit
        self.inline = inline
        # Threads start on first use and are reused; a plain executor hop costs about half
        # of anyio's (measured: 20 against 45 us), and every request makes at least one.
        self._threads = ThreadPoolExecutor(max(limit, 1), thread_name_prefix=f"moonrun-{name}")
        self.in_flight = 0

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[Admission]:
        """Hold one of the channel's places for a request, or refuse it now."""
        admission = Admission(self)
        admission.enter()
        try:
            yield admission
        finally:
            admission.leave()

    async def run(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking `work` on one of this channel's threads (inline when it cannot block)."""
        if self.inline:
            return work(*args, **kwargs)
        call = functools.partial(work, *args, **kwargs) if kwargs else work
        loop = asyncio.get_running_loop()
        result: T = await loop.run_in_executor(self._threads, call, *([] if kwargs else args))
        return result

    def close(self) -> None:
        """Let the channel's threads end once their work is done."""
        self._threads.shutdown(wait=False)


@dataclass(frozen=True)
class Channels:
    """The platform's request paths; none shares a limit or a thread with another."""

    control: Channel
    jobs: Channel
    logs: Channel
    artifacts: Channel
    user: Channel
    ops: Channel

    def close(self) -> None:
        for channel in (self.control, self.jobs, self.logs, self.artifacts, self.user, self.ops):
            channel.close()

    @classmethod
    def with_limits(
        cls,
        control: int = 16,
        jobs: int = 32,
        logs: int = 8,
        artifacts: int = 4,
        user: int = 16,
        ops: int = 4,
        *,
        inline: bool = False,
    ) -> Channels:
        """Channels with these limits; `inline` runs Run's channels and ops on the loop (for a
        store whose calls never block). Artifacts always get threads (they write files), and
        so do users (signing in hashes passwords, which takes tens of milliseconds)."""
        return cls(
            Channel("control", control, inline=inline),
            Channel("jobs", jobs, inline=inline),
            Channel("logs", logs, inline=inline),
            Channel("artifacts", artifacts),
            Channel("user", user),
            Channel("ops", ops, inline=inline),
        )
