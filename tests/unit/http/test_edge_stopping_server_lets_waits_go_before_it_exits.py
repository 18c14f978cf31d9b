"""`stopping_server`: told to exit, the server first lets the waiting claims and reads go
(`on_stop`), then does what uvicorn does with the signal: a first SIGINT or SIGTERM asks for a
graceful exit, a second SIGINT forces it."""

from __future__ import annotations

import signal

import uvicorn

from moonrun.http.edge import stopping_server


async def app(scope: object, receive: object, send: object) -> None:
    """Never called: the server is not started."""


def test_a_signal_stops_the_waits_first_then_exits_as_uvicorn_does() -> None:
    config = uvicorn.Config(app, log_config=None)
    seen: list[tuple[str, bool]] = []
    server = stopping_server(config, lambda: seen.append(("on_stop", server.should_exit)))
    server.handle_exit(signal.SIGTERM, None)
    graceful = (server.should_exit, server.force_exit)
    server.handle_exit(signal.SIGINT, None)
    assert server.config is config
    assert seen == [("on_stop", False), ("on_stop", True)]
    assert (graceful, server.force_exit) == ((True, False), True)
