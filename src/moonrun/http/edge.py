"""The HTTP edge: deadlines on request heads and bodies, bounds on heads, a cap on connections.

uvicorn's httptools protocol has none of these. Its keep-alive timer is cancelled by any byte and
never armed on a fresh connection, and a body may take as long as it likes, so clients that
trickle bytes hold sockets (and file descriptors) until the platform accepts no connection at
all; httptools keeps a header line of any length, copying it as it grows; and a request it cannot
parse is answered in plain text. Here, per connection:

- Waiting for a request head (fresh, or idle after an answer), the head must be complete within
  `header_timeout_s` of starting to wait, however many bytes it sends; a connection kept open
  after an answer may first stay idle for `idle_s` (the keep-alive, after which uvicorn closes
  it if no byte came), so that a Run's next heartbeat finds its connection still open.
- Waiting for a body, the body must be complete within `body_timeout_s` of its head, plus one
  second for every `min_body_rate` bytes of it that did arrive: past the first seconds a body must
  keep coming at that average rate, and a large one gets the time its size needs at that rate.
- A request whose body has arrived is busy: no deadline (its handler decides how long it takes),
  never evicted.
- A head is at most `max_head_bytes` in all, `max_line_bytes` a line and `max_headers` headers:
  else 431 `headers_too_large` (414 `uri_too_long` for a request line), in the JSON envelope, and
  the connection closes. httptools holds at most one read (256 KiB) more than that. A request it
  cannot parse (`Content-Length: -1`, bad chunking, bytes that are not HTTP) is 400
  `invalid_request` in the envelope, and the connection closes.
- At most `max_connections` are open. One more closes the connection that has waited longest for
  its request to arrive (head or body) among those nobody vouched for; a connection whose
  request's credentials the app has checked (`RequestEdge.trust`) is not evicted while its body
  arrives, and a busy one never is. With none other to close, the new connection is closed.

An answer's head is written with the first part of its body (`_HeadWithBody`): one system call
and one TCP segment instead of two, so the client reads it at one wake-up.

A missed deadline or an eviction closes the socket unanswered, so the descriptor comes back at
once; the app, if it was reading the body, sees a disconnect. `RequestEdge` (`edge_of(scope)`)
lets the app ask whether a request's body has arrived and vouch for its request.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from moonrun.errors import HeadersTooLarge, MalformedRequest, MoonrunError, UriTooLong
from moonrun.wire.error_body import error_body

log = logging.getLogger("moonrun.http")

FD_RESERVE = 128
"""Descriptors kept back from the connection cap for the store, logs and the event loop."""
MAX_DEFAULT_CONNECTIONS = 65536
EDGE_EXTENSION = "moonrun.edge"
"""The key of the request's `RequestEdge` in its ASGI scope's `extensions`."""


@dataclass(frozen=True)
class EdgeLimits:
    """How long a request head and body may take, how large a head may be, and how many
    connections may be open at once."""

    header_timeout_s: float = 10.0
    max_connections: int = 1024 - FD_RESERVE
    body_timeout_s: float = 10.0
    min_body_rate: int = 16 * 1024
    """Bytes a second a body must average past `body_timeout_s` (128 kbit/s)."""
    max_head_bytes: int = 64 * 1024
    max_line_bytes: int = 8 * 1024
    """The longest request line or header line (nginx's `large_client_header_buffers`)."""
    max_headers: int = 100
    idle_s: float = 0.0
    """How long a connection kept open after an answer may wait before its next head's own
    deadline starts (`ServeSettings.keep_alive_s`; uvicorn closes it idle at that time)."""


def default_max_connections(open_files_limit: int) -> int:
    """A connection cap under the process's open-files limit (`RLIMIT_NOFILE`, soft; negative
    for unlimited), leaving `FD_RESERVE` descriptors for everything else."""
    if open_files_limit < 0:
        return MAX_DEFAULT_CONNECTIONS
    return max(16, min(MAX_DEFAULT_CONNECTIONS, open_files_limit - FD_RESERVE))


class _Edge:
    """What the connections of one server share: which are open, which may be evicted."""

    def __init__(self, limits: EdgeLimits) -> None:
        self.limits = limits
        self.open: set[GuardedProtocol] = set()
        self.evictable: OrderedDict[GuardedProtocol, None] = OrderedDict()
        """Connections waiting for a request head, or for the body of a request nobody vouched
        for, the one waiting longest for its request first."""


class RequestEdge:
    """One request as the edge sees it, for the app: has its body arrived; `trust` it once its
    credentials are checked (its connection is then not evicted while its body arrives).

    It holds its connection and uvicorn's request cycle weakly: the request's scope holds it,
    and the cycle and the connection hold that scope, so strong references would leave every
    request a reference cycle for the garbage collector (at 5,000 Runs, 33,000 objects a
    second, collected in pauses of 50 to 100 ms).
    """

    __slots__ = ("_connection", "_cycle")

    def __init__(self, connection: Any, cycle: Any = None) -> None:
        self._connection: Callable[[], Any] = weakref.ref(connection)
        self._cycle: Callable[[], Any] = _no_cycle if cycle is None else weakref.ref(cycle)
        """uvicorn's `RequestResponseCycle` of the request (its `more_body`)."""

    def follow(self, cycle: Any) -> None:
        """The request's cycle, once uvicorn made it."""
        self._cycle = weakref.ref(cycle)

    @property
    def arrived(self) -> bool:
        """The whole body is here: reading it will not wait for the client."""
        cycle = self._cycle()
        return cycle is not None and not cycle.more_body

    def trust(self) -> None:
        connection = self._connection()
        if connection is not None and connection.cycle is self._cycle():
            connection.trust()


def _no_cycle() -> None:
    """Stands for a reference to the cycle before uvicorn made it."""


def edge_of(scope: Mapping[str, Any]) -> RequestEdge | None:
    """The request's `RequestEdge`; None when it was not served through `GuardedProtocol` (an
    in-process client, which hands the app a whole body at once)."""
    extensions = scope.get("extensions")
    found = extensions.get(EDGE_EXTENSION) if extensions else None
    return found if isinstance(found, RequestEdge) else None


class _HeadRefused(Exception):
    """Raised from a parser callback to stop httptools; carries the answer."""

    def __init__(self, error: MoonrunError) -> None:
        super().__init__(error.message)
        self.error = error


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadlines, head bounds and connection cap."""

    edge: _Edge
    _timer: asyncio.TimerHandle | None = None
    _waiting: str | None = None
    """"head", "body", or None while busy with a request (or gone)."""
    _since = 0.0
    """When the connection began waiting for its current head (loop time)."""
    _body_since = 0.0
    _body_bytes = 0
    _in_body = False
    """The parser is inside a request body."""
    _in_head = True
    """The parser is inside a request head, or between requests."""
    _trusted = False
    _head_bytes = 0
    """The current head's complete header lines, in bytes."""
    _line_bytes = 0
    """The current head's unfinished line so far (httptools holds it until it ends)."""
    _headers = 0
    _past_request_line = False
    _heads_completed = 0

    # -- the connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self.url = b""  # uvicorn sets it when a request begins; bytes may come before (CRLF)
        edge = self.edge
        edge.open.add(self)
        self._settle()
        if len(edge.open) > edge.limits.max_connections:
            # self waits too, so there is always one; it is the oldest only when every other
            # open connection is busy or vouched for.
            next(iter(edge.evictable)).drop()

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # uvicorn's, but every refusal in the JSON envelope, and a head's size bounded.
        self._unset_keepalive_if_required()
        started_in_head, heads = self._in_head, self._heads_completed
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as error:
            cause = error.__context__
            refusal = (
                cause.error
                if isinstance(cause, _HeadRefused)
                else MalformedRequest("the request is not valid HTTP/1.1")
            )
            self._refuse(refusal)
            return
        if self._in_head and not self.transport.is_closing():
            # All of this read is the head so far unless a head (and its body) ended in it.
            self._bound_unfinished_line(data, started_in_head and heads == self._heads_completed)

    def drop(self) -> None:
        """Close the connection unanswered (it waited too long, or made room for another)."""
        self._forget()
        if not self.transport.is_closing():
            self.transport.close()

    def trust(self) -> None:
        """The app checked the current request's credentials: keep it while its body arrives."""
        self._trusted = True
        self._settle()

    # -- parser callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = self._line_bytes = self._headers = 0
        self._past_request_line = False

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.edge.limits.max_line_bytes:
            raise _HeadRefused(self._uri_too_long())

    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self.edge.limits
        line = len(name) + len(value) + 2
        self._headers += 1
        self._head_bytes += line + 2
        if line > limits.max_line_bytes:
            raise _HeadRefused(self._line_too_long())
        if self._headers > limits.max_headers:
            too_many = f"a request has at most {limits.max_headers} headers"
            raise _HeadRefused(HeadersTooLarge(too_many))
        if self._head_bytes + len(self.url) > limits.max_head_bytes:
            raise _HeadRefused(self._head_too_large())
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._heads_completed += 1
        self._in_head = False
        self._in_body = True
        self._body_since = self.loop.time()
        self._body_bytes = 0
        self._trusted = False
        request = RequestEdge(self)
        extensions: dict[str, Any] = dict(self.scope.get("extensions") or {})
        extensions[EDGE_EXTENSION] = request
        self.scope["extensions"] = extensions
        super().on_headers_complete()
        self.cycle.transport = _HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]
        request.follow(self.cycle)
        self._settle()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_body = False
        self._in_head = True
        self._settle()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._trusted = False  # a vouch is for one request; its answer ends it
        self._settle()

    # -- deadlines and eviction -------------------------------------------------------------

    def _settle(self) -> None:
        """Put the connection where its state says: busy (no deadline, never evicted), or
        waiting for a head or a body (a deadline; evictable unless vouched for)."""
        edge = self.edge
        if self not in edge.open:
            return
        cycle = self.cycle
        busy = bool(self.pipeline) or (
            cycle is not None and not cycle.response_complete and not cycle.more_body
        )
        waiting = None if busy else "body" if self._in_body else "head"
        if waiting == "head" and self._waiting != "head":
            self._since = self.loop.time()
        elif waiting == "body" and self._waiting is None:
            # A pipelined request's body, waited for only now that the one before is answered.
            self._body_since = self.loop.time()
            self._body_bytes = 0
        self._waiting = waiting
        if waiting == "head" or (waiting == "body" and not self._trusted):
            if self not in edge.evictable:
                edge.evictable[self] = None
        else:
            edge.evictable.pop(self, None)
        if waiting is None:
            self._cancel_timer()
        else:
            self._arm(self._deadline())

    def _deadline(self) -> float:
        limits = self.edge.limits
        if self._waiting == "head":
            idle = limits.idle_s if self._heads_completed else 0.0
            return self._since + idle + limits.header_timeout_s
        grace = self._body_bytes / limits.min_body_rate
        return self._body_since + limits.body_timeout_s + grace

    def _arm(self, when: float) -> None:
        # A timer due earlier may stay: when it fires, `_expire` arms it again for the deadline
        # then (a body's deadline moves later with every byte; no timer is moved per byte).
        timer = self._timer
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._timer = self.loop.call_at(when, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self._waiting is None or self not in self.edge.open:
            return
        deadline = self._deadline()
        if self.loop.time() >= deadline:
            self.drop()
        else:
            self._timer = self.loop.call_at(deadline, self._expire)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _forget(self) -> None:
        self.edge.open.discard(self)
        self.edge.evictable.pop(self, None)
        self._waiting = None
        self._cancel_timer()

    # -- head bounds and refusals -----------------------------------------------------------

    def _bound_unfinished_line(self, data: bytes, all_head: bool) -> None:
        """httptools keeps a header line until it ends: bound what it holds of one."""
        if not all_head:
            # The head began inside this read, after another request, at a place httptools
            # does not say: nothing of this read is counted (one read more at most is held;
            # `on_url` bounds the request line meanwhile). Its request line ended in this read
            # if a line break follows its target: the line left unfinished is then a header's.
            target = data.rfind(self.url) if self.url else -1
            if target >= 0 and data.find(b"\n", target) >= 0:
                self._past_request_line = True
            self._line_bytes = 0
            return
        newline = data.rfind(b"\n")
        if newline >= 0:
            self._line_bytes = len(data) - newline - 1
            self._past_request_line = True
        else:
            self._line_bytes += len(data)
        limits = self.edge.limits
        if self._line_bytes > limits.max_line_bytes:
            self._refuse(self._line_too_long() if self._past_request_line else self._uri_too_long())
        elif self._head_bytes + len(self.url) + self._line_bytes > limits.max_head_bytes:
            self._refuse(self._head_too_large())

    def _uri_too_long(self) -> UriTooLong:
        return UriTooLong(f"the request line is over {self.edge.limits.max_line_bytes} bytes")

    def _line_too_long(self) -> HeadersTooLarge:
        return HeadersTooLarge(f"a header line is over {self.edge.limits.max_line_bytes} bytes")

    def _head_too_large(self) -> HeadersTooLarge:
        return HeadersTooLarge(f"the request head is over {self.edge.limits.max_head_bytes} bytes")

    def _refuse(self, error: MoonrunError) -> None:
        """Answer `error` in the JSON envelope (unless an answer is already under way), then
        close the connection."""
        log.info(
            "request refused at the edge",
            extra={"fields": {"status": error.status, "code": error.code}},
        )
        cycle = self.cycle
        answering = cycle is not None and cycle.response_started and not cycle.response_complete
        if not answering:
            body = orjson.dumps(error_body(error.code, error.message))
            content = [STATUS_LINE[error.status]]
            for name, value in self.server_state.default_headers:
                content.extend([name, b": ", value, b"\r\n"])
            content.extend(
                [
                    b"content-type: application/json\r\n",
                    b"content-length: " + str(len(body)).encode() + b"\r\n",
                    b"connection: close\r\n\r\n",
                    body,
                ]
            )
            self.transport.write(b"".join(content))
        if cycle is not None and not cycle.response_complete:
            # The app, if it reads the body, sees the client gone; what it answers is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        self.drop()


class _HeadWithBody:
    """The transport as one answer sees it: the answer's first write (its head) is held until
    the next joins it (its body, sent in the same turn by every route that is not a stream),
    or written alone on the loop's next turn."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None and not self._transport.is_closing():
            self._held = data
            self._loop.call_soon(self._flush)
            return
        self._held = b""
        self._transport.write(held + data if held else data)

    def _flush(self) -> None:
        held, self._held = self._held, b""
        if held and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded_protocol(limits: EdgeLimits) -> type[GuardedProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` whose connections share one `_Edge`:
    one class per server, so two servers in one process never count each other."""
    attributes: dict[str, Any] = {"edge": _Edge(limits)}
    return type("GuardedHttpProtocol", (GuardedProtocol,), attributes)


@dataclass(frozen=True)
class ServeSettings:
    """How `moonrun platform serve` serves HTTP: the edge's limits, the keep-alive, proxies."""

    limits: EdgeLimits = EdgeLimits()
    keep_alive_s: int = 20
    """An idle connection is closed after this long (uvicorn's `timeout_keep_alive`): longer
    than Run's heartbeat interval (10 s, jittered by a tenth), so that each heartbeat goes over
    the connection the previous one opened instead of a new one."""
    trusted_proxies: tuple[str, ...] = ()
    """Peers whose X-Forwarded-For and X-Forwarded-Proto are believed; none by default."""
    graceful_shutdown_s: int = 10


def stopping_server(config: Any, on_stop: Callable[[], None]) -> Any:
    """A `uvicorn.Server` that, told to exit (SIGTERM, SIGINT), first calls `on_stop`: the
    waiting claims and reads then answer at once, so the connections they hold close well
    within the graceful shutdown instead of being cut at its end."""
    import uvicorn

    class StoppingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            on_stop()
            super().handle_exit(sig, frame)

    return StoppingServer(config)


def server_config(app: Any, host: str, port: int, settings: ServeSettings) -> Any:
    """The `uvicorn.Config` serving `app` with `settings`."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(replace(settings.limits, idle_s=float(settings.keep_alive_s))),
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
