"""Channels: each request path has its own concurrency limit and its own worker threads.

A request is admitted only if its channel has room, else it is refused at once with 429
`channel_busy` (never queued). Store and file work runs on the channel's own thread limiter,
so a channel whose work blocks (a stuck artifact disk, say) cannot take threads from another.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from moonrun.errors import ChannelBusy

T = TypeVar("T")


class Channel:
    """One request path: at most `limit` requests in flight, on `limit` threads of its own."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self._limiter = anyio.CapacityLimiter(limit)
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        """Hold one of the channel's places for a request, or refuse it now."""
        if self._in_flight >= self.limit:
            raise ChannelBusy(f"the {self.name} channel is at its limit of {self.limit}")
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    async def run(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking `work` on one of this channel's threads."""
        return await anyio.to_thread.run_sync(
            functools.partial(work, *args, **kwargs), limiter=self._limiter
        )


@dataclass(frozen=True)
class Channels:
    """The platform's request paths; none shares a limit or a thread with another."""

    control: Channel
    jobs: Channel
    logs: Channel
    artifacts: Channel
    user: Channel
    ops: Channel

    @classmethod
    def with_limits(
        cls,
        control: int = 16,
        jobs: int = 32,
        logs: int = 8,
        artifacts: int = 4,
        user: int = 16,
        ops: int = 4,
    ) -> Channels:
        return cls(
            Channel("control", control),
            Channel("jobs", jobs),
            Channel("logs", logs),
            Channel("artifacts", artifacts),
            Channel("user", user),
            Channel("ops", ops),
        )
