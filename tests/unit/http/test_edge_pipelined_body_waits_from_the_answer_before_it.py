"""A request pipelined behind one still being handled (its head read with the answer of the
one before still to come) is busy while it queues: no deadline, never evicted. Once the
request before it is answered its body is waited for, with the body deadline counted from
that answer and only the bytes that arrive from then on buying time (one byte a second
here)."""

from __future__ import annotations

from tests.unit.http.test_http_edge import Edge, Socket

BODY_S = 10.0


def pipelined(edge: Edge) -> Socket:
    """A GET being handled, and behind it a POST whose 100-byte body has sent 5 bytes."""
    sock = edge.connect()
    edge.send(
        sock,
        b"GET /first HTTP/1.1\r\nHost: p\r\n\r\n"
        b"POST /second HTTP/1.1\r\nHost: p\r\nContent-Length: 100\r\n\r\nxxxxx",
    )
    return sock


def test_a_pipelined_request_is_busy_while_the_one_before_is_handled() -> None:
    edge = Edge(body_timeout_s=BODY_S, min_body_rate=1, max_connections=1)
    sock = pipelined(edge)
    edge.loop.advance(3600)
    newcomer = edge.connect()
    assert (sock.closed, newcomer.closed) == (False, True)


def test_a_pipelined_body_has_the_body_deadline_from_the_answer_before_it() -> None:
    edge = Edge(body_timeout_s=BODY_S, min_body_rate=1)
    sock = pipelined(edge)
    edge.loop.advance(20)
    edge.answer(sock)  # at 20 s: the body is due by 30 s, the 5 bytes before count for nothing
    edge.loop.advance(BODY_S - 0.1)
    open_before = not sock.closed
    edge.loop.advance(0.2)
    assert (open_before, sock.closed) == (True, True)


def test_a_pipelined_body_gains_a_second_a_byte_after_the_answer_before_it() -> None:
    edge = Edge(body_timeout_s=BODY_S, min_body_rate=1)
    sock = pipelined(edge)
    edge.loop.advance(20)
    edge.answer(sock)
    edge.send(sock, b"yy")  # 30 s + 2 s
    edge.loop.advance(BODY_S + 2 - 0.1)
    open_before = not sock.closed
    edge.loop.advance(0.2)
    assert (open_before, sock.closed) == (True, True)
