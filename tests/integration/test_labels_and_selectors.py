"""Labels and selectors over HTTP, on every store (docs/protocol.md, "Labels", "Selectors"):
who may set them, what the views show, what a selector lists, and how bad input is refused.

The cast (tests/support/http_harness.py): web-1 on host-a, owned by `owner`, administered by
`helper`; db-1 on host-b, owned by `stranger`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.support.http_harness import Cast, http_world, public_key_of
from tests.support.stores import StoreFactory


@pytest.fixture
def cast(store_factory: StoreFactory, tmp_path: Path) -> Iterator[Cast]:
    with http_world(store_factory, tmp_path) as cast:
        yield cast


def put_labels(cast: Cast, what: str, labels: Any, token: str | None = None) -> Any:
    kwargs = {} if token is None else {"token": token}
    return cast.world.api("PUT", f"/api/v1/{what}/labels", json={"labels": labels}, **kwargs)


def server_names(cast: Cast, token: str | None = None, selector: str | None = None) -> list[str]:
    kwargs: dict[str, Any] = {} if token is None else {"token": token}
    params = {} if selector is None else {"selector": selector}
    response = cast.world.api("GET", "/api/v1/servers", params=params, **kwargs)
    assert response.status_code == 200, response.text
    return sorted(server["name"] for server in response.json()["servers"])


def test_a_servers_owner_sets_its_labels_and_every_view_shows_them(cast: Cast) -> None:
    response = put_labels(cast, f"servers/{cast.server_id}", {"role": "web"}, cast.owner[1])
    assert (response.status_code, response.json()["labels"]) == (200, {"role": "web"})
    shown = cast.world.api("GET", f"/api/v1/servers/{cast.server_id}", token=cast.helper[1])
    assert shown.json()["labels"] == {"role": "web"}
    helped = put_labels(cast, f"servers/{cast.server_id}", {"tier": "1"}, cast.helper[1])
    assert helped.json()["labels"] == {"tier": "1"}  # the map is replaced, not merged
    refused = put_labels(cast, f"servers/{cast.server_id}", {"role": "x"}, cast.stranger[1])
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")


def test_only_platform_admins_set_an_endpoints_labels(cast: Cast) -> None:
    path = f"endpoints/{cast.run.endpoint_id}"
    refused = put_labels(cast, path, {"zone": "eu"}, cast.owner[1])
    assert refused.status_code == 403
    response = put_labels(cast, path, {"zone": "eu"})
    assert (response.status_code, response.json()["labels"]) == (200, {"zone": "eu"})
    listed = cast.world.api("GET", "/api/v1/endpoints").json()["endpoints"]
    assert {e["name"]: e["labels"] for e in listed} == {"host-a": {"zone": "eu"}, "host-b": {}}
    assert put_labels(cast, "endpoints/ep_doesnotexist0000", {}).status_code == 404


def test_a_server_is_created_with_labels(cast: Cast) -> None:
    body = {
        "name": "web-2",
        "endpoint_id": cast.run.endpoint_id,
        "owner_id": cast.owner[0],
        "labels": {"role": "web", "env": "prod"},
    }
    response = cast.world.api("POST", "/api/v1/servers", json=body)
    assert (response.status_code, response.json()["labels"]) == (
        201,
        {"env": "prod", "role": "web"},
    )


def test_a_selector_lists_the_matching_servers_with_the_servers_labels_over_its_endpoints(
    cast: Cast,
) -> None:
    world = cast.world
    web2 = world.create_server("web-2", cast.other_run.endpoint_id, cast.owner[0])
    assert put_labels(cast, f"endpoints/{cast.run.endpoint_id}", {"env": "prod"}).is_success
    assert put_labels(cast, f"endpoints/{cast.other_run.endpoint_id}", {"env": "prod"}).is_success
    assert put_labels(cast, f"servers/{cast.server_id}", {"role": "web"}).is_success
    assert put_labels(cast, f"servers/{web2}", {"role": "web", "env": "staging"}).is_success
    owner = cast.owner[1]
    assert server_names(cast, owner, "role=web") == ["web-1", "web-2"]
    assert server_names(cast, owner, "role=web,env=prod") == ["web-1"]  # web-2 says staging
    assert server_names(cast, owner, "env in (staging, dev)") == ["web-2"]
    assert server_names(cast, owner, "!role") == []
    assert server_names(cast, owner, "") == ["web-1", "web-2"]
    assert server_names(cast, None, "env=prod") == ["db-1", "web-1"]  # a platform admin's


def test_another_owners_servers_never_match_a_selector(cast: Cast) -> None:
    assert put_labels(cast, f"servers/{cast.other_server_id}", {"role": "web"}).is_success
    assert put_labels(cast, f"servers/{cast.server_id}", {"role": "web"}).is_success
    assert server_names(cast, cast.owner[1], "role=web") == ["web-1"]
    assert server_names(cast, cast.stranger[1], "role=web") == ["db-1"]
    assert server_names(cast, cast.stranger[1], "role notin (db)") == ["db-1"]


def test_a_selector_that_does_not_parse_is_a_422_with_its_position(cast: Cast) -> None:
    response = cast.world.api("GET", "/api/v1/servers", params={"selector": "role=web,,env"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_selector"
    assert "at position 9" in error["message"]
    assert [problem["field"] for problem in error["fields"]] == ["selector"]


@pytest.mark.parametrize(
    ("labels", "field"),
    [
        ({f"k{n}": "v" for n in range(33)}, "labels"),
        ({"role": "x" * 200}, "labels.role"),
        ({"Role": "web"}, "labels[0]"),
        ({"role": "a\u0007b"}, "labels.role"),
    ],
    ids=["33 labels", "a 200-character value", "an upper-case key", "a control character"],
)
def test_bad_labels_are_a_422_naming_the_field_at_every_door(
    cast: Cast, labels: dict[str, str], field: str
) -> None:
    create = {
        "name": "web-9",
        "endpoint_id": cast.run.endpoint_id,
        "owner_id": cast.owner[0],
        "labels": labels,
    }
    answers = [
        put_labels(cast, f"servers/{cast.server_id}", labels),
        put_labels(cast, f"endpoints/{cast.run.endpoint_id}", labels),
        cast.world.api("POST", "/api/v1/servers", json=create),
    ]
    for response in answers:
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_labels"
        assert [problem["field"] for problem in error["fields"]] == [field]
        assert "x" * 20 not in response.text  # a value is never said back


def test_a_labels_body_of_the_wrong_shape_is_refused(cast: Cast) -> None:
    path = f"/api/v1/servers/{cast.server_id}/labels"
    for body in ({"labels": {"role": 1}}, {"labels": ["role"]}, {"label": {}}, {}):
        response = cast.world.api("PUT", path, json=body)
        assert (response.status_code, response.json()["error"]["code"]) == (
            422,
            "invalid_request",
        ), body


def test_a_join_proposes_endpoint_labels_and_an_admin_may_change_them(cast: Cast) -> None:
    world = cast.world
    created = world.api("POST", "/api/v1/endpoints", json={"name": "host-c"}).json()
    endpoint_id = created["endpoint"]["id"]
    assert put_labels(cast, f"endpoints/{endpoint_id}", {"zone": "eu"}).is_success
    body = {
        "join_token": created["join_token"],
        "identity_public_key": public_key_of(Ed25519PrivateKey.generate()),
        "labels": {"zone": "us", "gpu": "a100"},
    }
    assert world.client.post("/run/v1/join", json=body).status_code == 200
    listed = world.api("GET", "/api/v1/endpoints").json()["endpoints"]
    labels = {e["id"]: e["labels"] for e in listed}[endpoint_id]
    assert labels == {"zone": "eu", "gpu": "a100"}  # the admin's zone stays
    changed = put_labels(cast, f"endpoints/{endpoint_id}", {"gpu": "none"})
    assert changed.json()["labels"] == {"gpu": "none"}


def test_a_join_with_bad_labels_is_refused_and_burns_no_token(cast: Cast) -> None:
    world = cast.world
    created = world.api("POST", "/api/v1/endpoints", json={"name": "host-d"}).json()
    body = {
        "join_token": created["join_token"],
        "identity_public_key": public_key_of(Ed25519PrivateKey.generate()),
        "labels": {"zone": "x" * 200},
    }
    refused = world.client.post("/run/v1/join", json=body)
    assert (refused.status_code, refused.json()["error"]["code"]) == (422, "invalid_labels")
    body["labels"] = {"zone": "eu"}
    assert world.client.post("/run/v1/join", json=body).status_code == 200


def test_a_selector_over_a_fleet_reads_every_servers_endpoint_labels(cast: Cast) -> None:
    """Past a few endpoints the endpoints are read all at once: the answer is the same."""
    world = cast.world
    for n in range(10):
        endpoint_id = world.create_endpoint(f"fleet-{n}").endpoint_id
        zone = "eu" if n % 2 else "us"
        assert put_labels(cast, f"endpoints/{endpoint_id}", {"zone": zone}).is_success
        world.create_server(f"node-{n}", endpoint_id, cast.owner[0])
    expected = [f"node-{n}" for n in range(1, 10, 2)]
    assert server_names(cast, None, "zone=eu") == expected
    assert server_names(cast, cast.owner[1], "zone=eu") == expected
    assert server_names(cast, cast.stranger[1], "zone") == []
