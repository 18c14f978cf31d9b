"""Run heartbeats at the interval the platform's last heartbeat answer told (it stretches as
the platform's fleet grows); an answer that tells none, or a foreign one, changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from moonrun.run.client import PlatformClient, SessionInfo
from tests.unit.run.test_client import QUICK, answering_platform

REGISTERED = SessionInfo("ses_1", b"k" * 32, 1, 10.0, 50.0, 30.0, 40.0)


async def interval_after(answer: dict[str, Any]) -> float:
    async with answering_platform(lambda path: answer) as url:
        client = PlatformClient(url, "ep_1", Ed25519PrivateKey.generate(), channels=QUICK)
        client.session = REGISTERED
        async with client:
            await client.heartbeat()
        assert client.session is not None
        assert client.session.session_id == REGISTERED.session_id
        return client.session.heartbeat_interval_s


BEAT = {"session_expires_at": "2026-11-30T04:00:00.000Z", "server_time": "2026-11-30T04:00:00.000Z"}


@pytest.mark.anyio
async def test_the_interval_a_heartbeat_answer_tells_is_the_sessions_from_then_on() -> None:
    assert await interval_after({**BEAT, "heartbeat_interval_s": 50.0}) == 50.0


@pytest.mark.anyio
async def test_an_older_platform_that_tells_none_leaves_the_registered_interval() -> None:
    assert await interval_after(BEAT) == 10.0


@pytest.mark.anyio
@pytest.mark.parametrize("told", [0.0, 0.001, -5.0])
async def test_an_interval_under_a_second_is_not_taken(told: float) -> None:
    """A foreign answer must not turn Run's heartbeats into a busy loop."""
    assert await interval_after({**BEAT, "heartbeat_interval_s": told}) == 10.0
