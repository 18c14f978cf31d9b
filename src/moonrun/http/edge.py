"""The HTTP edge: a deadline on every request head and a cap on open connections.

uvicorn's httptools protocol has neither. Its keep-alive timer is cancelled by any byte and
never armed on a fresh connection, so a client that trickles a header line now and then holds
its socket (and a file descriptor) for as long as it likes; enough of them exhaust the
descriptors and the platform stops accepting, /healthz included.

Here a connection waiting for a request head (fresh, or idle after an answer) must complete
that head within `header_timeout_s` of starting to wait, however many bytes it sends;
otherwise it is closed. And at most `max_connections` are open at once: one more evicts the
connection that has waited longest for its head, or is closed itself when every open
connection is busy with a request. Both close the socket unanswered, so the descriptor comes
back at once.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

FD_RESERVE = 128
"""Descriptors kept back from the connection cap for the store, logs and the event loop."""
MAX_DEFAULT_CONNECTIONS = 65536


@dataclass(frozen=True)
class EdgeLimits:
    """How long a request head may take, and how many connections may be open at once."""

    header_timeout_s: float = 10.0
    max_connections: int = 1024 - FD_RESERVE


def default_max_connections(open_files_limit: int) -> int:
    """A connection cap under the process's open-files limit (`RLIMIT_NOFILE`, soft; negative
    for unlimited), leaving `FD_RESERVE` descriptors for everything else."""
    if open_files_limit < 0:
        return MAX_DEFAULT_CONNECTIONS
    return max(16, min(MAX_DEFAULT_CONNECTIONS, open_files_limit - FD_RESERVE))


class _Edge:
    """What the connections of one server share: which are open, which wait for a head."""

    def __init__(self, limits: EdgeLimits) -> None:
        self.limits = limits
        self.open: set[GuardedProtocol] = set()
        self.waiting: OrderedDict[GuardedProtocol, None] = OrderedDict()
        """Connections waiting for a request head, the longest waiting first."""


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request-head deadline and the connection cap."""

    edge: _Edge
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        edge = self.edge
        edge.open.add(self)
        self._wait_for_head()
        if len(edge.open) > edge.limits.max_connections:
            oldest = next(iter(edge.waiting))
            # self waits too, so there is always one; it is the oldest only when every other
            # open connection is busy with a request.
            oldest.drop()

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self.edge.waiting.pop(self, None)
        self._cancel_deadline()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        idle = self.cycle is None or self.cycle.response_complete  # else a pipelined one runs
        if idle and not self.transport.is_closing() and self in self.edge.open:
            self._wait_for_head()

    def drop(self) -> None:
        """Close the connection unanswered (it waited too long, or made room for another)."""
        self._forget()
        if not self.transport.is_closing():
            self.transport.close()

    def _wait_for_head(self) -> None:
        self.edge.waiting[self] = None
        self._cancel_deadline()
        self._deadline = self.loop.call_later(self.edge.limits.header_timeout_s, self.drop)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _forget(self) -> None:
        self.edge.open.discard(self)
        self.edge.waiting.pop(self, None)
        self._cancel_deadline()


def guarded_protocol(limits: EdgeLimits) -> type[GuardedProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` whose connections share one `_Edge`:
    one class per server, so two servers in one process never count each other."""
    attributes: dict[str, Any] = {"edge": _Edge(limits)}
    return type("GuardedHttpProtocol", (GuardedProtocol,), attributes)


@dataclass(frozen=True)
class ServeSettings:
    """How `moonrun platform serve` serves HTTP: the edge's limits, the keep-alive, proxies."""

    limits: EdgeLimits = EdgeLimits()
    keep_alive_s: int = 5
    """An idle connection is closed after this long (uvicorn's `timeout_keep_alive`)."""
    trusted_proxies: tuple[str, ...] = ()
    """Peers whose X-Forwarded-For and X-Forwarded-Proto are believed; none by default."""
    graceful_shutdown_s: int = 10


def server_config(app: Any, host: str, port: int, settings: ServeSettings) -> Any:
    """The `uvicorn.Config` serving `app` with `settings`."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(settings.limits),
        ws="none",
        log_config=None,
        access_log=False,
        timeout_keep_alive=settings.keep_alive_s,
        timeout_graceful_shutdown=settings.graceful_shutdown_s,
        # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise: a local
        # process could then pose as any address (sign-in throttling counts by address).
        proxy_headers=bool(settings.trusted_proxies),
        forwarded_allow_ips=list(settings.trusted_proxies),
    )
