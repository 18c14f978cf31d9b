"""A connection the client closed (or the edge dropped) leaves the count of open connections
at once: under a cap of 2, with one of two connections gone, a third is let in and evicts
nobody."""

from __future__ import annotations

from tests.unit.http.test_http_edge import Edge


def test_a_connection_closed_by_its_client_frees_its_place_under_the_cap() -> None:
    edge = Edge(max_connections=2)
    gone, staying = edge.connect(), edge.connect()
    gone.close()  # the client went away: uvicorn's connection_lost
    newcomer = edge.connect()
    assert (staying.closed, newcomer.closed) == (False, False)


def test_a_connection_dropped_at_its_deadline_frees_its_place_under_the_cap() -> None:
    edge = Edge(max_connections=2, header_timeout_s=5)
    late = edge.connect()
    edge.loop.advance(3)
    staying = edge.connect()
    edge.loop.advance(2.1)  # the first is dropped at 5 s, the second has until 8 s
    newcomer = edge.connect()
    assert (late.closed, staying.closed, newcomer.closed) == (True, False, False)
