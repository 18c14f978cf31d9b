"""The sync client's tests run against `AsyncClient` too: `connect` makes either client.

`Blocking` drives an `AsyncClient` from synchronous test code, one event loop per client: each
coroutine method runs to its end, each async iterator (`jobs`, `logs`) becomes an iterator
that runs the loop for one item at a time, so a test can take a followed log's first line,
call the client meanwhile, then read on, as it does with `Client`. `connect("async", ...)`
takes the sync client's options: a sync `sleep` is awaited as a coroutine that calls it, and a
transport given must be an `httpx.MockTransport` or a `Recording` (both transports serve
either client).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import Any, Literal, cast

import httpx

from moonrun.client import AsyncClient, Client

Flavour = Literal["sync", "async"]
FLAVOURS: tuple[Flavour, ...] = ("sync", "async")


class Blocking:
    """An `AsyncClient` with `Client`'s blocking face (see the module's docstring)."""

    def __init__(self, client: AsyncClient) -> None:
        self.inner = client
        self._runner = asyncio.Runner()
        self._closed = False

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        method = getattr(AsyncClient, name, None)
        if inspect.isasyncgenfunction(method):
            return lambda *args, **kwargs: self._items(found(*args, **kwargs))
        if inspect.iscoroutinefunction(method):
            return lambda *args, **kwargs: self._runner.run(found(*args, **kwargs))
        return found

    def _items(self, items: AsyncIterator[Any]) -> Iterator[Any]:
        async def step() -> Any:
            return await anext(items)

        try:
            while True:
                try:
                    item = self._runner.run(step())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if not self._closed:  # one left early ends on its loop (closing the loop ends it)
                self._runner.run(aclose(items))

    def close(self) -> None:
        try:
            self._runner.run(self.inner.close())
        finally:
            self._closed = True
            self._runner.close()

    def __enter__(self) -> Blocking:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


async def aclose(items: AsyncIterator[Any]) -> None:
    closing = getattr(items, "aclose", None)
    if closing is not None:
        await closing()


def awaitable(sleep: Callable[[float], Any]) -> Callable[[float], Any]:
    async def asleep(seconds: float) -> None:
        sleep(seconds)

    return asleep


class Recording(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """Forwards every request to the real platform and keeps what was sent; serves either
    client."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.inner_async = httpx.AsyncHTTPTransport()
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return self.inner.handle_request(request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return await self.inner_async.handle_async_request(request)

    def close(self) -> None:
        self.inner.close()

    async def aclose(self) -> None:
        await self.inner_async.aclose()

    def paths(self, suffix: str) -> list[str]:
        return [r.url.path for r in self.sent if r.url.path.endswith(suffix)]


def connect(flavour: Flavour, platform: str, token: str, **options: Any) -> Client:
    """A `Client`, or an `AsyncClient` behind `Blocking` (typed as the `Client` whose face it
    has), with the sync client's options."""
    if flavour == "sync":
        return Client(platform, token, **options)
    if "sleep" in options:
        options["sleep"] = awaitable(options["sleep"])
    return cast(Client, Blocking(AsyncClient(platform, token, **options)))
