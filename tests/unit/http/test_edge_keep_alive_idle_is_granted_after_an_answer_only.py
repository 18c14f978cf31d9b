"""A connection's first head has `header_timeout_s` from the connection, not a second more;
after an answer, the next head may first stay idle for the keep-alive (`idle_s`), then has its
own `header_timeout_s`: `idle_s + header_timeout_s` from the answer, to the tenth of a
second. (The next head's first bytes come within uvicorn's own keep-alive, 5 s in these tests'
config, which closes a connection that sent nothing; in `platform serve` it is `idle_s`.)"""

from __future__ import annotations

from tests.unit.http.test_http_edge import Edge

HEAD_S, IDLE_S = 5.0, 20.0


def test_a_fresh_connections_first_head_has_the_head_timeout_and_no_keep_alive() -> None:
    edge = Edge(header_timeout_s=HEAD_S, idle_s=IDLE_S)
    sock = edge.connect()
    edge.send(sock, b"GET / HTTP/1.1\r\nHo")
    edge.loop.advance(HEAD_S - 0.1)
    open_before = not sock.closed
    edge.loop.advance(0.2)
    assert (open_before, sock.closed, bytes(sock.written)) == (True, True, b"")


def test_the_next_head_after_an_answer_has_the_keep_alive_and_then_the_head_timeout() -> None:
    edge = Edge(header_timeout_s=HEAD_S, idle_s=IDLE_S)
    sock = edge.connect()
    edge.loop.advance(1)
    edge.send(sock, b"GET /first HTTP/1.1\r\nHost: p\r\n\r\n")
    edge.loop.advance(2)
    edge.answer(sock)  # at 3 s: the next head is due by 3 + 20 + 5 = 28 s
    edge.loop.advance(4)
    edge.send(sock, b"GET /second HTTP/1.1\r\nHo")
    edge.loop.advance(IDLE_S + HEAD_S - 4 - 0.1)
    open_before = not sock.closed
    edge.loop.advance(0.2)
    answers = bytes(sock.written).count(b"HTTP/1.1 ")
    assert (open_before, sock.closed, answers) == (True, True, 1)
