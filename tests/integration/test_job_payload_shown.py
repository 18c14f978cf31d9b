"""What a job ran can be seen: `?include=payload` adds the payload its submitter gave to the
job's view, credential-looking members redacted, for whoever may read the job
(docs/protocol.md, "Payload"); without it the view is unchanged."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moonrun.http import user_api
from tests.support.http_harness import ADMIN_TOKEN, Cast, http_world
from tests.support.stores import memory_factory

PAYLOAD = {
    "argv": ["env", "DEPLOY_TOKEN=tok-4c1e9b", "deploy", "--password", "pw-7d2a0f", "web"],
    "timeout_s": 60,
    "settings": {"region": "eu", "db": {"Password": "pw-0b3e8c", "host": "db-1"}},
    "api_key": {"id": "k-19af", "value": "k-secret-5e7d"},
}
SHOWN = {
    "argv": ["env", "DEPLOY_TOKEN=[redacted]", "deploy", "--password", "[redacted]", "web"],
    "timeout_s": 60,
    "settings": {"region": "eu", "db": {"Password": "[redacted]", "host": "db-1"}},
    "api_key": "[redacted]",
}
HIDDEN = ("tok-4c1e9b", "pw-7d2a0f", "pw-0b3e8c", "k-19af", "k-secret-5e7d")


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def submitted(cast: Cast) -> str:
    job_id: str = cast.world.submit(cast.server_id, cast.owner[1], payload=PAYLOAD)["id"]
    return job_id


def read(cast: Cast, path: str, token: str | None = ADMIN_TOKEN, **params: Any) -> Any:
    return cast.world.api("GET", path, token=token, params=params)


def test_a_job_read_with_include_payload_shows_the_payload_redacted(cast: Cast) -> None:
    job_id = submitted(cast)
    answer = read(cast, f"/api/v1/jobs/{job_id}", cast.owner[1], include="payload")
    assert answer.status_code == 200, answer.text
    assert answer.json()["payload"] == SHOWN
    assert [secret for secret in HIDDEN if secret in answer.text] == []


def test_a_job_read_without_include_is_the_view_it_always_was(cast: Cast) -> None:
    job_id = submitted(cast)
    plain = read(cast, f"/api/v1/jobs/{job_id}", cast.owner[1])
    asked = read(cast, f"/api/v1/jobs/{job_id}", cast.owner[1], include="payload")
    assert "payload" not in plain.json()
    assert {k: v for k, v in asked.json().items() if k != "payload"} == plain.json()
    assert plain.headers["ETag"] == asked.headers["ETag"]


@pytest.mark.parametrize("value", ["payloads", "Payload", "", "payload,history"])
def test_an_unknown_include_is_a_422_naming_the_parameter_and_what_it_takes(
    cast: Cast, value: str
) -> None:
    job_id = submitted(cast)
    for path in (f"/api/v1/jobs/{job_id}", "/api/v1/jobs"):
        answer = read(cast, path, cast.owner[1], include=value)
        assert (answer.status_code, answer.json()["error"]["code"]) == (422, "invalid_request")
        # It says what may be asked for, never the value given.
        assert answer.json()["error"]["message"] == "query.include: Input should be 'payload'"


def test_a_job_listing_with_include_payload_shows_each_payload_redacted(cast: Cast) -> None:
    job_id = submitted(cast)
    other = cast.world.submit(cast.server_id, cast.owner[1], payload={"n": 1})["id"]
    listed = read(cast, "/api/v1/jobs", cast.owner[1], include="payload").json()["jobs"]
    assert {job["id"]: job["payload"] for job in listed} == {job_id: SHOWN, other: {"n": 1}}
    plain = read(cast, "/api/v1/jobs", cast.owner[1]).json()["jobs"]
    assert [job for job in plain if "payload" in job] == []


def test_a_blocking_read_with_include_payload_answers_with_the_payload(cast: Cast) -> None:
    job_id = submitted(cast)
    cast.world.api("POST", f"/api/v1/jobs/{job_id}/cancel", token=cast.owner[1])
    answer = read(
        cast, f"/api/v1/jobs/{job_id}", cast.owner[1], include="payload", wait_s=1,
        until="terminal",
    )  # fmt: skip
    assert (answer.json()["state"], answer.json()["payload"]) == ("cancelled", SHOWN)


def test_whoever_may_read_the_job_sees_its_payload_and_nobody_else_does(cast: Cast) -> None:
    """Its server's owner, administrators and platform admins; another owner gets the refusal
    a plain read gets (403), without a word of the payload."""
    job_id = submitted(cast)
    path = f"/api/v1/jobs/{job_id}"
    readers = {
        "owner": cast.owner[1],
        "server admin": cast.helper[1],
        "platform admin": ADMIN_TOKEN,
    }
    shown = {
        who: read(cast, path, token, include="payload").json()["payload"]
        for who, token in readers.items()
    }
    assert shown == dict.fromkeys(readers, SHOWN)
    refused = read(cast, path, cast.stranger[1], include="payload")
    plain = read(cast, path, cast.stranger[1])
    assert (refused.status_code, refused.json()) == (plain.status_code, plain.json())
    assert refused.status_code == 403
    assert "deploy" not in refused.text
    listed = read(cast, "/api/v1/jobs", cast.stranger[1], include="payload").json()["jobs"]
    assert [job["id"] for job in listed] == []


def test_the_openapi_document_lists_include_on_job_reads_and_listings(cast: Cast) -> None:
    paths = cast.world.client.get("/openapi.json").json()["paths"]
    for path in ("/api/v1/jobs/{job_id}", "/api/v1/jobs"):
        (include,) = [p for p in paths[path]["get"]["parameters"] if p["name"] == "include"]
        assert include["in"] == "query"
        assert include["required"] is False
        assert "payload" in str(include["schema"])
        assert "redacted" in str(include["schema"])


def test_payloads_are_redacted_on_the_user_channels_threads_not_the_event_loop(
    cast: Cast, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of 200 payloads of 64 KiB is milliseconds of CPU each: the event loop, which
    answers Run's heartbeats, does not wait on it."""
    where: list[str] = []
    real = user_api.redacted

    def noted(value: Any) -> Any:
        where.append(threading.current_thread().name)
        return real(value)

    monkeypatch.setattr(user_api, "redacted", noted)
    job_id = submitted(cast)
    read(cast, f"/api/v1/jobs/{job_id}", cast.owner[1], include="payload")
    read(cast, "/api/v1/jobs", cast.owner[1], include="payload")
    assert where == ["moonrun-user", "moonrun-user"]
