"""How `moonrun platform serve` sets up uvicorn: the edge's protocol, the keep-alive, the
shutdown grace, proxies believed only when named; and the connection cap it derives from the
open-files limit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from moonrun.http.edge import (
    FD_RESERVE,
    MAX_DEFAULT_CONNECTIONS,
    EdgeLimits,
    GuardedProtocol,
    ServeSettings,
    default_max_connections,
    server_config,
)


async def app(scope: object, receive: object, send: object) -> None:
    """Never called: only the configuration is looked at."""


@pytest.mark.parametrize(
    ("open_files", "cap"),
    [
        (-1, MAX_DEFAULT_CONNECTIONS),
        (1024, 1024 - FD_RESERVE),
        (FD_RESERVE + 17, 17),
        (FD_RESERVE + 16, 16),
        (FD_RESERVE + 15, 16),
        (0, 16),
        (MAX_DEFAULT_CONNECTIONS + FD_RESERVE, MAX_DEFAULT_CONNECTIONS),
        (MAX_DEFAULT_CONNECTIONS + FD_RESERVE + 1, MAX_DEFAULT_CONNECTIONS),
        (10**9, MAX_DEFAULT_CONNECTIONS),
    ],
)
def test_the_connection_cap_leaves_descriptors_for_everything_else(
    open_files: int, cap: int
) -> None:
    """The open-files limit less the reserve, at least 16 and at most 65,536 (and 65,536 when
    unlimited)."""
    assert default_max_connections(open_files) == cap
    assert (FD_RESERVE, MAX_DEFAULT_CONNECTIONS) == (128, 65536)


def test_the_server_serves_the_edges_protocol_with_the_settings_given() -> None:
    limits = EdgeLimits(header_timeout_s=3.0, max_connections=77)
    settings = ServeSettings(limits=limits, keep_alive_s=7, graceful_shutdown_s=4)

    config = server_config(app, "192.0.2.7", 8471, settings)

    assert (config.app, config.host, config.port) == (app, "192.0.2.7", 8471)
    assert issubclass(config.http, GuardedProtocol)
    assert (config.http.edge.limits, config.ws) == (replace(limits, idle_s=7.0), "none")
    assert (config.log_config, config.access_log) == (None, False)
    assert (config.timeout_keep_alive, config.timeout_graceful_shutdown) == (7, 4)
    assert (config.proxy_headers, config.forwarded_allow_ips) == (False, [])


def test_forwarded_headers_are_believed_only_from_the_proxies_named() -> None:
    settings = ServeSettings(trusted_proxies=("10.0.0.1", "10.0.0.2"))
    config = server_config(app, "127.0.0.1", 0, settings)
    assert (config.proxy_headers, config.forwarded_allow_ips) == (True, ["10.0.0.1", "10.0.0.2"])


def test_serving_defaults() -> None:
    """Keep-alive 20 s (longer than Run's heartbeat interval), 10 s to shut down gracefully,
    no proxy."""
    settings = ServeSettings()
    assert (settings.keep_alive_s, settings.graceful_shutdown_s, settings.trusted_proxies) == (
        20,
        10,
        (),
    )
