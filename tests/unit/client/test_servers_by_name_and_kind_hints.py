"""A server named by its name where no other the caller sees has it (`job submit web-1`,
`server show web-1`), else an error listing the matches; `job list --kind` that finds nothing
for a kind no Run runs says which kinds there are (docs/cli.md). In process, against a
platform served on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.console_kit import serve
from tests.support.http_harness import ADMIN_TOKEN, http_world
from tests.support.stores import memory_factory
from tests.support.terminal import Terminal

ANY_OBJECT = {"type": "object"}


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        yield Terminal(cast, served.url, tmp_path)


def test_server_show_and_job_submit_take_a_servers_name(terminal: Terminal) -> None:
    shown = terminal("server", "show", "web-1", "--json")
    assert (shown.exit_code, json.loads(shown.stdout)["id"]) == (0, terminal.cast.server_id)
    submitted = terminal("job", "submit", "web-1", "noop", "--json")
    assert submitted.exit_code == 0, submitted.output
    assert json.loads(submitted.stdout)["server_id"] == terminal.cast.server_id
    listed = terminal("job", "list", "--server", "web-1", "--json")
    assert [job["server_id"] for job in json.loads(listed.stdout)] == [terminal.cast.server_id]


def test_a_name_two_servers_have_is_refused_listing_both(terminal: Terminal) -> None:
    cast = terminal.cast
    again = cast.world.create_server("web-1", cast.other_run.endpoint_id, cast.owner[0])
    refused = terminal("job", "submit", "web-1", "noop")
    assert (refused.exit_code, refused.stdout) == (1, "")
    assert refused.stderr == (
        "moonrun: error: invalid_request: 2 servers are named 'web-1': "
        f"{cast.server_id} (endpoint {cast.run.endpoint_id}), "
        f"{again} (endpoint {cast.other_run.endpoint_id}); give its id\n"
    )


def test_a_name_no_server_you_see_has_is_not_found_naming_those_you_see(
    terminal: Terminal,
) -> None:
    # db-1 is the stranger's: its name is not said to the owner, nor taken for it.
    refused = terminal("server", "show", "db-1")
    assert (refused.exit_code, refused.stderr) == (
        1,
        "moonrun: error: not_found: no server 'db-1' (not an id, srv_..., nor a name you "
        "see: web-1)\n",
    )
    as_admin = terminal("server", "show", "db-1", "--json", token=ADMIN_TOKEN)
    assert json.loads(as_admin.stdout)["id"] == terminal.cast.other_server_id


def test_job_list_with_a_kind_no_run_runs_hints_at_the_kinds_there_are(
    terminal: Terminal,
) -> None:
    kinds = {"command": ANY_OBJECT, "noop": ANY_OBJECT, "sleep": ANY_OBJECT}
    terminal.cast.run.start(kinds=kinds)
    listed = terminal("job", "list", "--kind", "comand", "--json")
    assert (listed.exit_code, json.loads(listed.stdout)) == (0, [])
    assert listed.stderr == (
        "moonrun: no jobs of kind 'comand' (did you mean 'command'?); your servers' Runs run "
        "command, noop, sleep\n"
    )
    known_but_none = terminal("job", "list", "--kind", "sleep")
    assert (known_but_none.exit_code, known_but_none.stderr) == (0, "")


def test_an_admin_names_endpoints_and_users_by_their_names(terminal: Terminal) -> None:
    cast = terminal.cast
    drained = terminal("endpoint", "drain", "host-b", "--json", token=ADMIN_TOKEN)
    assert json.loads(drained.stdout)["id"] == cast.other_run.endpoint_id
    created = terminal(
        "server",
        "create",
        "web-7",
        "--endpoint",
        "host-a",
        "--owner",
        "stranger",
        "--json",
        token=ADMIN_TOKEN,
    )
    made = json.loads(created.stdout)
    assert (made["endpoint_id"], made["owner_id"]) == (cast.run.endpoint_id, cast.stranger[0])
    disabled = terminal("user", "disable", "helper", "--json", token=ADMIN_TOKEN)
    assert json.loads(disabled.stdout)["id"] == cast.helper[0]
    missing = terminal("endpoint", "undrain", "host-z", token=ADMIN_TOKEN)
    assert (missing.exit_code, missing.stderr) == (
        1,
        "moonrun: error: not_found: no endpoint 'host-z' (not an id, ep_..., nor a name: "
        "host-a, host-b)\n",
    )
