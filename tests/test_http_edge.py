"""The platform's HTTP edge in-process: answers carrying secrets are never cached, and the
interactive API docs (which load scripts from a CDN) are served only when asked for."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2 as httpx
import pytest
from fastapi.testclient import TestClient

from moonrun.http.app import create_app
from tests.http_harness import Cast, http_world
from tests.stores import memory_factory


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def created_user(cast: Cast) -> httpx.Response:
    return cast.world.api("POST", "/api/v1/users", json={"name": "nina"})


def created_endpoint(cast: Cast) -> httpx.Response:
    return cast.world.api("POST", "/api/v1/endpoints", json={"name": "host-z"})


def registered_session(cast: Cast) -> httpx.Response:
    return cast.run.register()


@pytest.mark.parametrize(
    ("answer", "secret"),
    [
        pytest.param(created_user, "api_token", id="POST /api/v1/users"),
        pytest.param(created_endpoint, "join_token", id="POST /api/v1/endpoints"),
        pytest.param(registered_session, "session_key", id="POST /run/v1/sessions"),
    ],
)
def test_an_answer_carrying_a_secret_is_never_stored_by_a_cache(
    cast: Cast, answer: Callable[[Cast], httpx.Response], secret: str
) -> None:
    """The answers that carry an API token, a join token or a session key say no-store."""
    response = answer(cast)
    assert (response.status_code, secret in response.json()) == (201, True)
    assert response.headers.get("cache-control") == "no-store"


def test_answers_without_secrets_say_nothing_about_caching(cast: Cast) -> None:
    """no-store is for secrets: a job list may be cached by whoever the caller allows."""
    response = cast.world.api("GET", "/api/v1/jobs", token=cast.owner[1])
    assert (response.status_code, response.headers.get("cache-control")) == (200, None)


def test_the_api_docs_are_off_unless_asked_for(cast: Cast) -> None:
    """/docs and /redoc answer 404 by default; /openapi.json is still served."""
    client = cast.world.client
    statuses = {path: client.get(path).status_code for path in ("/docs", "/redoc", "/openapi.json")}
    assert statuses == {"/docs": 404, "/redoc": 404, "/openapi.json": 200}


def test_the_api_docs_are_served_when_asked_for(cast: Cast) -> None:
    """With api_docs (`platform serve --api-docs`), /docs and /redoc are served."""
    with TestClient(create_app(cast.world.platform, sweep=False, api_docs=True)) as client:
        statuses = {path: client.get(path).status_code for path in ("/docs", "/redoc")}
    assert statuses == {"/docs": 200, "/redoc": 200}
