"""A refusal at the edge, as the client reads it and as the log says it: the JSON envelope
with its exact length, `connection: close`, the server's default headers, one log line with
the status and code; and an unfinished header line bounded to the byte."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tests.unit.http.test_http_edge import Edge, Socket

LIMITS: dict[str, Any] = {"max_line_bytes": 100, "max_head_bytes": 300}


def refused_request() -> Socket:
    edge = Edge(**LIMITS)
    edge.state.default_headers = [(b"server", b"moonrun-test")]
    sock = edge.connect()
    edge.send(sock, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 200 + b"\r\n\r\n")
    return sock


def test_a_refusal_is_the_json_envelope_with_its_length_and_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="moonrun.http"):
        sock = refused_request()
    head, _, body = bytes(sock.written).partition(b"\r\n\r\n")
    status_line, *headers = head.split(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 431 ")
    assert headers == [
        b"server: moonrun-test",
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
    ]
    assert json.loads(body) == {
        "error": {"code": "headers_too_large", "message": "a header line is over 100 bytes"}
    }
    assert sock.closed
    said = [(r.getMessage(), getattr(r, "fields", None)) for r in caplog.records]
    assert said == [("request refused at the edge", {"status": 431, "code": "headers_too_large"})]


def unfinished(line: bytes) -> Socket:
    """A head whose last header line has not ended (yet): httptools holds it."""
    edge = Edge(**LIMITS)
    sock = edge.connect()
    edge.send(sock, b"GET / HTTP/1.1\r\nHost: p\r\n")
    edge.send(sock, line)
    return sock


def test_an_unfinished_header_line_of_exactly_the_bound_is_held_one_byte_more_refused() -> None:
    assert not unfinished(b"X-Big: " + b"a" * 93).closed
    sock = unfinished(b"X-Big: " + b"a" * 94)
    assert (sock.closed, sock.answer()[0]) == (True, 431)


def test_an_unfinished_line_after_a_newline_in_the_same_read_counts_from_that_newline() -> None:
    edge = Edge(**LIMITS)
    sock = edge.connect()
    edge.send(sock, b"GET / HTTP/1.1\r\nX-A: " + b"a" * 90 + b"\r\nX-B: " + b"b" * 95)
    held = not sock.closed
    edge.send(sock, b"b")
    assert (held, sock.closed) == (True, True)


def test_an_unfinished_line_that_takes_the_head_past_its_bound_is_refused() -> None:
    edge = Edge(max_line_bytes=200, max_head_bytes=300)
    sock = edge.connect()
    head = b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (n, b"v" * 90) for n in range(2))
    edge.send(sock, head)  # the target (1 byte) and two lines of 95 bytes, each with its CRLF
    edge.send(sock, b"X-2: " + b"v" * 100)  # 105 more: 300, the bound
    held = not sock.closed
    edge.send(sock, b"v")
    assert (held, sock.closed, sock.answer()[0]) == (True, True, 431)
