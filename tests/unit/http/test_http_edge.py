"""The platform's HTTP edge in-process: answers carrying secrets are never cached, the
interactive API docs (which load scripts from a CDN) are served only when asked for, and the
edge's protocol keeps its deadlines, head bounds and eviction order (`http/edge.py`)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from uvicorn.server import ServerState

from moonrun.http.edge import EdgeLimits, GuardedProtocol, RequestEdge, edge_of, guarded_protocol
from moonrun.wiring.app import create_app
from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def created_user(cast: Cast) -> httpx.Response:
    return cast.world.api("POST", "/api/v1/users", json={"name": "nina"})


def created_endpoint(cast: Cast) -> httpx.Response:
    return cast.world.api("POST", "/api/v1/endpoints", json={"name": "host-z"})


def registered_session(cast: Cast) -> httpx.Response:
    return cast.run.register()


@pytest.mark.parametrize(
    ("answer", "secret"),
    [
        pytest.param(created_user, "api_token", id="POST /api/v1/users"),
        pytest.param(created_endpoint, "join_token", id="POST /api/v1/endpoints"),
        pytest.param(registered_session, "session_key", id="POST /run/v1/sessions"),
    ],
)
def test_an_answer_carrying_a_secret_is_never_stored_by_a_cache(
    cast: Cast, answer: Callable[[Cast], httpx.Response], secret: str
) -> None:
    """The answers that carry an API token, a join token or a session key say no-store."""
    response = answer(cast)
    assert (response.status_code, secret in response.json()) == (201, True)
    assert response.headers.get("cache-control") == "no-store"


def test_answers_without_secrets_say_nothing_about_caching(cast: Cast) -> None:
    """no-store is for secrets: a job list may be cached by whoever the caller allows."""
    response = cast.world.api("GET", "/api/v1/jobs", token=cast.owner[1])
    assert (response.status_code, response.headers.get("cache-control")) == (200, None)


def test_the_api_docs_are_off_unless_asked_for(cast: Cast) -> None:
    """/docs and /redoc answer 404 by default; /openapi.json is still served."""
    client = cast.world.client
    statuses = {path: client.get(path).status_code for path in ("/docs", "/redoc", "/openapi.json")}
    assert statuses == {"/docs": 404, "/redoc": 404, "/openapi.json": 200}


def test_the_api_docs_are_served_when_asked_for(cast: Cast) -> None:
    """With api_docs (`platform serve --api-docs`), /docs and /redoc are served."""
    with TestClient(create_app(cast.world.platform, sweep=False, api_docs=True)) as client:
        statuses = {path: client.get(path).status_code for path in ("/docs", "/redoc")}
    assert statuses == {"/docs": 200, "/redoc": 200}


# -- the edge's protocol on a clock the test moves -----------------------------------------------
#
# `GuardedProtocol` is driven the way uvicorn's event loop drives it (connection_made,
# data_received, the parser's callbacks, timers), but on a loop whose clock only the test moves,
# so deadlines are checked to the byte and to the second without waiting for them. A uvicorn
# upgrade that renames or reorders the hooks the edge overrides fails these first.


class Timer:
    def __init__(self, loop: ManualLoop, when: float, callback: Callable[..., Any], args: Any):
        self.loop, self._when, self.callback, self.args = loop, when, callback, args
        self.cancelled = False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


class NotRun:
    """The app's task, never run."""

    def add_done_callback(self, callback: Callable[..., Any]) -> None:
        pass


class ManualLoop:
    """What the protocol asks of its event loop: the time, timers, and tasks (the app's, which
    are not run: the edge is tested without one)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Timer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> Timer:
        timer = Timer(self, when, callback, args)
        self.timers.append(timer)
        return timer

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Timer:
        return self.call_at(self.now + delay, callback, *args)

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> Timer:
        """The loop's next turn: `advance(0)` runs it."""
        return self.call_at(self.now, callback, *args)

    def create_task(self, coroutine: Any, **_: Any) -> Any:
        coroutine.close()
        return NotRun()

    def advance(self, seconds: float) -> None:
        """Move the clock, firing the timers that fall due on the way, in order."""
        until = self.now + seconds
        while True:
            due = [t for t in self.timers if not t.cancelled and t.when() <= until]
            if not due:
                break
            timer = min(due, key=Timer.when)
            self.timers.remove(timer)
            self.now = max(self.now, timer.when())
            timer.callback(*timer.args)
        self.now = until


class Socket:
    """A connection's transport: what the platform wrote, and whether it closed it."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.writes = 0
        self.closed = False
        self.protocol: GuardedProtocol | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8470)}.get(
            name, default
        )

    def write(self, data: bytes) -> None:
        self.written += data
        self.writes += 1

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            assert self.protocol is not None
            self.protocol.connection_lost(None)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def answer(self) -> tuple[int, Any]:
        """The status and JSON body the platform wrote."""
        head, _, body = bytes(self.written).partition(b"\r\n\r\n")
        return int(head.split(b" ")[1]), json.loads(body)


class Edge:
    """One server's edge: open connections to it, on one manual loop."""

    def __init__(self, **limits: Any) -> None:
        self.loop = ManualLoop()
        config = uvicorn.Config(app=_never_called, http="httptools", log_config=None)
        config.load()
        self.protocol_class = guarded_protocol(EdgeLimits(**limits))
        self.config, self.state = config, ServerState()

    def connect(self) -> Socket:
        sock = Socket()
        protocol = self.protocol_class(
            config=self.config,
            server_state=self.state,
            app_state={},
            _loop=self.loop,  # type: ignore[arg-type]
        )
        sock.protocol = protocol
        protocol.connection_made(sock)  # type: ignore[arg-type]
        return sock

    def send(self, sock: Socket, data: bytes) -> None:
        assert sock.protocol is not None
        if not sock.closed:
            sock.protocol.data_received(data)

    @staticmethod
    def request(sock: Socket) -> RequestEdge:
        assert sock.protocol is not None
        found = edge_of(sock.protocol.scope)
        assert found is not None
        return found

    @staticmethod
    def answer(sock: Socket) -> None:
        """The app answers the connection's current request (204, no body)."""
        assert sock.protocol is not None
        cycle = sock.protocol.cycle
        for message in (
            {"type": "http.response.start", "status": 204, "headers": []},
            {"type": "http.response.body", "body": b""},
        ):
            step = cycle.send(message)  # type: ignore[arg-type]
            with contextlib.suppress(StopIteration):
                step.send(None)


async def _never_called(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("the edge's tests run no app")


POST_HEAD = b"POST /api/v1/jobs HTTP/1.1\r\nHost: p\r\nContent-Length: 100000\r\n\r\n"
"""A head announcing a 100,000-byte body."""


def test_a_body_that_stalls_is_closed_at_the_body_deadline() -> None:
    """A body gets `body_timeout_s` from its head, plus a second per `min_body_rate` bytes that
    arrived: 10 bytes buy 10 ms at 1,000 B/s, so the connection is open at 10.009 s and closed
    at 10.011 s."""
    edge = Edge(body_timeout_s=10, min_body_rate=1000)
    sock = edge.connect()
    edge.send(sock, POST_HEAD + b"x" * 10)
    edge.loop.advance(10.009)
    assert not sock.closed
    edge.loop.advance(0.002)
    assert (sock.closed, bytes(sock.written)) == (True, b"")


def test_a_body_that_keeps_arriving_at_the_minimum_rate_has_all_the_time_its_size_needs() -> None:
    """1,000 B/s for 60 s, six times the body timeout: every byte moves the deadline on, so the
    body is still welcome, and once it is whole the request is busy: no deadline at all."""
    edge = Edge(body_timeout_s=10, min_body_rate=1000, header_timeout_s=5)
    sock = edge.connect()
    edge.send(sock, b"POST /x HTTP/1.1\r\nHost: p\r\nContent-Length: 60001\r\n\r\n")
    for _ in range(60):
        edge.loop.advance(1)
        edge.send(sock, b"x" * 1000)
    assert not sock.closed
    edge.send(sock, b"x")
    edge.loop.advance(3600)
    assert not sock.closed


def test_a_body_slower_than_the_minimum_rate_is_cut_off() -> None:
    """500 B/s against a floor of 1,000 B/s: the deadline (10 s + bytes/1,000) gains half a second
    a second, so after 18 s of bytes (9,000) it is passed at 19 s, long before the 100,000 bytes
    could arrive."""
    edge = Edge(body_timeout_s=10, min_body_rate=1000)
    sock = edge.connect()
    edge.send(sock, POST_HEAD)
    seconds = 0
    while not sock.closed and seconds < 200:
        edge.loop.advance(1)
        edge.send(sock, b"x" * 500)
        seconds += 1
    assert (sock.closed, seconds) == (True, 19)


def test_a_request_whose_body_arrived_is_busy_and_its_connection_waits_for_a_head_after_it() -> (
    None
):
    """Busy (its handler decides how long it takes): no deadline. After its answer the
    connection waits for its next head, with the head deadline again."""
    edge = Edge(header_timeout_s=5)
    sock = edge.connect()
    edge.send(sock, b"POST /x HTTP/1.1\r\nHost: p\r\nContent-Length: 2\r\n\r\nok")
    assert edge.request(sock).arrived
    edge.loop.advance(3600)
    assert not sock.closed
    edge.answer(sock)
    edge.loop.advance(4.9)
    assert not sock.closed
    edge.loop.advance(0.2)
    assert sock.closed


def test_a_connection_waiting_for_its_body_is_evicted_under_the_cap_longest_waiting_first() -> None:
    """Cap 2: a connection stalled in its body and one waiting for a head; a third evicts the
    stalled body (it began waiting first), not the newer head."""
    edge = Edge(max_connections=2)
    stalled = edge.connect()
    edge.send(stalled, POST_HEAD)
    edge.loop.advance(1)
    idle = edge.connect()
    edge.loop.advance(1)
    newcomer = edge.connect()
    assert (stalled.closed, idle.closed, newcomer.closed) == (True, False, False)


def test_a_vouched_body_is_kept_under_the_cap_and_the_unvouched_go_first() -> None:
    """Once the app has checked a request's credentials (`RequestEdge.trust`), its connection
    is not evicted while its body arrives: the connection waiting for a head goes instead, and
    when none but vouched and busy ones are left, the newcomer itself is closed."""
    edge = Edge(max_connections=2)
    run = edge.connect()
    edge.send(run, POST_HEAD)
    edge.request(run).trust()
    idle = edge.connect()
    first = edge.connect()
    assert (run.closed, idle.closed, first.closed) == (False, True, False)
    edge.send(first, b"GET /healthz HTTP/1.1\r\nHost: p\r\n\r\n")  # busy now
    second = edge.connect()
    assert (run.closed, first.closed, second.closed) == (False, False, True)


def test_a_vouched_body_still_has_the_body_deadline() -> None:
    """Trust keeps a connection from eviction, not from the deadline."""
    edge = Edge(body_timeout_s=10)
    sock = edge.connect()
    edge.send(sock, POST_HEAD)
    edge.request(sock).trust()
    edge.loop.advance(10.01)
    assert sock.closed


def test_a_request_answered_before_its_body_arrived_is_evictable_while_the_rest_arrives() -> None:
    """An early answer (401, 413, 429) ends the request's vouch: whatever of its body is still
    coming is discarded on a connection the cap may close, by the body's deadline."""
    edge = Edge(max_connections=1, body_timeout_s=10)
    sock = edge.connect()
    edge.send(sock, POST_HEAD)
    edge.request(sock).trust()
    edge.answer(sock)
    edge.connect()
    assert sock.closed


def test_a_body_arrived_flag_tells_the_app_whether_reading_would_wait() -> None:
    """`RequestEdge.arrived` is false while any of the body is still to come."""
    edge = Edge()
    sock = edge.connect()
    edge.send(sock, b"POST /x HTTP/1.1\r\nHost: p\r\nContent-Length: 4\r\n\r\nab")
    request = edge.request(sock)
    assert not request.arrived
    edge.send(sock, b"cd")
    assert request.arrived


@pytest.mark.parametrize(
    ("head", "status", "code"),
    [
        pytest.param(
            b"GET /" + b"a" * 8200 + b" HTTP/1.1\r\n\r\n", 414, "uri_too_long", id="request line"
        ),
        pytest.param(
            b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 8200 + b"\r\n\r\n",
            431,
            "headers_too_large",
            id="header line",
        ),
        pytest.param(
            b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n",
            431,
            "headers_too_large",
            id="101 headers",
        ),
        pytest.param(
            b"GET / HTTP/1.1\r\n"
            + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 8000) for i in range(9))
            + b"\r\n",
            431,
            "headers_too_large",
            id="72 KiB of headers",
        ),
    ],
)
def test_a_head_over_its_bounds_is_refused_in_the_json_envelope_and_closed(
    head: bytes, status: int, code: str
) -> None:
    """8 KiB a line, 100 headers, 64 KiB in all; sent in one piece or a byte at a time."""
    for pieces in (1, len(head)):
        edge = Edge()
        sock = edge.connect()
        size = -(-len(head) // pieces)
        for start in range(0, len(head), size):
            edge.send(sock, head[start : start + size])
        assert (sock.answer()[0], sock.answer()[1]["error"]["code"], sock.closed) == (
            status,
            code,
            True,
        )


def test_an_unfinished_header_line_is_refused_once_it_passes_the_line_bound() -> None:
    """httptools keeps a header line until it ends: a line that never ends is refused as soon
    as it is longer than 8 KiB, not held while it grows (an hour of 64 KiB reads)."""
    edge = Edge()
    sock = edge.connect()
    edge.send(sock, b"GET / HTTP/1.1\r\nX-Big: ")
    sent = 0
    while not sock.closed and sent < 2**30:
        edge.send(sock, b"a" * 4096)
        sent += 4096
    assert (sock.answer()[0], sent) == (431, 8192)


@pytest.mark.parametrize("read", [1 << 30, 65536, 1000], ids=["one read", "64 KiB", "1000 B"])
def test_a_large_body_without_newlines_is_never_taken_for_a_header_line(read: int) -> None:
    """A head and a 200 KB body with no newline in it (a Run's log batch), in one read or
    many, and another request after it: all served, none refused as a long line."""
    edge = Edge()
    sock = edge.connect()
    body = b'{"text": "' + b"x" * 200_000 + b'"}'
    request = b"POST /run/v1/logs HTTP/1.1\r\nHost: p\r\nContent-Length: %d\r\n\r\n" % len(body)
    data = request + body
    for start in range(0, len(data), read):
        edge.send(sock, data[start : start + read])
    assert (sock.closed, edge.request(sock).arrived) == (False, True)
    edge.answer(sock)
    edge.send(sock, data + b"GET /healthz HTTP/1.1\r\nX-Partial: " + b"a" * 1000)
    assert (sock.closed, bytes(sock.written).count(b"HTTP/1.1 4")) == (False, 0)


def test_blank_lines_before_a_request_are_skipped_as_httptools_skips_them() -> None:
    """A client that ends a body with a stray CRLF (some do) is not refused for it."""
    edge = Edge()
    sock = edge.connect()
    edge.send(sock, b"\r\n")
    edge.send(sock, b"\r\nGET /healthz HTTP/1.1\r\nHost: p\r\n\r\n")
    assert (sock.closed, bytes(sock.written), edge.request(sock).arrived) == (False, b"", True)


def test_a_head_within_its_bounds_is_served() -> None:
    """100 headers of up to 8 KiB a line and 64 KiB in all pass."""
    edge = Edge()
    sock = edge.connect()
    headers = b"".join(b"X-%02d: %s\r\n" % (i, b"a" * 500) for i in range(100))
    edge.send(sock, b"GET /healthz HTTP/1.1\r\n" + headers + b"\r\n")
    assert (sock.closed, edge.request(sock).arrived) == (False, True)


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", id="negative length"),
        pytest.param(
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            id="two lengths",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", id="bad chunk size"
        ),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", id="tls hello"),
        pytest.param(b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", id="header without colon"),
    ],
)
def test_a_request_httptools_cannot_parse_is_400_invalid_request_in_the_json_envelope(
    request_bytes: bytes,
) -> None:
    """Not uvicorn's plain-text 400: the platform's one error shape, then the connection closes."""
    edge = Edge()
    sock = edge.connect()
    edge.send(sock, request_bytes)
    status, body = sock.answer()
    assert (status, body["error"]["code"], sock.closed) == (400, "invalid_request", True)
    assert b"content-type: application/json" in bytes(sock.written)
