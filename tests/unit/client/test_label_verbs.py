"""Labels from a terminal and from Python (docs/cli.md): `server label`, `endpoint label`,
`server list --selector`, `server create --label` and `run join --label`. The CLI runs
in-process against a platform served on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.client.labelargs import apply_changes
from moonrun.errors import InvalidLabels, InvalidRequest, InvalidSelector
from tests.support.console_kit import serve
from tests.support.http_harness import ADMIN_TOKEN, http_world
from tests.support.stores import memory_factory
from tests.support.terminal import Terminal


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        yield Terminal(cast, served.url, tmp_path)


def test_server_label_sets_and_removes_labels_keeping_the_others(terminal: Terminal) -> None:
    server = terminal.cast.server_id
    assert terminal("server", "label", server, "role=web", "env=prod").output == (
        "env=prod, role=web\n"
    )
    assert terminal("server", "label", server, "env-", "tier=1").output == "role=web, tier=1\n"
    shown = terminal("server", "label", server, "--json")
    assert json.loads(shown.output)["labels"] == {"role": "web", "tier": "1"}
    assert terminal("server", "label", server, "--replace").output == "-\n"


def test_server_list_with_a_selector_shows_only_matching_servers_with_their_labels(
    terminal: Terminal,
) -> None:
    cast = terminal.cast
    with terminal.client(ADMIN_TOKEN) as admin:
        admin.create_server("web-2", cast.run.endpoint_id, cast.owner[0], {"role": "db"})
        admin.set_endpoint_labels(cast.run.endpoint_id, {"zone": "eu"})
    assert terminal("server", "label", cast.server_id, "role=web").exit_code == 0
    listed = terminal("server", "list", "--selector", "role=web,zone=eu", "--json")
    assert [server["name"] for server in json.loads(listed.output)] == ["web-1"]
    table = terminal("server", "list", "-l", "zone")
    assert "web-1" in table.output
    assert "web-2" in table.output
    assert "role=db" in table.output
    with terminal.client() as owner:
        assert [s.name for s in owner.servers("role notin (web)")] == ["web-2"]
        assert owner.servers("role=web")[0].labels == {"role": "web"}


def test_a_selector_that_does_not_parse_is_one_line_with_its_position_and_exit_1(
    terminal: Terminal,
) -> None:
    result = terminal("server", "list", "--selector", "role=web,,env")
    assert result.exit_code == 1
    assert "at position 9" in result.output
    with terminal.client() as owner, pytest.raises(InvalidSelector) as refused:
        owner.servers("role in web")
    assert refused.value.fields[0][0] == "selector"


def test_endpoint_label_is_for_platform_admins(terminal: Terminal) -> None:
    endpoint = terminal.cast.run.endpoint_id
    assert terminal("endpoint", "label", endpoint, "zone=eu", token=ADMIN_TOKEN).output == (
        "zone=eu\n"
    )
    listed = terminal("endpoint", "list", "--json", token=ADMIN_TOKEN)
    assert {e["id"]: e["labels"] for e in json.loads(listed.output)}[endpoint] == {"zone": "eu"}
    assert terminal("endpoint", "label", endpoint, "zone=us").exit_code == 1  # the owner's
    missing = terminal("endpoint", "label", "ep_missing", "a=b", token=ADMIN_TOKEN)
    assert missing.exit_code == 1


def test_bad_labels_are_refused_naming_the_field(terminal: Terminal) -> None:
    result = terminal("server", "label", terminal.cast.server_id, "role=" + "x" * 200)
    assert result.exit_code == 1
    assert "label 'role': a value is at most 128 characters" in result.output
    with terminal.client() as owner, pytest.raises(InvalidLabels) as refused:
        owner.set_server_labels(terminal.cast.server_id, {f"k{n}": "v" for n in range(33)})
    assert refused.value.fields == (("labels", "at most 32 labels, not 33"),)
    assert terminal("server", "label", terminal.cast.server_id, "role").exit_code == 1


def test_server_create_takes_labels(terminal: Terminal) -> None:
    cast = terminal.cast
    created = terminal(
        "server",
        "create",
        "web-3",
        "--endpoint",
        cast.run.endpoint_id,
        "--owner",
        cast.owner[0],
        "--label",
        "role=web",
        "--json",
        token=ADMIN_TOKEN,
    )
    assert json.loads(created.output)["labels"] == {"role": "web"}


def test_run_join_proposes_its_labels(terminal: Terminal, tmp_path: Path) -> None:
    with terminal.client(ADMIN_TOKEN) as admin:
        endpoint, join_token = admin.create_endpoint("host-c")
    (tmp_path / "run").mkdir(mode=0o700)
    joined = terminal(
        "run",
        "join",
        "--platform",
        terminal.url,
        "--token",
        join_token,
        "--data-dir",
        str(tmp_path / "run"),
        "--label",
        "gpu=a100",
        "--label",
        "zone=eu",
    )
    assert joined.exit_code == 0, joined.output
    with terminal.client(ADMIN_TOKEN) as admin:
        found = {e.id: e.labels for e in admin.endpoints()}
    assert found[endpoint.id] == {"gpu": "a100", "zone": "eu"}


def test_run_join_refuses_a_bad_label_before_it_joins(terminal: Terminal, tmp_path: Path) -> None:
    with terminal.client(ADMIN_TOKEN) as admin:
        _, join_token = admin.create_endpoint("host-d")
    data_dir = tmp_path / "run"
    data_dir.mkdir(mode=0o700)
    refused = terminal(
        "run",
        "join",
        "--platform",
        terminal.url,
        "--token",
        join_token,
        "--data-dir",
        str(data_dir),
        "--label",
        "Zone=eu",
    )
    assert refused.exit_code == 1
    assert "label 'Zone'" in refused.output
    assert list(data_dir.iterdir()) == []  # no key made, no token sent


def test_label_changes_on_a_command_line() -> None:
    assert apply_changes({"a": "1", "b": "2"}, ["b-", "c=x=y", "d="]) == {
        "a": "1",
        "c": "x=y",
        "d": "",
    }
    assert apply_changes({"a": "1"}, ["b=2"], replace=True) == {"b": "2"}
    for changes in (["novalue"], ["=v"], ["a=1", "a=2"], ["-"]):
        with pytest.raises(InvalidRequest):
            apply_changes({}, changes)
