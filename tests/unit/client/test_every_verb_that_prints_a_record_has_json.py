"""Every command that prints a record has `--json` (docs/cli.md, "JSON output"): the ones
that say what they did to an endpoint, a user, a server or a schedule print that record as
the API answered it, and `run join` its endpoint. In process, against a platform served on
loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner, Result

from moonrun.cli import app
from moonrun.client.library import Client
from tests.support.console_kit import serve
from tests.support.http_harness import ADMIN_TOKEN, http_world
from tests.support.stores import memory_factory
from tests.support.terminal import Terminal

WITHOUT_RECORDS = {
    "version": "prints the version",
    "login": "saves a profile",
    "logout": "forgets a profile",
    "job download": "writes the artifact's bytes (to stdout with -o -)",
    "user password": "sets a password",
    "server admin add": "the API answers no record",
    "server admin remove": "the API answers no record",
    "platform serve": "serves",
    "run start": "runs",
    "admin bootstrap": "prints the token alone, for a script to read",
}
"""The commands that print no record, and why."""


def commands(group: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every command under `group` (a click group, as typer builds it), by its full name."""
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def test_every_command_but_those_without_records_takes_json() -> None:
    root = typer.main.get_command(app)
    without = sorted(
        name
        for name, command in commands(root)
        if not any("--json" in parameter.opts for parameter in command.params)
    )
    assert without == sorted(WITHOUT_RECORDS)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        yield Terminal(cast, served.url, tmp_path, token=ADMIN_TOKEN)


def record(result: Result) -> dict[str, object]:
    assert result.exit_code == 0, result.output
    answer: dict[str, object] = json.loads(result.stdout)
    return answer


def test_the_verbs_that_change_a_record_print_it_with_json(terminal: Terminal) -> None:
    cast = terminal.cast
    endpoint = cast.other_run.endpoint_id
    assert record(terminal("endpoint", "drain", endpoint, "--json"))["draining"] is True
    assert record(terminal("endpoint", "undrain", endpoint, "--json"))["draining"] is False
    user = cast.stranger[0]
    assert record(terminal("user", "disable", user, "--json"))["disabled"] is True
    assert record(terminal("user", "enable", user, "--json"))["disabled"] is False
    assert record(terminal("server", "remove", cast.other_server_id, "--json"))["id"] == (
        cast.other_server_id
    )
    assert record(terminal("endpoint", "remove", endpoint, "--json"))["id"] == endpoint
    made = cast.world.api(
        "POST",
        f"/api/v1/servers/{cast.server_id}/schedules",
        json={"name": "nightly", "cron": "0 3 * * *", "job": {"kind": "noop"}},
    )
    schedule_id = made.json()["id"]
    assert record(terminal("schedule", "delete", schedule_id, "--json"))["id"] == schedule_id


def test_run_join_prints_its_endpoint_with_json(terminal: Terminal, tmp_path: Path) -> None:
    with Client(terminal.url, ADMIN_TOKEN) as admin:
        endpoint, join_token = admin.create_endpoint("host-j")
    data_dir = tmp_path / "run"
    data_dir.mkdir(mode=0o700)
    arguments = ["run", "join", "--platform", terminal.url, "--token", join_token]
    joined = CliRunner().invoke(app, [*arguments, "--data-dir", str(data_dir), "--json"])
    assert record(joined) == {"platform": terminal.url, "endpoint_id": endpoint.id}
