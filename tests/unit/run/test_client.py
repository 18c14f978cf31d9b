"""Run's client: every request gives up at its channel's timeout; a join survives a lost answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from moonrun.backoff import Backoff
from moonrun.errors import (
    AckDeadlineExpired,
    AlreadyExists,
    ArtifactConflict,
    ChannelBusy,
    Forbidden,
    ForeignAnswer,
    IdempotencyConflict,
    InvalidRequest,
    JobNotFound,
    JoinTokenInvalid,
    JoinUnconfirmed,
    LeaseExpired,
    LeaseMismatch,
    MoonrunError,
    NoCancelIntent,
    NotActive,
    NotFound,
    ReconcileRequired,
    Replayed,
    SequenceRegression,
    SessionExpired,
    SessionRotated,
    SignatureExpired,
    SignatureInvalid,
    SignatureMissing,
    StaleAttempt,
    TerminalConflict,
    TooLarge,
    Unauthenticated,
    WrongEndpoint,
)
from moonrun.run.client import (
    SESSION_ERRORS,
    TRANSIENT,
    ChannelSettings,
    PlatformClient,
    SessionInfo,
    Unreachable,
    error_from,
    join,
)
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


# -- client: error answers ------------------------------------------------------------------

PROTOCOL_ERRORS: list[tuple[int, str, type[MoonrunError]]] = [
    (422, "invalid_request", InvalidRequest),
    (413, "too_large", TooLarge),
    (401, "unauthenticated", Unauthenticated),
    (403, "forbidden", Forbidden),
    (404, "not_found", NotFound),
    (401, "join_token_invalid", JoinTokenInvalid),
    (401, "signature_missing", SignatureMissing),
    (401, "signature_invalid", SignatureInvalid),
    (401, "signature_expired", SignatureExpired),
    (401, "replayed", Replayed),
    (401, "session_rotated", SessionRotated),
    (401, "session_expired", SessionExpired),
    (404, "job_not_found", JobNotFound),
    (403, "wrong_endpoint", WrongEndpoint),
    (409, "stale_attempt", StaleAttempt),
    (409, "lease_mismatch", LeaseMismatch),
    (409, "reconcile_required", ReconcileRequired),
    (409, "ack_deadline_expired", AckDeadlineExpired),
    (409, "lease_expired", LeaseExpired),
    (409, "not_active", NotActive),
    (409, "no_cancel_intent", NoCancelIntent),
    (409, "sequence_regression", SequenceRegression),
    (409, "terminal_conflict", TerminalConflict),
    (429, "channel_busy", ChannelBusy),
    (409, "already_exists", AlreadyExists),
    (409, "idempotency_conflict", IdempotencyConflict),
    (409, "artifact_conflict", ArtifactConflict),
]


@pytest.mark.parametrize(("status", "code", "error_type"), PROTOCOL_ERRORS, ids=lambda v: str(v))
def test_an_error_answer_becomes_the_type_its_code_names(
    status: int, code: str, error_type: type[MoonrunError]
) -> None:
    """Each wire error code maps to its moonrun.errors type, message kept."""
    error = error_from(status, {"error": {"code": code, "message": "said the platform"}})

    assert (type(error), error.message, error.code) == (error_type, "said the platform", code)


def test_an_error_answer_without_a_message_carries_its_code() -> None:
    """No message in the body: the code stands in for it."""
    error = error_from(409, {"error": {"code": "lease_expired"}})

    assert (type(error), error.message) == (LeaseExpired, "lease_expired")


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, {"error": {"code": "internal", "message": "bug"}}),
        (502, None),
        (503, {"error": {"code": "store_unavailable", "message": "down"}}),
        (503, {"error": {"code": "contention", "message": "busy"}}),
        (504, "<html>gateway timeout</html>"),
        (404, None),
        (400, {"detail": "not moonrun's error shape"}),
        (409, {"error": "flat string"}),
    ],
    ids=repr,
)
def test_server_errors_and_unknown_bodies_are_unreachable(status: int, body: Any) -> None:
    """5xx (whatever its code) and bodies without an error code: Unreachable, a transient."""
    error = error_from(status, body)

    assert type(error) is Unreachable
    assert isinstance(error, TRANSIENT)
    assert str(status) in error.message


def test_an_unknown_error_code_is_a_plain_permanent_error() -> None:
    """A 4xx code this Run does not know: a MoonrunError that is neither transient nor session."""
    error = error_from(409, {"error": {"code": "from_the_future", "message": "new"}})

    assert type(error) is MoonrunError
    assert not isinstance(error, TRANSIENT + SESSION_ERRORS)


def test_session_answers_and_transient_answers_are_classified() -> None:
    """session_*, reconcile_required and signature_invalid mean re-register; busy, expired
    signatures, replays and no answer mean try again."""
    session = {
        type(error_from(s, {"error": {"code": c}}))
        for s, c in [
            (401, "session_rotated"),
            (401, "session_expired"),
            (409, "reconcile_required"),
            (401, "signature_invalid"),
        ]
    }
    transient = {
        type(error_from(s, {"error": {"code": c}}))
        for s, c in [
            (429, "channel_busy"),
            (401, "signature_expired"),
            (401, "replayed"),
            (503, "contention"),
        ]
    }

    assert session == set(SESSION_ERRORS)
    assert transient <= set(TRANSIENT)
    assert not any(issubclass(t, SESSION_ERRORS) for t in (NotActive, LeaseExpired, StaleAttempt))
