"""Schemathesis against the served OpenAPI document of the user API (operations under /api/v1).

In-process against the ASGI app, as the platform admin, over a world that already has users,
endpoints, servers and jobs in several states: generated paths, queries and bodies use those real
ids some of the time, so that operations get past 404 and into their real work. Every response
must not be a server error, must have a documented status code and content type, and its body
must match the declared schema.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

import hypothesis
import pytest
import schemathesis
import schemathesis.checks
from hypothesis import strategies as st
from schemathesis.python import asgi

from tests.support.http_harness import ADMIN_TOKEN, Cast, http_world, user_routes
from tests.support.stores import memory_factory

EXAMPLES = int(os.environ.get("MOONRUN_SCHEMATHESIS_EXAMPLES", "100"))
"""Generated examples per operation (fuzzing phase; the coverage phase adds its own cases)."""
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
]
STATES = ["queued", "accepted", "running", "retrying", "succeeded", "failed", "cancelled"]
NAMES = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,20}\Z")
KINDS = st.from_regex(r"\A[a-z][a-z0-9_.-]{0,20}\Z")


def seed(cast: Cast) -> dict[str, st.SearchStrategy[Any]]:
    """Jobs in several states on both servers; for fields a request may carry, values that
    exist or are valid (ids, states, a cursor, names, kinds, attempts, instants)."""
    world, run = cast.world, cast.run.start()
    owner = cast.owner[1]
    running = world.submit(cast.server_id, owner, payload={"n": 1})["id"]
    done = world.submit(cast.server_id, owner)["id"]
    claimed = run.claim(2)
    attempts = {job["job_id"]: job["attempt"] for job in claimed}
    for job_id in (running, done):
        assert run.ack(job_id, attempts[job_id]).status_code == 200
    assert run.progress(running, attempts[running], 1, percent=10, message="m").status_code == 200
    assert run.send_logs(running, attempts[running], 1, "a", "b").status_code == 202
    assert run.result(done, attempts[done]).status_code == 200
    queued = world.submit(cast.server_id, owner)["id"]
    other = world.submit(cast.other_server_id, cast.stranger[1])["id"]
    endpoints = [e["id"] for e in world.api("GET", "/api/v1/endpoints").json()["endpoints"]]
    users = [user["id"] for user in world.api("GET", "/api/v1/users").json()["users"]]
    cursor = world.api("GET", "/api/v1/jobs?limit=1").json()["next_cursor"]
    assert cursor is not None
    return {
        "job_id": st.sampled_from([running, done, queued, other]),
        "server_id": st.sampled_from([cast.server_id, cast.other_server_id]),
        "endpoint_id": st.sampled_from(endpoints),
        "user_id": st.sampled_from(users),
        "owner_id": st.sampled_from(users),
        "state": st.sampled_from(STATES),
        "cursor": st.just(cursor),
        "name": NAMES,
        "kind": KINDS,
        "max_attempts": st.integers(1, 10),
        "not_before": st.sampled_from(["2026-11-30T04:00:00.123Z", "2020-01-01T00:00:00Z"]),
    }


def sometimes_real(values: Any, real: dict[str, st.SearchStrategy[Any]]) -> Any:
    """`values` as generated, or with all or some of its fields replaced by real values."""
    keys = [key for key in values if key in real] if isinstance(values, dict) else []
    if not keys:
        return st.just(values)
    every = st.fixed_dictionaries({key: real[key] for key in keys})
    some = st.fixed_dictionaries({}, optional={key: real[key] for key in keys})
    return st.one_of(st.just(values), every, some).map(lambda chosen: {**values, **chosen})


def short_waits(query: Any) -> Any:
    """A blocking read's `wait_s` cut to a hundredth of a second: every value the document
    allows is valid, but a generated hour of waiting would only test the clock."""
    if isinstance(query, dict) and isinstance(query.get("wait_s"), int | float):
        return {**query, "wait_s": min(query["wait_s"], 0.01)}
    return query


def user_api_schema(cast: Cast) -> Any:
    """The served document's /api/v1 operations, over `cast`'s app, with real ids mixed in."""
    real = seed(cast)
    loaded = schemathesis.openapi.from_asgi("/openapi.json", cast.world.app)
    user_api = loaded.include(path_regex=r"^/api/v1/")

    @user_api.hook
    def flatmap_path_parameters(context: Any, path_parameters: Any) -> Any:
        return sometimes_real(path_parameters, real)

    @user_api.hook
    def flatmap_query(context: Any, query: Any) -> Any:
        return sometimes_real(query, real).map(short_waits)

    @user_api.hook
    def flatmap_body(context: Any, body: Any) -> Any:
        return sometimes_real(body, real)

    return user_api


# Schemathesis parametrizes at collection time, so the world is built when this module is
# imported (schemathesis' lazy `from_fixture` loader does not work with pytest 9's node ids).
_world = ExitStack()
_place = Path(mkdtemp(prefix="moonrun-schemathesis-"))
_world.callback(shutil.rmtree, _place, ignore_errors=True)
CAST = _world.enter_context(http_world(memory_factory(), _place))
schema = user_api_schema(CAST)


@pytest.fixture(scope="module", autouse=True)
def _close_world() -> Iterator[None]:
    yield
    asgi.shutdown_lifespans()
    _world.close()


def test_schemathesis_covers_every_user_route() -> None:
    """The operations Schemathesis tests are exactly the app's routes under /api/v1."""
    operations = {result.ok() for result in schema.get_all_operations()}
    tested = {(operation.method.upper(), operation.path) for operation in operations}
    assert user_routes(CAST.world.app) == tested


@schema.parametrize()
@hypothesis.settings(max_examples=EXAMPLES, deadline=None)
def test_the_user_api_answers_as_its_openapi_document_says(case: Any) -> None:
    """No 5xx; every status code, content type and body is the documented one."""
    case.call_and_validate(headers=AUTH, checks=CHECKS)
