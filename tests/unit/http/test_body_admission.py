"""A request takes no place on its channel until its head's credentials are checked and its
body has arrived; callers nobody vouched for wait for their bodies on the anonymous channel.

In-process: the app is called as uvicorn calls it, with the edge's `RequestEdge` in the scope
saying the body has not arrived yet, and a `receive` that hands the body over only when the test
says so. Meanwhile the test looks at what the request holds: places on its channel and on the
anonymous channel, and whether the edge was asked to keep its connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moonrun.http.channels import Channels
from moonrun.http.edge import EDGE_EXTENSION, RequestEdge
from moonrun.security.tokens import b64url
from moonrun.service.websessions import SESSION_COOKIE
from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory

STEPS_GUARD = 10_000
"""Only a guard against waiting forever for the app to reach its body."""


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path, channels=Channels.with_limits(anonymous=1)) as cast:
        yield cast


class Stand:
    """A stand-in for one of uvicorn's objects (a SimpleNamespace cannot be held weakly)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class Pending:
    """One request whose body arrives when the test says: its scope, receive and answer."""

    def __init__(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        self.body = body
        self.arrival = asyncio.Event()
        self.reads = 0
        self.trusted = False
        # Kept here: the edge holds uvicorn's cycle and connection weakly, as uvicorn holds them.
        self.cycle = Stand(more_body=True)
        self.connection = Stand(cycle=self.cycle, trust=self._trust)
        self.scope: dict[str, Any] = {
            "type": "http",
            "http_version": "1.1",
            "method": method,
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "scheme": "http",
            "query_string": b"",
            "server": ("127.0.0.1", 8470),
            "client": ("127.0.0.1", 40000),
            "headers": [
                (name.lower().encode(), value.encode())
                for name, value in {**headers, "content-length": str(len(body))}.items()
            ],
            "extensions": {EDGE_EXTENSION: RequestEdge(self.connection, self.cycle)},
        }
        self.status: int | None = None
        self.answer = b""
        self.gone = False

    def _trust(self) -> None:
        self.trusted = True

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        await self.arrival.wait()
        if self.gone:
            return {"type": "http.disconnect"}
        self.cycle.more_body = False
        return {"type": "http.request", "body": self.body, "more_body": False}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        else:
            self.answer += message.get("body", b"")

    def code(self) -> str:
        code: str = json.loads(self.answer)["error"]["code"]
        return code


async def started(app: Any, request: Pending) -> asyncio.Task[None]:
    """The app serving `request`, once it waits for the body or has answered."""
    task = asyncio.ensure_future(app(request.scope, request.receive, request.send))
    for _ in range(STEPS_GUARD):
        if request.reads or task.done():
            return task
        await asyncio.sleep(0)
    raise AssertionError("the app neither read the body nor answered")


def in_flight(cast: Cast) -> dict[str, int]:
    channels = cast.world.platform.channels
    return {
        name: getattr(channels, name).in_flight
        for name in ("control", "jobs", "user", "anonymous")
        if getattr(channels, name).in_flight
    }


def signed_claim(cast: Cast) -> Pending:
    run = cast.run
    run.start()
    body = json.dumps({"max_jobs": 1}).encode()
    headers = run.signed_headers("POST", "/run/v1/jobs/claim", body)
    return Pending("POST", "/run/v1/jobs/claim", headers, body)


def owners_job(cast: Cast, token: str | None = None) -> Pending:
    body = json.dumps({"kind": "noop"}).encode()
    headers = {"Content-Type": "application/json"}
    headers["Authorization"] = f"Bearer {token or cast.owner[1]}"
    return Pending("POST", f"/api/v1/servers/{cast.server_id}/jobs", headers, body)


def join(cast: Cast) -> Pending:
    body = json.dumps({"join_token": "mrj_x", "identity_public_key": b64url(bytes(32))}).encode()
    return Pending("POST", "/run/v1/join", {"Content-Type": "application/json"}, body)


@pytest.mark.parametrize(
    ("request_of", "status"),
    [
        pytest.param(signed_claim, 200, id="a Run's signed claim"),
        pytest.param(owners_job, 201, id="a user's new job"),
    ],
)
def test_a_vouched_request_takes_no_place_on_its_channel_while_its_body_arrives(
    cast: Cast, request_of: Any, status: int
) -> None:
    """A signature verified from the head (it covers Content-Digest), or a user's token checked
    before the body: while the body is on its way the request holds no place on its channel or
    the anonymous channel, and the edge is asked to keep its connection; then it is served."""

    async def scenario() -> None:
        request = request_of(cast)
        task = await started(cast.world.app, request)
        assert (in_flight(cast), request.trusted, request.status) == ({}, True, None)
        request.arrival.set()
        await task
        assert (request.status, in_flight(cast)) == (status, {})

    asyncio.run(scenario())


def unsigned_heartbeat(cast: Cast) -> Pending:
    return Pending("POST", "/run/v1/heartbeat", {}, b"{}")


def heartbeat_signed_with_another_key(cast: Cast) -> Pending:
    headers = cast.run.signed_headers(
        "POST", "/run/v1/heartbeat", b"{}", key_id="session:ses_x", key=b"k" * 32
    )
    return Pending("POST", "/run/v1/heartbeat", headers, b"{}")


def job_without_a_token(cast: Cast) -> Pending:
    request = owners_job(cast)
    request.scope["headers"] = [h for h in request.scope["headers"] if h[0] != b"authorization"]
    return request


def job_with_a_made_up_token(cast: Cast) -> Pending:
    return owners_job(cast, "mra_" + "made-up" * 8)


@pytest.mark.parametrize(
    ("request_of", "code"),
    [
        pytest.param(unsigned_heartbeat, "signature_missing", id="unsigned heartbeat"),
        pytest.param(heartbeat_signed_with_another_key, "signature_invalid", id="wrong key"),
        pytest.param(job_without_a_token, "unauthenticated", id="no token"),
        pytest.param(job_with_a_made_up_token, "unauthenticated", id="made-up token"),
    ],
)
def test_a_request_without_valid_credentials_is_refused_before_its_body_is_read(
    cast: Cast, request_of: Any, code: str
) -> None:
    """401 from the head alone: the body is never waited for, no place is taken."""

    async def scenario() -> None:
        request = request_of(cast)
        task = await started(cast.world.app, request)
        await task
        assert (request.status, request.code(), request.reads, in_flight(cast)) == (
            401,
            code,
            0,
            {},
        )

    asyncio.run(scenario())


def test_an_anonymous_body_waits_on_the_anonymous_channel_and_a_full_one_refuses_at_once(
    cast: Cast,
) -> None:
    """A join (its token is in the body) waits for its body on the anonymous channel, never the
    control channel's places; with the anonymous channel full (1 here) the next is 429
    `channel_busy` without its body being read; once the first body arrives the place is free."""

    async def scenario() -> None:
        first, second = join(cast), join(cast)
        first_task = await started(cast.world.app, first)
        assert (in_flight(cast), first.trusted) == ({"anonymous": 1}, False)
        await (await started(cast.world.app, second))
        assert (second.status, second.code(), second.reads) == (429, "channel_busy", 0)
        first.arrival.set()
        await first_task
        assert (first.status, first.code(), in_flight(cast)) == (401, "join_token_invalid", {})

    asyncio.run(scenario())


def test_a_body_that_has_arrived_needs_no_anonymous_place(tmp_path: Path) -> None:
    """With no anonymous places at all, a join whose body came with its head is served."""
    channels = Channels.with_limits(anonymous=0)
    with http_world(memory_factory(), tmp_path, channels=channels) as cast:

        async def scenario() -> None:
            request = join(cast)
            request.cycle.more_body = False
            request.arrival.set()
            await (await started(cast.world.app, request))
            assert (request.status, request.code()) == (401, "join_token_invalid")

        asyncio.run(scenario())


def test_a_client_gone_before_its_body_arrived_is_a_log_line_not_an_answer(
    cast: Cast, caplog: pytest.LogCaptureFixture
) -> None:
    """The edge closed it (deadline, eviction) or the client left: nothing is sent, nothing is
    logged above INFO, and the place is given back."""

    async def scenario() -> None:
        request = join(cast)
        task = await started(cast.world.app, request)
        request.gone = True
        request.arrival.set()
        await task
        assert (request.status, in_flight(cast)) == (None, {})

    with caplog.at_level(logging.INFO, logger="moonrun"):
        asyncio.run(scenario())
    lines = [(r.levelno, getattr(r, "fields", {}).get("status")) for r in caplog.records]
    assert (logging.INFO, 499) in lines
    assert max(level for level, _ in lines) == logging.INFO


def sign_in_form(cookie: str | None = None) -> Pending:
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if cookie is not None:
        headers["Cookie"] = f"{SESSION_COOKIE}={cookie}"
    return Pending("POST", "/login", headers, b"username=x&password=y&csrf_token=z")


def test_a_console_form_nobody_vouched_for_waits_on_the_anonymous_channel(cast: Cast) -> None:
    """A sign-in form whose body is on its way holds the anonymous channel's place (one here);
    the next such form is refused 429 at once; the place is free once the body arrives."""

    async def scenario() -> None:
        first, second = sign_in_form(), sign_in_form()
        first_task = await started(cast.world.app, first)
        assert (in_flight(cast), first.trusted) == ({"anonymous": 1}, False)
        await (await started(cast.world.app, second))
        assert (second.status, second.reads) == (429, 0)
        first.arrival.set()
        await first_task
        assert in_flight(cast) == {}

    asyncio.run(scenario())


def test_a_console_form_from_a_signed_in_session_takes_no_anonymous_place(cast: Cast) -> None:
    """A live session cookie vouches for the form: with the anonymous channel full, its body is
    still read, and the edge is asked to keep its connection."""
    platform = cast.world.platform
    cookie = platform.web.open(platform.directory.authenticate(cast.owner[1]))

    async def scenario() -> None:
        stalled = sign_in_form()
        stalled_task = await started(cast.world.app, stalled)
        signed_in = sign_in_form(cookie)
        signed_in_task = await started(cast.world.app, signed_in)
        assert (signed_in.reads, signed_in.trusted, in_flight(cast)) == (1, True, {"anonymous": 1})
        for request in (stalled, signed_in):
            request.arrival.set()
        await asyncio.gather(stalled_task, signed_in_task)

    asyncio.run(scenario())
