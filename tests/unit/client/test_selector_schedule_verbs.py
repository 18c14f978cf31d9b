"""Selector schedules from a terminal and from Python (docs/cli.md): `schedule create --selector
S` (no SERVER) makes a schedule whose firings are groups, `schedule show`/`list` print its
selector, `schedule trigger` prints the group it made; a SERVER and --selector together, or
neither, are refused before any request; `Client.create_schedule(None, ..., selector=S)`. The
CLI runs in-process against a platform served on loopback."""

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

CREATE = ("schedule", "create", "--name", "fleet", "--cron", "@daily", "--kind", "noop")


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        with Client(served.url, ADMIN_TOKEN) as admin:
            admin.set_server_labels(cast.server_id, {"role": "web"})
        yield Terminal(cast, served.url, tmp_path)


def test_schedule_create_with_a_selector_makes_a_selector_schedule(terminal: Terminal) -> None:
    made = terminal(*CREATE, "--selector", "role=web", "--max-parallel", "2", "--json")

    assert made.exit_code == 0, made.output
    view = json.loads(made.stdout)
    assert (view["server_id"], view["selector"], view["max_parallel"]) == (None, "role=web", 2)
    shown = terminal("schedule", "show", view["id"])
    assert shown.exit_code == 0, shown.output
    assert "role=web" in shown.stdout
    listed = terminal("schedule", "list")
    assert "selector role=web" in listed.stdout


def test_schedule_trigger_of_a_selector_schedule_prints_its_group(terminal: Terminal) -> None:
    view = json.loads(terminal(*CREATE, "--selector", "role=web", "--json").stdout)

    fired = terminal("schedule", "trigger", view["id"])

    assert fired.exit_code == 0, fired.output
    assert fired.stdout.strip().startswith("grp_")
    shown = terminal("schedule", "show", view["id"])
    assert fired.stdout.strip() in shown.stdout
    as_json = json.loads(terminal("schedule", "trigger", view["id"], "--json").stdout)
    assert as_json["job_id"] is None
    assert as_json["group_id"] is None  # the first group has not ended: skipped


def test_a_selector_matching_nothing_says_so_on_trigger(terminal: Terminal) -> None:
    view = json.loads(terminal(*CREATE, "--selector", "role=none", "--json").stdout)

    fired = terminal("schedule", "trigger", view["id"])

    assert fired.exit_code == 0, fired.output
    assert "no server matched" in fired.stdout


@pytest.mark.parametrize(
    ("where", "said"),
    [
        (("SERVER", "--selector", "role=web"), "give a SERVER or --selector, exactly one"),
        ((), "give a SERVER or --selector, exactly one"),
        (("SERVER", "--max-parallel", "2"), "--max-parallel and --stop-on-failure need"),
    ],
    ids=["both", "neither", "max-parallel without selector"],
)
def test_a_server_and_a_selector_together_or_neither_are_refused(
    terminal: Terminal, where: tuple[str, ...], said: str
) -> None:
    args = tuple(terminal.cast.server_id if arg == "SERVER" else arg for arg in where)

    refused = terminal(*CREATE, *args)

    assert refused.exit_code == 2, refused.output
    assert said in " ".join(refused.output.split()), refused.output
    assert (
        terminal.cast.world.platform.service.schedules.list_schedules(
            terminal.cast.world.store.get_user(terminal.cast.owner[0])  # type: ignore[arg-type]
        )
        == []
    )


def test_the_python_client_creates_a_selector_schedule(terminal: Terminal) -> None:
    with Client(terminal.url, terminal.cast.owner[1]) as client:
        schedule = client.create_schedule(
            None, "fleet", "@hourly", "noop", selector="role=web", stop_on_failure=True
        )
        fired, made = client.trigger_schedule(schedule.id)

    assert (schedule.server_id, schedule.selector) == (None, "role=web")
    assert schedule.data["stop_on_failure"] is True
    assert made is not None
    assert made.startswith("grp_")
    assert fired.last_group_id == made
