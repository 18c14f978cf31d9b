"""On a kept-alive connection the wait for the next request's head has the head deadline anew,
counted from the answer before it; the first bytes of that head do not stop it (uvicorn's own
keep-alive timer does stop there, so a test that sends nothing after the answer cannot tell
the edge's deadline from uvicorn's)."""

from __future__ import annotations

import json

from tests.unit.http.test_http_edge import Edge, Socket

HEAD_S = 20.0
"""Far from uvicorn's keep-alive (5 s), so that the deadline seen is the edge's."""


def answered_late() -> tuple[Edge, Socket]:
    """A connection whose first head came at 4 s and whose answer went out at 14 s."""
    edge = Edge(header_timeout_s=HEAD_S)
    sock = edge.connect()
    edge.loop.advance(4)
    edge.send(sock, b"GET /first HTTP/1.1\r\nHost: p\r\n\r\n")
    edge.loop.advance(10)
    edge.answer(sock)
    return edge, sock


def test_a_second_head_that_stalls_is_closed_at_the_head_deadline_from_the_answer() -> None:
    edge, sock = answered_late()
    edge.loop.advance(4)
    edge.send(sock, b"GET /second HTTP/1.1\r\nHo")  # keeps the connection from uvicorn's timer
    edge.loop.advance(HEAD_S - 4 - 0.1)
    open_before = not sock.closed
    edge.loop.advance(0.2)
    answers = bytes(sock.written).count(b"HTTP/1.1 ")
    assert (open_before, sock.closed, answers) == (True, True, 1)


def test_a_second_head_that_arrives_in_time_is_served_and_busy() -> None:
    edge, sock = answered_late()
    edge.loop.advance(4)
    edge.send(sock, b"GET /second HTTP/1.1\r\nHo")
    edge.loop.advance(HEAD_S - 4 - 0.1)
    edge.send(sock, b"st: p\r\n\r\n")
    edge.loop.advance(3600)
    assert (sock.closed, Edge.request(sock).arrived) == (False, True)


def answered_first() -> tuple[Edge, Socket]:
    edge = Edge()
    sock = edge.connect()
    edge.send(sock, b"GET /first HTTP/1.1\r\nHost: p\r\n\r\n")
    edge.answer(sock)
    return edge, sock


def test_a_second_requests_unfinished_header_line_is_bounded_like_the_firsts() -> None:
    """After an answer the connection is back in a head: a line that never ends is refused
    once past 8 KiB, as on a new connection."""
    edge, sock = answered_first()
    edge.send(sock, b"GET /second HTTP/1.1\r\nX-Big: ")
    sent = 0
    while not sock.closed and sent < 65536:
        edge.send(sock, b"a" * 4096)
        sent += 4096
    refusal = bytes(sock.written).partition(b"HTTP/1.1 431 ")[2].partition(b"\r\n\r\n")[2]
    assert (sent, sock.closed) == (8192, True)
    assert json.loads(refusal)["error"]["message"] == "a header line is over 8192 bytes"


def test_a_second_requests_body_read_with_its_head_is_never_taken_for_a_header_line() -> None:
    """The second head and its 200 KB body without a newline in one read: the head ended in
    this read, so nothing after it is a header line."""
    edge, sock = answered_first()
    body = b'{"text": "' + b"x" * 200_000 + b'"}'
    head = b"POST /run/v1/logs HTTP/1.1\r\nHost: p\r\nContent-Length: %d\r\n\r\n" % len(body)
    edge.send(sock, head + body)
    assert (sock.closed, Edge.request(sock).arrived, bytes(sock.written).count(b" 431 ")) == (
        False,
        True,
        0,
    )
