"""Concurrency keys from a terminal and from Python (docs/cli.md): `job submit
--concurrency-key K --concurrency-limit N` (with a server or with --selector) and
`Client.submit(..., concurrency_key=..., concurrency_limit=...)`. The CLI runs in-process
against a platform served on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.client.library import Client
from tests.support.console_kit import serve
from tests.support.http_harness import ADMIN_TOKEN, http_world
from tests.support.stores import memory_factory
from tests.support.terminal import Terminal


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        with Client(served.url, ADMIN_TOKEN) as admin:
            admin.set_server_labels(cast.server_id, {"role": "web"})
        yield Terminal(cast, served.url, tmp_path)


def test_submit_with_a_concurrency_key_holds_jobs_past_its_limit(terminal: Terminal) -> None:
    server = terminal.cast.server_id
    key = ("--concurrency-key", "nightly backup", "--concurrency-limit", "2")
    shown = [
        json.loads(terminal("job", "submit", server, "noop", *key, "--json").stdout)
        for _ in range(3)
    ]
    assert [job["concurrency"] for job in shown] == [
        {"key": "nightly backup", "limit": 2, "held": False},
        {"key": "nightly backup", "limit": 2, "held": False},
        {"key": "nightly backup", "limit": 2, "held": True},
    ]
    fanned = terminal("job", "submit", "--selector", "role=web", "noop", *key, "--json")
    assert fanned.exit_code == 0, fanned.output
    assert json.loads(fanned.stdout)["jobs"][0]["concurrency"]["held"] is True


def test_a_concurrency_limit_needs_a_key_and_a_bad_one_is_refused(terminal: Terminal) -> None:
    server = terminal.cast.server_id
    alone = terminal("job", "submit", server, "noop", "--concurrency-limit", "2")
    assert alone.exit_code == 2
    assert "--concurrency-key" in alone.output
    zero = terminal(
        "job", "submit", server, "noop", "--concurrency-key", "k", "--concurrency-limit", "0"
    )
    assert zero.exit_code == 2


def test_the_python_client_submits_with_a_concurrency_key(terminal: Terminal) -> None:
    with Client(terminal.url, terminal.cast.owner[1]) as client:
        first = client.submit(terminal.cast.server_id, "noop", concurrency_key="deploy")
        second = client.submit(
            terminal.cast.server_id, "noop", concurrency_key="deploy", concurrency_limit=1
        )
        with pytest.raises(ValueError, match="needs a concurrency key"):
            client.submit(terminal.cast.server_id, "noop", concurrency_limit=3)
    assert first.data["concurrency"] == {"key": "deploy", "limit": 1, "held": False}
    assert second.data["concurrency"]["held"] is True
