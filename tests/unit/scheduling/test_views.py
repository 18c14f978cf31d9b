"""User-facing views: exact allowlisted keys, no secrets, wire time format, endpoint liveness."""

from __future__ import annotations

import json
import re
import typing
from dataclasses import replace
from typing import Any, NotRequired

import pytest

from moonrun.scheduling import messages
from moonrun.scheduling.fingerprint import token_hash
from moonrun.scheduling.jobs import Job, JobState, request_cancel
from moonrun.scheduling.reconcile import confirm
from moonrun.scheduling.records import Endpoint, Server, Session, User
from moonrun.scheduling.views import (
    JobView,
    endpoint_view,
    job_view,
    server_view,
    user_view,
)
from tests.support.jobkit import (
    ACK_TIMEOUT_MS,
    LEASE_TTL_MS,
    T0,
    accepted,
    acked,
    caller,
    claimed,
    evidence,
    lease_of,
    queued_job,
    reported,
    send_result,
)

WIRE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")

JOB_KEYS = {
    "id",
    "server_id",
    "kind",
    "state",
    "attempt",
    "max_attempts",
    "created_at",
    "updated_at",
    "retry",
    "progress",
    "cancel",
    "terminal",
    "reconcile",
    "history",
    "group",
    "logs_complete",
    "schedule",
    "concurrency",
    "waiting_for",
    "priority",
}
RETRY_KEYS = {"next_eligible_at", "initial_s", "multiplier", "max_s", "last_failure"}
FAILURE_KEYS = {"reason", "code", "attempt", "at", "message"}
PROGRESS_KEYS = {"seq", "percent", "message", "at"}
CANCEL_KEYS = {"requested", "requested_at", "result", "resolved_at"}
TERMINAL_KEYS = {"outcome", "attempt", "at", "error", "result"}
ERROR_KEYS = {"code", "message"}
RECONCILE_KEYS = {"outcome", "at"}
HISTORY_KEYS = {"attempt", "claimed_at", "ended_at", "outcome", "code"}
ENDPOINT_KEYS = {
    "id",
    "name",
    "online",
    "draining",
    "generation",
    "last_seen_at",
    "capacity",
    "run_version",
    "labels",
}

GENERATION_MARKER = 918_273_645
ENDPOINT_MARKER = "ENDPOINT-ID-MARKER"
PLANTED = [
    "PAYLOAD-MARKER-TOP",
    "PAYLOAD-MARKER-NESTED",
    "PAYLOAD-KEY-MARKER",
    "LEASE-HASH-MARKER",
    "REQUESTED-BY-MARKER",
    ENDPOINT_MARKER,
    str(GENERATION_MARKER),
]
"""Values `rich_job()` stores in fields that must never reach users."""
LEASES = [lease_of(1), lease_of(2), token_hash(lease_of(1)), token_hash(lease_of(2))]
"""The lease tokens Run held and their hashes."""


def rich_job() -> Job:
    """A cancelled job with every section filled: a failed attempt 1, then attempt 2 that was
    confirmed by reconcile, acked, reported progress, got a cancel request and was cancelled."""
    payload = {
        "secret": "PAYLOAD-MARKER-TOP",
        "nested": {"PAYLOAD-KEY-MARKER": ["PAYLOAD-MARKER-NESTED"]},
    }
    job = queued_job(payload=payload, endpoint_id=ENDPOINT_MARKER)
    job = acked(claimed(job, now=T0, generation=GENERATION_MARKER), now=T0 + 1_000)
    failure = reported("failed", retryable=True, error={"code": "flaky", "message": "try again"})
    job = accepted(send_result(job, failure, now=T0 + 2_000), JobState.RETRYING)
    job = claimed(job, now=job.eligible_at, generation=GENERATION_MARKER)
    job = confirm(
        job,
        caller(ENDPOINT_MARKER, GENERATION_MARKER),
        now=T0 + 3_500,
        ack_timeout_ms=ACK_TIMEOUT_MS,
        lease_ttl_ms=LEASE_TTL_MS,
    )
    job = acked(job, now=T0 + 4_000)
    progressed = messages.progress(
        job,
        caller(ENDPOINT_MARKER, GENERATION_MARKER),
        evidence(job),
        seq=1,
        percent=50.0,
        message="half way",
        now=T0 + 5_000,
        lease_ttl_ms=LEASE_TTL_MS,
        draw=0.0,
    )
    job = accepted(progressed, JobState.RUNNING)
    job = request_cancel(job, user_id="REQUESTED-BY-MARKER", now=T0 + 6_000)
    stopped = reported("cancelled", error={"code": "stopped", "message": "stopped on request"})
    job = accepted(send_result(job, stopped, now=T0 + 7_123), JobState.CANCELLED)
    return replace(job, lease_hash="LEASE-HASH-MARKER")


def all_keys(view: Any) -> set[str]:
    """Every dict key anywhere in a JSON-like value."""
    if isinstance(view, dict):
        return set(view) | {key for value in view.values() for key in all_keys(value)}
    if isinstance(view, list):
        return {key for value in view for key in all_keys(value)}
    return set()


# -- allowlist -------------------------------------------------------------------------------


def test_fresh_job_view_has_exactly_the_allowlisted_keys() -> None:
    """A queued job's view has the allowlisted top-level and nested keys, nothing else."""
    view = job_view(queued_job())
    expected = (JOB_KEYS, RETRY_KEYS, CANCEL_KEYS, RECONCILE_KEYS, None, None, None, [])
    actual = (
        set(view),
        set(view["retry"]),
        set(view["cancel"]),
        set(view["reconcile"]),
        view["retry"]["last_failure"],
        view["progress"],
        view["terminal"],
        view["history"],
    )
    assert expected == actual


def test_rich_job_view_has_exactly_the_allowlisted_nested_keys() -> None:
    """Every nested section of a fully populated job has exactly its allowlisted keys."""
    view = job_view(rich_job())
    assert view["progress"] is not None
    assert view["terminal"] is not None
    assert view["terminal"]["error"] is not None
    expected = [
        JOB_KEYS,
        RETRY_KEYS,
        FAILURE_KEYS,
        PROGRESS_KEYS,
        CANCEL_KEYS,
        TERMINAL_KEYS,
        ERROR_KEYS,
        RECONCILE_KEYS,
        HISTORY_KEYS,
        HISTORY_KEYS,
    ]
    actual = [
        set(view),
        set(view["retry"]),
        set(view["retry"]["last_failure"]),
        set(view["progress"]),
        set(view["cancel"]),
        set(view["terminal"]),
        set(view["terminal"]["error"]),
        set(view["reconcile"]),
        *(set(past) for past in view["history"]),
    ]
    assert expected == actual


def test_job_view_type_declares_the_same_top_level_keys() -> None:
    """The JobView TypedDict and the allowlist agree; its one key that may be absent is the
    payload, there only when asked for (`include=payload`)."""
    hints = typing.get_type_hints(JobView, include_extras=True)
    optional = {name for name, hint in hints.items() if typing.get_origin(hint) is NotRequired}
    expected = (JOB_KEYS, {"payload"})
    assert expected == (set(hints) - optional, optional)


@pytest.mark.parametrize(
    "forbidden",
    [
        "payload",
        "payload_json",
        "lease",
        "lease_hash",
        "session_id",
        "session_generation",
        "generation",
        "requested_by",
        "endpoint_id",
        "policy",
        "version",
        "output",
        "fingerprint",
    ],
)
def test_forbidden_field_names_appear_nowhere_in_the_view(forbidden: str) -> None:
    """No key at any depth of a job view names a credential or internal field."""
    assert forbidden not in all_keys(job_view(rich_job()))


def test_markers_are_planted_in_the_record() -> None:
    """Precondition of the leak test: every planted marker really is in the job record."""
    record = repr(rich_job())
    expected = []
    assert expected == [marker for marker in PLANTED if marker not in record]


@pytest.mark.parametrize("marker", PLANTED + LEASES)
def test_no_secret_marker_leaks_into_the_serialised_view(marker: str) -> None:
    """Payload, lease, lease hash, generation, requester and endpoint id never leave."""
    assert marker not in json.dumps(job_view(rich_job()))


def test_rich_job_view_values() -> None:
    """The rich job's view reports its scheduling status in wire form."""
    view = job_view(rich_job())
    expected: dict[str, Any] = {
        "id": "job-1",
        "server_id": "srv-1",
        "kind": "deploy.web",
        "state": "cancelled",
        "attempt": 2,
        "max_attempts": 3,
        "created_at": "2026-05-28T20:26:40.000Z",
        "updated_at": "2026-05-28T20:26:47.123Z",
        "retry": {
            "next_eligible_at": None,
            "initial_s": 1.0,
            "multiplier": 2.0,
            "max_s": 60.0,
            "last_failure": {
                "reason": "failed",
                "code": "flaky",
                "attempt": 1,
                "at": "2026-05-28T20:26:42.000Z",
                "message": "try again",
            },
        },
        "progress": {
            "seq": 1,
            "percent": 50.0,
            "message": "half way",
            "at": "2026-05-28T20:26:45.000Z",
        },
        "cancel": {
            "requested": True,
            "requested_at": "2026-05-28T20:26:46.000Z",
            "result": "cancelled",
            "resolved_at": "2026-05-28T20:26:47.123Z",
        },
        "terminal": {
            "outcome": "cancelled",
            "attempt": 2,
            "at": "2026-05-28T20:26:47.123Z",
            "error": {"code": "stopped", "message": "stopped on request"},
            "result": None,
        },
        "reconcile": {"outcome": "confirmed", "at": "2026-05-28T20:26:43.500Z"},
        "history": [
            {
                "attempt": 1,
                "claimed_at": "2026-05-28T20:26:40.000Z",
                "ended_at": "2026-05-28T20:26:42.000Z",
                "outcome": "failed",
                "code": "flaky",
            },
            {
                "attempt": 2,
                "claimed_at": "2026-05-28T20:26:43.000Z",
                "ended_at": "2026-05-28T20:26:47.123Z",
                "outcome": "cancelled",
                "code": None,
            },
        ],
        "group": None,
        "logs_complete": False,
        "schedule": None,
        "concurrency": None,
        "waiting_for": None,
        "priority": 5,
    }
    assert expected == view


def test_waiting_job_shows_its_next_eligible_time() -> None:
    """next_eligible_at is set only while the job waits for a claim."""
    job = replace(queued_job(), eligible_at=T0 + 61_001)
    expected = "2026-05-28T20:27:41.001Z"
    assert expected == job_view(job)["retry"]["next_eligible_at"]


# -- time format -----------------------------------------------------------------------------


def time_fields(view: Any, key: str = "") -> list[tuple[str, Any]]:
    """(key, value) for every `*_at` field anywhere in the view."""
    if isinstance(view, dict):
        return [pair for k, v in view.items() for pair in time_fields(v, k)]
    if isinstance(view, list):
        return [pair for item in view for pair in time_fields(item, key)]
    return [(key, view)] if key == "at" or key.endswith("_at") else []


def test_every_time_renders_with_milliseconds_and_z() -> None:
    """All times in a job view are YYYY-MM-DDTHH:MM:SS.mmmZ."""
    fields = [(key, value) for key, value in time_fields(job_view(rich_job())) if value]
    expected = (12, [])
    assert expected == (
        len(fields),
        [(key, value) for key, value in fields if not WIRE_TIME.match(value)],
    )


# -- endpoints, servers, users ---------------------------------------------------------------


def endpoint(current_session_id: str | None = "SESSION-ID-MARKER") -> Endpoint:
    return Endpoint(
        id="ep-1",
        name="host-a",
        created_at=T0,
        join_token_hash="JOIN-HASH-MARKER",
        join_token_expires_at=T0 + 1_000,
        identity_public_key="PUBLIC-KEY-MARKER",
        joined_at=T0 + 10,
        generation=4,
        current_session_id=current_session_id,
    )


def session(session_id: str = "SESSION-ID-MARKER") -> Session:
    return Session(
        id=session_id,
        endpoint_id="ep-1",
        generation=4,
        boot_id="BOOT-ID-MARKER",
        capacity=8,
        run_version="0.1.0",
        created_at=T0,
        last_seen_at=T0 + 2_500,
        expires_at=T0 + 50_000,
    )


BOUND_MS = 15_000
"""The liveness bound with the default settings (a heartbeat every 10 s, plus 5 s)."""


def test_endpoint_with_a_live_current_session_is_online() -> None:
    """The current, unexpired session that heartbeat within the bound makes the endpoint
    online with its details."""
    expected = {
        "id": "ep-1",
        "name": "host-a",
        "online": True,
        "draining": False,
        "generation": 4,
        "last_seen_at": "2026-05-28T20:26:42.500Z",
        "capacity": 8,
        "run_version": "0.1.0",
        "labels": {},
    }
    view = endpoint_view(endpoint(), session(), T0 + 2_500 + BOUND_MS, liveness_bound_ms=BOUND_MS)
    assert expected == view


def test_endpoint_is_offline_once_its_session_expires() -> None:
    """At now == expires_at the session is no longer live, however recent its last beat."""
    beat_late = replace(session(), last_seen_at=T0 + 49_000)
    view = endpoint_view(endpoint(), beat_late, T0 + 50_000, liveness_bound_ms=BOUND_MS)
    assert False is view["online"]


@pytest.mark.parametrize(
    ("current", "given"),
    [("SESSION-ID-MARKER", None), ("newer-session", session()), (None, session())],
    ids=["no-session", "not-current", "endpoint-has-none"],
)
def test_endpoint_without_its_current_session_is_offline(
    current: str | None, given: Session | None
) -> None:
    """A missing, superseded or ended session shows the endpoint offline; the details are
    those of the session given (its last one), if any."""
    view = endpoint_view(endpoint(current), given, T0, liveness_bound_ms=BOUND_MS)
    shown = (None, None, None) if given is None else ("2026-05-28T20:26:42.500Z", 8, "0.1.0")
    expected = (ENDPOINT_KEYS, False, *shown, 4)
    actual = (
        set(view),
        view["online"],
        view["last_seen_at"],
        view["capacity"],
        view["run_version"],
        view["generation"],
    )
    assert expected == actual


@pytest.mark.parametrize(
    "marker", ["SESSION-ID-MARKER", "BOOT-ID-MARKER", "JOIN-HASH-MARKER", "PUBLIC-KEY-MARKER"]
)
def test_endpoint_view_leaks_no_session_or_key_material(marker: str) -> None:
    """Session id, boot id, join token hash and identity key never appear."""
    view = endpoint_view(endpoint(), session(), T0, liveness_bound_ms=BOUND_MS)
    assert marker not in json.dumps(view)


def test_user_view_never_includes_the_password_hash() -> None:
    """A user's view is id, name, admin flag, creation time and disabled flag only."""
    user = User("u-1", "alice", False, T0, password_hash="PASSWORD-HASH-MARKER")
    expected = {
        "id": "u-1",
        "name": "alice",
        "platform_admin": False,
        "created_at": "2026-05-28T20:26:40.000Z",
        "disabled": False,
    }
    assert expected == user_view(user)


def test_server_view_lists_its_admins() -> None:
    """A server's view carries its endpoint (and whether it is online), owner and admins,
    without the record version."""
    server = Server("srv-1", "web-1", "ep-1", "u-1", T0, admin_ids=("u-2", "u-3"), version=9)
    expected = {
        "id": "srv-1",
        "name": "web-1",
        "endpoint_id": "ep-1",
        "owner_id": "u-1",
        "admin_ids": ["u-2", "u-3"],
        "created_at": "2026-05-28T20:26:40.000Z",
        "endpoint_online": True,
        "labels": {},
    }
    assert expected == server_view(server, endpoint_online=True)
