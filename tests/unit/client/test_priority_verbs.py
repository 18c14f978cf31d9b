"""Priorities (and a schedule's concurrency key) from a terminal and from Python (docs/cli.md):
`job submit --priority P` (with a server or with --selector), `schedule create --priority P
--concurrency-key K`, `job show` printing it, and `Client.submit/fanout/create_schedule(...,
priority=P)`. The CLI runs in-process against a platform served on loopback."""

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


def test_submit_with_a_priority_shows_it(terminal: Terminal) -> None:
    server = terminal.cast.server_id
    urgent = terminal("job", "submit", server, "noop", "--priority", "9", "--json")
    assert urgent.exit_code == 0, urgent.output
    assert json.loads(urgent.stdout)["priority"] == 9
    plain = terminal("job", "submit", server, "noop")
    assert plain.exit_code == 0, plain.output
    assert "priority" in plain.stdout
    assert "5" in plain.stdout
    fanned = terminal(
        "job", "submit", "--selector", "role=web", "noop", "--priority", "2", "--json"
    )
    assert fanned.exit_code == 0, fanned.output
    assert json.loads(fanned.stdout)["jobs"][0]["priority"] == 2


def test_a_priority_outside_0_to_9_is_refused_before_any_request(terminal: Terminal) -> None:
    for bad in ("10", "-1", "high"):
        refused = terminal("job", "submit", terminal.cast.server_id, "noop", "--priority", bad)
        assert refused.exit_code == 2, refused.output
        assert "--priority" in refused.output


def test_schedule_create_takes_a_priority_for_its_jobs(terminal: Terminal) -> None:
    made = terminal(
        "schedule",
        "create",
        terminal.cast.server_id,
        "--name",
        "restore",
        "--cron",
        "@daily",
        "--kind",
        "noop",
        "--priority",
        "8",
        "--json",
    )
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout)["job"]["priority"] == 8
    shown = terminal("schedule", "show", json.loads(made.stdout)["id"])
    assert shown.exit_code == 0, shown.output
    assert "priority" in shown.stdout
    assert "8" in shown.stdout


def test_the_python_client_submits_with_a_priority(terminal: Terminal) -> None:
    with Client(terminal.url, terminal.cast.owner[1]) as client:
        job = client.submit(terminal.cast.server_id, "noop", priority=0)
        fanned = client.fanout("role=web", "noop", priority=7)
        schedule = client.create_schedule(
            terminal.cast.server_id, "s", "@hourly", "noop", priority=3
        )
        plain = client.submit(terminal.cast.server_id, "noop")
    assert (job.priority, fanned.jobs[0].priority, plain.priority) == (0, 7, 5)
    assert schedule.data["job"]["priority"] == 3


def test_schedule_create_takes_a_concurrency_key_for_its_jobs(terminal: Terminal) -> None:
    made = terminal(
        "schedule",
        "create",
        terminal.cast.server_id,
        "--name",
        "backup",
        "--cron",
        "@daily",
        "--kind",
        "noop",
        "--concurrency-key",
        "backup",
        "--concurrency-limit",
        "2",
        "--json",
    )
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout)["job"]["concurrency"] == {"key": "backup", "limit": 2}
    with Client(terminal.url, terminal.cast.owner[1]) as client:
        schedule = client.create_schedule(
            terminal.cast.server_id, "s", "@hourly", "noop", concurrency_key="k"
        )
    assert schedule.data["job"]["concurrency"] == {"key": "k", "limit": 1}
