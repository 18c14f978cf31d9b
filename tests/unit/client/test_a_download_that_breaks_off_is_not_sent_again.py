"""A download whose answer breaks off after its body began is not sent again (each client
retried it, so a file object given to `download` got the first part twice); one that fails
before its body begins is retried as any request is."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from moonrun.errors import Unreachable
from tests.support.both_clients import FLAVOURS, Flavour, connect


class BreaksOff(httpx.SyncByteStream, httpx.AsyncByteStream):
    """An artifact's body that stops after its first chunk (a connection reset)."""

    def __iter__(self) -> Iterator[bytes]:
        yield b"first part;"
        raise httpx.ReadError("connection reset mid-body")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"first part;"
        raise httpx.ReadError("connection reset mid-body")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_download_that_breaks_off_mid_body_raises_unreachable_without_a_retry(
    flavour: Flavour, tmp_path: Path
) -> None:
    sent: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, stream=BreaksOff())

    into = io.BytesIO()
    dest = tmp_path / "artifact.bin"
    with connect(
        flavour, "http://platform", "t", transport=httpx.MockTransport(handle), sleep=lambda _: None
    ) as client:
        with pytest.raises(Unreachable, match="broke off"):
            client.download("job_1", "out.tar", into)
        with pytest.raises(Unreachable, match="broke off"):
            client.download("job_1", "out.tar", dest)
    assert (len(sent), into.getvalue()) == (2, b"first part;")
    assert list(tmp_path.iterdir()) == []  # no partial file left behind


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_download_refused_before_its_body_is_retried_then_written_once(
    flavour: Flavour,
) -> None:
    answers = [
        httpx.Response(503, json={"error": {"code": "contention", "message": "busy"}}),
        httpx.Response(200, content=b"whole artifact"),
    ]

    def handle(request: httpx.Request) -> httpx.Response:
        return answers.pop(0)

    into = io.BytesIO()
    with connect(
        flavour, "http://platform", "t", transport=httpx.MockTransport(handle), sleep=lambda _: None
    ) as client:
        written = client.download("job_1", "out.tar", into, attempt=1)
    assert (written, into.getvalue(), answers) == (14, b"whole artifact", [])
