"""`role in ()` over HTTP, at both doors that take a selector: a 422 `invalid_selector` naming
the position of the `)`, never a listing of everything or nothing, nor a 500
(docs/protocol.md, "Selectors")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory

EXPECTED = {
    "code": "invalid_selector",
    "message": "selector does not parse at position 9: expected a value: the set of 'in' or "
    "'notin' is empty",
    "fields": [
        {
            "field": "selector",
            "message": "selector does not parse at position 9: expected a value: the set of "
            "'in' or 'notin' is empty",
        }
    ],
}


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as made:
        yield made


def test_listing_servers_by_an_empty_set_is_a_422_at_its_position(cast: Cast) -> None:
    response = cast.world.api(
        "GET", "/api/v1/servers", token=cast.owner[1], params={"selector": "role in ()"}
    )
    assert (response.status_code, response.json()["error"]) == (422, EXPECTED)


def test_fanning_out_by_an_empty_set_is_a_422_at_its_position(cast: Cast) -> None:
    response = cast.world.api(
        "POST",
        "/api/v1/jobs/fanout",
        token=cast.owner[1],
        json={"selector": "role in ()", "kind": "noop"},
    )
    assert (response.status_code, response.json()["error"]) == (422, EXPECTED)
