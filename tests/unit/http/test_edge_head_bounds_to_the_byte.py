"""The edge's head bounds hold to the byte, each refusal saying which bound: a header line of
`name: value` up to `max_line_bytes`, a head (request target and every header line with its
CRLF) up to `max_head_bytes`, at most `max_headers` headers, a request line up to
`max_line_bytes`."""

from __future__ import annotations

from typing import Any

from tests.unit.http.test_http_edge import Edge

LIMITS: dict[str, Any] = {"max_line_bytes": 100, "max_head_bytes": 300, "max_headers": 3}


def sent(head: bytes) -> tuple[bool, Any]:
    """Whether the head was served (no answer written), else the refusal's status and words."""
    edge = Edge(**LIMITS)
    sock = edge.connect()
    edge.send(sock, head)
    if not sock.written:
        return True, Edge.request(sock).arrived
    status, body = sock.answer()
    return False, (status, body["error"]["message"])


def head(*values: bytes, target: bytes = b"/") -> bytes:
    lines = b"".join(b"X-%d: %s\r\n" % (n, value) for n, value in enumerate(values))
    return b"GET " + target + b" HTTP/1.1\r\n" + lines + b"\r\n"


def test_a_header_line_of_exactly_the_bound_is_served_one_byte_more_is_refused() -> None:
    # "X-0: " + value: 3 + 2 + len(value) bytes
    assert sent(head(b"v" * 95)) == (True, True)
    assert sent(head(b"v" * 96)) == (False, (431, "a header line is over 100 bytes"))


def test_a_head_of_exactly_the_bound_is_served_one_byte_more_is_refused() -> None:
    # Each header counts 3 + 2 + len(value) + 2 (its CRLF); the target "/" one byte.
    assert sent(head(b"v" * 93, b"v" * 93, b"v" * 92)) == (True, True)
    refused = (False, (431, "the request head is over 300 bytes"))
    assert sent(head(b"v" * 93, b"v" * 93, b"v" * 93)) == refused


def test_more_headers_than_the_bound_are_refused_saying_how_many() -> None:
    assert sent(head(b"a", b"b", b"c")) == (True, True)
    assert sent(head(b"a", b"b", b"c", b"d")) == (
        False,
        (431, "a request has at most 3 headers"),
    )


def test_a_request_line_over_the_bound_is_refused_as_too_long() -> None:
    status, message = sent(head(target=b"/" + b"a" * 200))[1]
    assert (status, message) == (414, "the request line is over 100 bytes")
