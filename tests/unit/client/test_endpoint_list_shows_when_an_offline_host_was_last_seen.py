"""`moonrun endpoint list` shows a host offline 15 s after its Run's last heartbeat (the
heartbeat interval plus 5 s), with when it was last seen and its capacity still shown
(docs/cli.md, docs/protocol.md "Liveness"). The CLI runs in-process against a platform served
on loopback, on a manual clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.scheduling.time import format_instant
from tests.support.console_kit import serve
from tests.support.http_harness import ADMIN_TOKEN, http_world
from tests.support.stores import memory_factory
from tests.support.terminal import Terminal


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        yield Terminal(cast, served.url, tmp_path, token=ADMIN_TOKEN, width=200)


def test_endpoint_list_shows_a_silent_host_offline_with_when_it_was_last_seen(
    terminal: Terminal,
) -> None:
    run, clock = terminal.cast.run, terminal.cast.world.clock
    run.start(capacity=6)
    clock.advance(3_000)
    assert run.heartbeat().status_code == 200
    beat = format_instant(clock.now())
    clock.advance(15_001)

    listed = terminal("endpoint", "list", "--json")
    table = terminal("endpoint", "list")

    (endpoint,) = [e for e in json.loads(listed.output) if e["id"] == run.endpoint_id]
    assert (endpoint["online"], endpoint["last_seen_at"], endpoint["capacity"]) == (
        False,
        beat,
        6,
    )
    (row,) = [line for line in table.output.splitlines() if run.endpoint_id in line]
    assert (row.split()[2], beat in row, " 6 " in row) == ("no", True, True)
