"""`RequestEdge.trust` keeps a connection from eviction and nothing more: a vouch made late in
a body's wait leaves its deadline counted from the head, a vouch made after the answer leaves
the next head's deadline counted from the answer, and a vouched body that arrives (or a vouch
for a request already busy) is served like any other."""

from __future__ import annotations

from tests.unit.http.test_http_edge import POST_HEAD, Edge


def test_a_body_vouched_for_late_keeps_its_deadline_from_the_head() -> None:
    edge = Edge(body_timeout_s=10)
    sock = edge.connect()
    edge.send(sock, POST_HEAD)
    edge.loop.advance(9)
    edge.request(sock).trust()
    edge.loop.advance(0.9)
    open_before = not sock.closed
    edge.loop.advance(0.2)
    assert (open_before, sock.closed) == (True, True)


def test_a_vouch_after_the_answer_leaves_the_next_heads_deadline_from_the_answer() -> None:
    edge = Edge(header_timeout_s=20)
    sock = edge.connect()
    edge.send(sock, b"GET /first HTTP/1.1\r\nHost: p\r\n\r\n")
    request = edge.request(sock)
    edge.answer(sock)  # at 0 s: the next head is due by 20 s
    edge.loop.advance(4)
    edge.send(sock, b"GET /second HTTP/1.1\r\nHo")  # before uvicorn's own keep-alive (5 s)
    edge.loop.advance(15)
    request.trust()  # the app, still busy with the first request's aftermath
    edge.loop.advance(0.9)
    open_before = not sock.closed
    edge.loop.advance(0.2)
    assert (open_before, sock.closed) == (True, True)


def test_a_vouched_body_that_arrives_is_served_and_busy() -> None:
    edge = Edge(body_timeout_s=10)
    sock = edge.connect()
    edge.send(sock, b"POST /x HTTP/1.1\r\nHost: p\r\nContent-Length: 4\r\n\r\nab")
    request = edge.request(sock)
    request.trust()
    edge.send(sock, b"cd")
    request.trust()  # once more, now that the request is busy
    edge.loop.advance(3600)
    assert (sock.closed, bytes(sock.written), request.arrived) == (False, b"", True)
