"""Run's client: every request gives up at its channel's timeout when the platform is slow."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from moonrun.run.client import ChannelSettings, PlatformClient, SessionInfo, Unreachable

QUICK = {
    name: ChannelSettings(timeout_s=0.2, connections=2)
    for name in ("control", "jobs", "logs", "artifacts")
}
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
