"""`moonrun.client.calls`, the user API without I/O that `Client` and `AsyncClient` both send:
a request is built, and an answer read into records or a typed error, with no transport."""

from __future__ import annotations

import json

import pytest

from moonrun.client import calls
from moonrun.client.calls import PlatformError, TryAgain
from moonrun.client.records import Job, JobState
from moonrun.errors import (
    AlreadyExists,
    ChannelBusy,
    InvalidPayload,
    NotFound,
    Unreachable,
)

JOB = {
    "id": "job_1",
    "server_id": "srv_1",
    "kind": "noop",
    "state": "queued",
    "attempt": 0,
    "max_attempts": 3,
    "created_at": "2026-12-03T12:00:00.000Z",
}


def envelope(code: str, **more: object) -> bytes:
    return json.dumps({"error": {"code": code, "message": f"{code} happened", **more}}).encode()


def test_a_submit_is_a_post_with_its_body_and_always_an_idempotency_key() -> None:
    first = calls.submit("srv_1", "sleep", {"seconds": 1}, priority=7, after=["job_0"])
    second = calls.submit("srv_1", "sleep", {"seconds": 1}, priority=7, after=["job_0"])
    own = calls.submit("srv_1", "noop", idempotency_key="deploy-7")
    assert (first.method, first.path, first.params) == ("POST", "/api/v1/servers/srv_1/jobs", {})
    assert first.json == {
        "kind": "sleep",
        "priority": 7,
        "after": ["job_0"],
        "payload": {"seconds": 1},
    }
    keys = [call.headers["Idempotency-Key"] for call in (first, second, own)]
    assert (keys[0] != keys[1], keys[2]) == (True, "deploy-7")


def test_a_query_leaves_out_what_is_none_and_a_blocking_read_says_how_long_it_may_wait() -> None:
    page = calls.jobs_page(
        server_id="srv_1",
        state=None,
        kind="noop",
        id_prefix=None,
        group=None,
        page_size=2,
        cursor=None,
    )
    read = calls.job_when("job_1", "terminal", 12.3456)
    assert page.params == {"server_id": "srv_1", "kind": "noop", "limit": 2}
    assert (read.params, read.wait_s) == ({"wait_s": 12.346, "until": "terminal"}, 12.3456)


def test_an_answer_is_parsed_into_records() -> None:
    job = calls.answer(
        calls.job("job_1"), 200, json.dumps(JOB).encode(), {}, retried=False, platform="p"
    )
    page = {"jobs": [JOB], "next_cursor": ""}
    listed = calls.answer(
        calls.jobs_page(
            server_id=None,
            state=None,
            kind=None,
            id_prefix=None,
            group=None,
            page_size=1,
            cursor=None,
        ),
        200,
        json.dumps(page).encode(),
        {},
        retried=False,
        platform="p",
    )
    assert (job, job.state) == (Job.of(JOB), JobState.QUEUED)
    assert listed == ([Job.of(JOB)], None)  # an empty cursor: the last page


def test_an_error_envelope_becomes_the_error_its_code_names() -> None:
    def refused(status: int, content: bytes) -> Exception:
        return calls.refusal("GET", status, content, {"retry-after": "2"}, retried=False)

    missing = refused(404, envelope("not_found"))
    misfit = refused(422, envelope("invalid_payload", fields=[{"field": "argv", "message": "bad"}]))
    unknown = refused(418, envelope("teapot"))
    proxy = refused(502, b"<html>bad gateway</html>")
    busy = refused(429, envelope("channel_busy"))
    assert [type(error) for error in (missing, misfit, unknown, proxy, busy)] == [
        NotFound,
        InvalidPayload,
        PlatformError,
        Unreachable,
        TryAgain,
    ]
    assert isinstance(misfit, InvalidPayload)
    assert misfit.fields == (("argv", "bad"),)
    assert isinstance(unknown, PlatformError)
    assert (unknown.code, unknown.status, unknown.message) == ("teapot", 418, "teapot happened")
    assert isinstance(busy, TryAgain)
    assert (type(busy.error), busy.after_s) == (ChannelBusy, 2.0)


def test_a_retried_create_or_delete_says_its_first_try_may_have_done_it() -> None:
    def message(status: int, code: str, method: str) -> tuple[type[Exception], str]:
        error = calls.refusal(method, status, envelope(code), {}, retried=True)
        return type(error), str(error)

    created, deleted, read = (
        message(409, "already_exists", "POST"),
        message(404, "not_found", "DELETE"),
        message(404, "not_found", "GET"),
    )
    assert (created[0], "may have created it" in created[1]) == (AlreadyExists, True)
    assert (deleted[0], "may have deleted it" in deleted[1]) == (NotFound, True)
    assert (read[0], "first try" in read[1]) == (NotFound, False)


def test_a_body_that_is_not_json_is_unreachable() -> None:
    with pytest.raises(Unreachable, match="did not answer like a moonrun platform"):
        calls.answer(calls.whoami(), 200, b"<html>portal</html>", {}, retried=False, platform="p")
