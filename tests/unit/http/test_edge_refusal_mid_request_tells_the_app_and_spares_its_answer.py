"""A request refused at the edge after the app has its request (a bad chunk in its body, bytes
that are not HTTP after it): the app, if it reads the body, sees the client gone at once,
before the loop reports the closed socket; and an answer the app has begun is not broken into
by the refusal's envelope: the connection just closes."""

from __future__ import annotations

import contextlib
from typing import Any

from tests.unit.http.test_http_edge import Edge, Socket


class LaterSocket(Socket):
    """As asyncio does it: closing the transport reports the loss on a later turn of the loop
    (here, when the test says), not from within `close`."""

    def close(self) -> None:
        self.closed = True

    def lost(self) -> None:
        assert self.protocol is not None
        self.protocol.connection_lost(None)


def connected(edge: Edge) -> LaterSocket:
    sock = LaterSocket()
    protocol = edge.protocol_class(
        config=edge.config,
        server_state=edge.state,
        app_state={},
        _loop=edge.loop,  # type: ignore[arg-type]
    )
    sock.protocol = protocol
    protocol.connection_made(sock)  # type: ignore[arg-type]
    return sock


def app_sends(sock: Socket, message: dict[str, Any]) -> None:
    assert sock.protocol is not None
    step = sock.protocol.cycle.send(message)  # type: ignore[arg-type]
    with contextlib.suppress(StopIteration):
        step.send(None)


def test_a_bad_chunk_is_refused_and_the_app_reading_the_body_sees_the_client_gone() -> None:
    edge = Edge()
    sock = connected(edge)
    edge.send(sock, b"POST /x HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert sock.protocol is not None
    cycle = sock.protocol.cycle
    edge.send(sock, b"zz\r\n")
    status, body = sock.answer()
    told = (cycle.disconnected, cycle.message_event.is_set())
    sock.lost()
    assert (status, body["error"]["code"], sock.closed, told) == (
        400,
        "invalid_request",
        True,
        (True, True),
    )


def test_bytes_that_are_not_http_during_an_answer_close_it_without_an_envelope() -> None:
    edge = Edge()
    sock = connected(edge)
    edge.send(sock, b"GET /x HTTP/1.1\r\nHost: p\r\n\r\n")
    assert sock.protocol is not None
    cycle = sock.protocol.cycle
    app_sends(
        sock,
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]},
    )
    edge.loop.advance(0)  # a head whose body has not followed goes out on the next turn
    begun = bytes(sock.written)
    edge.send(sock, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")
    told = (cycle.disconnected, cycle.message_event.is_set())
    sock.lost()
    assert begun.startswith(b"HTTP/1.1 200 ")
    assert (bytes(sock.written), sock.closed, told) == (begun, True, (True, True))
