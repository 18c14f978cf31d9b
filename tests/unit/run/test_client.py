"""Run's client: every request gives up at its channel's timeout; a join survives a lost answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from moonrun.backoff import Backoff
from moonrun.errors import ForeignAnswer, JoinUnconfirmed
from moonrun.run.client import ChannelSettings, PlatformClient, SessionInfo, Unreachable, join
from moonrun.security import signing
from tests.support.launcher import free_port
from tests.unit.run.test_agent import served_platform

QUICK = {
    name: ChannelSettings(timeout_s=0.2, connections=2)
    for name in ("control", "jobs", "logs", "artifacts")
}
QUICK_BACKOFF = Backoff(initial_s=0.01, max_s=0.05)
HANG_GUARD_S = 20.0
"""Far beyond any channel's timeout here: reached only by a request that never gives up."""


@asynccontextmanager
async def silent_platform() -> AsyncIterator[str]:
    """A server that reads every request and never answers (an overloaded platform)."""
    connections: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for writer in connections:
            writer.close()
        server.close()


CALLS: dict[str, Callable[[PlatformClient], Awaitable[object]]] = {
    "register": lambda c: c.register("boot", 1),
    "heartbeat": lambda c: c.heartbeat(),
    "reconcile": lambda c: c.reconcile([]),
    "claim": lambda c: c.claim(1),
    "acks": lambda c: c.acks([{"job_id": "job_1", "attempt": 1, "lease": "l"}]),
    "results": lambda c: c.results([{"job_id": "job_1", "attempt": 1, "lease": "l"}]),
    "progress": lambda c: c.progress("job_1", 1, "l", 0, 50.0, None),
    "cancel_poll": lambda c: c.cancel_poll("job_1", 1, "l"),
    "send_logs": lambda c: c.send_logs("job_1", 1, "l", 0, []),
    "put_chunk": lambda c: c.put_chunk("job_1", 1, "l", "out", 0, b"x", final=True),
}


@pytest.mark.anyio
@pytest.mark.parametrize("call", sorted(CALLS))
async def test_every_request_gives_up_at_its_channels_timeout(call: str) -> None:
    """A request that names no timeout of its own still has its channel's: against a platform
    that never answers it fails as unreachable (Run's lost-contact path), never hangs."""
    async with silent_platform() as url:
        client = PlatformClient(url, "ep_1", Ed25519PrivateKey.generate(), channels=QUICK)
        client.session = SessionInfo("ses_1", b"k" * 32, 1, 10.0, 50.0, 30.0, 40.0)
        async with client:
            with pytest.raises(Unreachable, match="TimeoutError"):
                await asyncio.wait_for(CALLS[call](client), HANG_GUARD_S)


# -- joining -----------------------------------------------------------------------------------


@asynccontextmanager
async def losing_first_answer(target: str) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A proxy to `target` that passes every request on but loses the first answer (the
    connection closes once the platform has answered), and the requests it saw."""
    host, port = target.removeprefix("http://").split(":")
    seen: list[bytes] = []

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        request = head + await reader.readexactly(length)
        seen.append(request)
        upstream_reader, upstream = await asyncio.open_connection(host, int(port))
        # One request per connection, so the answer ends where the connection does.
        upstream.write(head[:-2] + b"Connection: close\r\n\r\n" + request[len(head) :])
        answer = await upstream_reader.read()
        upstream.close()
        if len(seen) > 1:
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen
    finally:
        server.close()


@pytest.mark.anyio
async def test_a_join_whose_answer_was_lost_is_tried_again_and_gets_its_endpoint(
    tmp_path: Path,
) -> None:
    """The platform burned the token but its answer never arrived: Run sends the same token
    and key again, and the platform answers with the endpoint of that same join."""
    async with served_platform(tmp_path) as world:
        enrolled = world.platform.service.create_endpoint(world.admin, "host-2")
        key = signing.b64url(Ed25519PrivateKey.generate().public_key().public_bytes_raw())
        async with losing_first_answer(world.url) as (url, seen):
            endpoint_id = await asyncio.wait_for(
                join(url, enrolled.join_token, key, backoff=QUICK_BACKOFF), HANG_GUARD_S
            )

    assert endpoint_id == enrolled.endpoint.id
    assert len(seen) == 2
    assert seen[0].partition(b"\r\n\r\n")[2] == seen[1].partition(b"\r\n\r\n")[2]


@pytest.mark.anyio
async def test_a_join_that_may_have_arrived_but_never_got_an_answer_is_unconfirmed() -> None:
    """Every try reached a platform that never answered: JoinUnconfirmed (keep the key and
    try again), not a plain unreachable."""
    async with silent_platform() as url:
        with pytest.raises(JoinUnconfirmed, match="run the same command again"):
            await asyncio.wait_for(
                join(url, "mrj_x", "k", timeout_s=0.2, tries=2, backoff=QUICK_BACKOFF),
                HANG_GUARD_S,
            )


@pytest.mark.anyio
async def test_a_join_that_never_connected_is_plainly_unreachable() -> None:
    """Nothing listens: nothing was sent, so the key may go (Unreachable, not unconfirmed)."""
    with pytest.raises(Unreachable) as raised:
        await join(f"http://127.0.0.1:{free_port()}", "mrj_x", "k", tries=2, backoff=QUICK_BACKOFF)
    assert not isinstance(raised.value, JoinUnconfirmed)


# -- answers in a foreign shape ----------------------------------------------------------------


@asynccontextmanager
async def answering_platform(answer: Callable[[str], object]) -> AsyncIterator[str]:
    """A server that answers every request 200 with `answer(path)` as JSON (a platform of
    another version, or something else that speaks HTTP at that address)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                body = json.dumps(answer(path)).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


@pytest.mark.anyio
@pytest.mark.parametrize("call", sorted(CALLS))
async def test_an_answer_in_a_foreign_shape_is_foreign_answer_never_a_key_error(call: str) -> None:
    """Every request whose answer lacks its declared fields fails as ForeignAnswer, a kind of
    Unreachable (so Run backs off and tries again, as for no answer), at the client's edge."""
    async with answering_platform(lambda path: {"answers": [], "jobs": [{}], "x": 1}) as url:
        client = PlatformClient(url, "ep_1", Ed25519PrivateKey.generate(), channels=QUICK)
        client.session = SessionInfo("ses_1", b"k" * 32, 1, 10.0, 50.0, 30.0, 40.0)
        async with client:
            with pytest.raises(ForeignAnswer) as raised:
                await asyncio.wait_for(CALLS[call](client), HANG_GUARD_S)
    assert isinstance(raised.value, Unreachable)


@pytest.mark.anyio
async def test_a_field_of_another_type_is_named_but_its_value_never_shown() -> None:
    """A registration whose generation is a string: ForeignAnswer names the field and both
    types; the session key beside it (a secret) appears nowhere."""
    registered = {
        "session_id": "ses_1",
        "session_key": "c2VjcmV0LXNlc3Npb24ta2V5",
        "generation": "1",
        "expires_at": "2026-11-30T04:00:00.000Z",
        "heartbeat_interval_s": 10.0,
        "session_ttl_s": 50.0,
        "ack_timeout_s": 30.0,
        "lease_ttl_s": 40.0,
    }
    async with answering_platform(lambda path: registered) as url:
        client = PlatformClient(url, "ep_1", Ed25519PrivateKey.generate(), channels=QUICK)
        async with client:
            with pytest.raises(ForeignAnswer) as raised:
                await client.register("boot", 1)

    assert str(raised.value).endswith("at generation: expected an integer, got a string")
    assert registered["session_key"] not in str(raised.value)
    assert client.session is None


@pytest.mark.anyio
async def test_a_batch_answered_for_other_jobs_is_foreign() -> None:
    """Entries that do not answer the acks sent, one each and in order, are not taken as theirs."""
    answer = {"state": "running", "lease_expires_at": "2026-11-30T04:00:00.000Z"}
    other = {"answers": [{"job_id": "job_2", "status": 200, "answer": answer}]}
    async with answering_platform(lambda path: other) as url:
        client = PlatformClient(url, "ep_1", Ed25519PrivateKey.generate(), channels=QUICK)
        client.session = SessionInfo("ses_1", b"k" * 32, 1, 10.0, 50.0, 30.0, 40.0)
        async with client:
            with pytest.raises(ForeignAnswer, match="for other jobs than were sent"):
                await client.acks([{"job_id": "job_1", "attempt": 1, "lease": "l"}])
