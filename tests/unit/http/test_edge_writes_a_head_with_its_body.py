"""An answer's head goes out with the first part of its body, in one write: one system call
and one TCP segment, so the client reads the whole answer at one wake-up instead of two (the
peer bench's p50, docs/benchmarks.md). A head whose body does not follow at once (a stream
that waits for its first event) goes out alone on the loop's next turn."""

from __future__ import annotations

import contextlib
from typing import Any

from tests.unit.http.test_http_edge import Edge, Socket

GET = b"GET /x HTTP/1.1\r\nHost: p\r\n\r\n"


def send(sock: Socket, message: dict[str, Any]) -> None:
    """The app's `send(message)`, run to its end (the app's task is not run here)."""
    assert sock.protocol is not None
    step = sock.protocol.cycle.send(message)  # type: ignore[arg-type, union-attr]
    with contextlib.suppress(StopIteration):
        step.send(None)


START = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}


def test_a_head_and_its_body_are_one_write() -> None:
    edge = Edge()
    sock = edge.connect()
    edge.send(sock, GET)
    send(sock, START)
    send(sock, {"type": "http.response.body", "body": b"{}"})
    assert (sock.writes, sock.answer()) == (1, (200, {}))


def test_a_head_whose_body_waits_goes_out_alone_on_the_next_turn() -> None:
    edge = Edge()
    sock = edge.connect()
    edge.send(sock, GET)
    send(sock, {**START, "headers": []})  # streamed: the body comes when it comes
    before = sock.writes
    edge.loop.advance(0)
    written = (before, sock.writes, bytes(sock.written).startswith(b"HTTP/1.1 200 OK\r\n"))
    send(sock, {"type": "http.response.body", "body": b"[1]", "more_body": True})
    assert (*written, sock.writes) == (0, 1, True, 2)
