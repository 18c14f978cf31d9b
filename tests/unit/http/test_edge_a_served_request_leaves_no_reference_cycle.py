"""A served request is freed by reference counting alone: its scope holds its `RequestEdge`,
which holds the request's uvicorn cycle and connection weakly. Strong references made every
request a reference cycle, left to the garbage collector: at 5,000 Runs 33,000 objects a
second, collected in pauses of 50 to 100 ms (the fleet's heartbeat p99). A connection itself is a
cycle of uvicorn's (its protocol and its current request's cycle hold each other): one per
connection, not per request."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from tests.unit.http.test_http_edge import Edge


@pytest.fixture
def no_collector() -> Iterator[None]:
    """Only reference counting frees anything meanwhile."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_an_answered_request_is_freed_once_the_next_begins(no_collector: None) -> None:
    edge = Edge()
    sock = edge.connect()
    assert sock.protocol is not None
    edge.send(sock, b"GET /a HTTP/1.1\r\nHost: p\r\n\r\n")
    first = weakref.ref(sock.protocol.cycle)
    Edge.answer(sock)
    edge.send(sock, b"GET /b HTTP/1.1\r\nHost: p\r\n\r\n")
    assert first() is None
