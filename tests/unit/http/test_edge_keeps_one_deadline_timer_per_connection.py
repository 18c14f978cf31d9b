"""A connection holds at most one deadline timer however often its state changes (a head, a
body, a vouch, an answer): a deadline that moves later keeps the timer, which fires early and
is armed again for the deadline then; a busy connection holds none."""

from __future__ import annotations

from tests.unit.http.test_http_edge import Edge, Socket


def deadline_timers(edge: Edge, sock: Socket) -> int:
    assert sock.protocol is not None
    expire = sock.protocol._expire
    return sum(1 for t in edge.loop.timers if not t.cancelled and t.callback == expire)


def test_a_connection_holds_one_deadline_timer_through_a_request() -> None:
    edge = Edge(header_timeout_s=5, body_timeout_s=10, min_body_rate=1)
    sock = edge.connect()
    counts = [deadline_timers(edge, sock)]
    edge.send(sock, b"POST /x HTTP/1.1\r\nHost: p\r\nContent-Length: 4\r\n\r\nab")  # later
    counts.append(deadline_timers(edge, sock))
    edge.request(sock).trust()
    counts.append(deadline_timers(edge, sock))
    edge.loop.advance(10.5)  # the early timer fires and is armed again for 12 s
    counts.append(deadline_timers(edge, sock))
    edge.send(sock, b"cd")  # busy: no timer
    counts.append(deadline_timers(edge, sock))
    edge.answer(sock)  # waiting for a head again
    counts.append(deadline_timers(edge, sock))
    assert (counts, sock.closed) == ([1, 1, 1, 1, 0, 1], False)
