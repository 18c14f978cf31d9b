"""The head bounds count from where the head begins, to the byte: the request line's target
up to `max_line_bytes` exactly; blank lines before a connection's first request count for
nothing; after a read in which a head began behind another request (where, httptools does not
say), its unfinished line is counted from the next read, and refused as a header line (431)
once its request line ended, as a request line (414) before. And a request that is not HTTP says
so in its refusal's words."""

from __future__ import annotations

from typing import Any

from tests.unit.http.test_http_edge import Edge

LIMITS: dict[str, Any] = {"max_line_bytes": 100, "max_head_bytes": 300}


def test_a_request_target_of_exactly_the_line_bound_is_served_one_byte_more_is_refused() -> None:
    served = Edge(**LIMITS)
    sock = served.connect()
    served.send(sock, b"GET /" + b"a" * 99 + b" HTTP/1.1\r\nHost: p\r\n\r\n")
    refused = Edge(**LIMITS)
    other = refused.connect()
    refused.send(other, b"GET /" + b"a" * 100 + b" HTTP/1.1\r\nHost: p\r\n\r\n")
    assert (sock.closed, Edge.request(sock).arrived) == (False, True)
    assert (other.answer()[0], other.answer()[1]["error"]["code"]) == (414, "uri_too_long")


def test_blank_lines_before_the_first_request_count_nothing_toward_the_head() -> None:
    """A CR held before any request: the head bound (300 bytes) is reached by the CRs
    themselves, not by anything counted before them."""
    edge = Edge(max_line_bytes=1000, max_head_bytes=300)
    sock = edge.connect()
    edge.send(sock, b"\r\n" + b"\r" * 300)
    held = not sock.closed
    edge.send(sock, b"\r")
    assert (held, sock.closed, sock.answer()[0]) == (True, True, 431)


def test_a_line_begun_behind_another_request_is_counted_from_the_next_read() -> None:
    edge = Edge(**LIMITS)
    sock = edge.connect()
    edge.send(sock, b"GET /a HTTP/1.1\r\nHost: p\r\n\r\nGET /b HTTP/1.1\r\nX-Long: ")
    edge.send(sock, b"v" * 100)
    held = not sock.closed
    edge.send(sock, b"v")
    assert (held, sock.closed, sock.answer()[0]) == (True, True, 431)


def test_a_request_line_begun_behind_another_request_is_refused_as_one() -> None:
    edge = Edge(**LIMITS)
    sock = edge.connect()
    edge.send(sock, b"GET /a HTTP/1.1\r\nHost: p\r\n\r\nGET /b")
    edge.send(sock, b"b" * 100)
    assert (sock.closed, sock.answer()[0]) == (True, 414)


def test_bytes_that_are_not_http_are_refused_saying_so() -> None:
    edge = Edge()
    sock = edge.connect()
    edge.send(sock, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")
    assert sock.answer()[1]["error"] == {
        "code": "invalid_request",
        "message": "the request is not valid HTTP/1.1",
    }
