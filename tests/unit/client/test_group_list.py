"""The groups one made, newest first, with their counts: `GET /api/v1/groups`,
`Client.groups()` and `moonrun group list` (docs/protocol.md, "Groups"; docs/cli.md). In
process, against a platform served on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moonrun.client.library import Client
from tests.support.console_kit import serve
from tests.support.http_harness import http_world
from tests.support.stores import memory_factory
from tests.support.terminal import Terminal


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        for server_id in (cast.server_id, cast.other_server_id):
            labelled = cast.world.api(
                "PUT", f"/api/v1/servers/{server_id}/labels", json={"labels": {"role": "web"}}
            )
            assert labelled.status_code == 200, labelled.text
        yield Terminal(cast, served.url, tmp_path)


def fan_out(terminal: Terminal, token: str, kind: str = "noop") -> str:
    """A group of `kind` jobs on the servers labelled role=web, made by `token`'s user."""
    world = terminal.cast.world
    made = world.api(
        "POST", "/api/v1/jobs/fanout", token=token, json={"selector": "role=web", "kind": kind}
    )
    assert made.status_code == 201, made.text
    group_id: str = made.json()["group"]["id"]
    world.clock.advance(1_000)  # the next group is newer
    return group_id


def listed(terminal: Terminal, token: str, **params: Any) -> Any:
    return terminal.cast.world.api("GET", "/api/v1/groups", token=token, params=params)


def test_the_api_lists_ones_own_groups_newest_first_with_counts(terminal: Terminal) -> None:
    owner, stranger = terminal.cast.owner[1], terminal.cast.stranger[1]
    first, second = fan_out(terminal, owner), fan_out(terminal, owner, kind="sleep")
    fan_out(terminal, stranger)
    answer = listed(terminal, owner)
    assert answer.status_code == 200, answer.text
    groups = answer.json()["groups"]
    assert [group["id"] for group in groups] == [second, first]
    assert groups[0]["counts"]["queued"] == 1
    assert [group["id"] for group in listed(terminal, owner, limit=1).json()["groups"]] == [second]
    assert listed(terminal, owner, limit=0).status_code == 422
    assert listed(terminal, owner, limt=1).status_code == 422
    with Client(terminal.url, owner) as client:
        assert [group.id for group in client.groups()] == [second, first]


def test_group_list_prints_them_and_their_counts(terminal: Terminal) -> None:
    group_id = fan_out(terminal, terminal.cast.owner[1])
    table = terminal("group", "list")
    assert table.exit_code == 0, table.output
    header, row = table.stdout.splitlines()
    assert header.split() == ["id", "selector", "kind", "job_count", "counts", "created_at"]
    assert row.split()[:6] == [group_id, "role=web", "noop", "1", "1", "queued"]
    as_json = terminal("group", "list", "--json")
    assert [group["id"] for group in json.loads(as_json.stdout)] == [group_id]
