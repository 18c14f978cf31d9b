"""Every platform scenario of the durable-scheduling spec, over HTTP, on every store.

The same scenarios as `test_scenarios.py`, one layer up: the real ASGI app, a Run that signs
its requests as docs/protocol.md, "Signing", says, and users with API tokens. Each test asserts the
HTTP status and the wire error code, and reads state back through the user API or the store.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import rfc8785

from moonrun.scheduling.fingerprint import token_hash
from moonrun.scheduling.time import format_instant
from moonrun.security import signing
from moonrun.security.keys import session_key
from tests.support.http_harness import ADMIN_TOKEN, SECRET, Cast, HttpWorld, SignedRun, http_world
from tests.support.stores import StoreFactory

SECOND = 1000


@pytest.fixture
def cast(store_factory: StoreFactory, tmp_path: Path) -> Iterator[Cast]:
    with http_world(store_factory, tmp_path) as cast:
        yield cast


def error_of(response: httpx.Response) -> tuple[int, str]:
    """(status, code) of a PROTOCOL error answer, after checking its shape."""
    body = response.json()
    assert list(body) == ["error"], response.text
    assert {"code", "message"} == set(body["error"])
    assert isinstance(body["error"]["message"], str)
    return response.status_code, body["error"]["code"]


def ok(response: httpx.Response, status: int = 200) -> Any:
    """The JSON answer of a request that must succeed with `status`."""
    assert status == response.status_code, response.text
    return response.json()


def submit(cast: Cast, **body: Any) -> str:
    """Queue a job on the owner's server web-1; returns its id."""
    job_id: str = cast.world.submit(cast.server_id, cast.owner[1], **body)["id"]
    return job_id


def view(cast: Cast, job_id: str, token: str = ADMIN_TOKEN) -> Any:
    """The JobView a user reads."""
    return ok(cast.world.api("GET", f"/api/v1/jobs/{job_id}", token=token))


def cancel(cast: Cast, job_id: str, token: str) -> httpx.Response:
    return cast.world.api("POST", f"/api/v1/jobs/{job_id}/cancel", token=token)


def now(world: HttpWorld) -> str:
    return format_instant(world.clock.now())


def in_ms(world: HttpWorld, ms: int) -> str:
    return format_instant(world.clock.now() + ms)


def fail_retryably(run: SignedRun, job_id: str) -> int:
    """Run one attempt of `job_id` to a retryable failure; returns that attempt."""
    attempt = run.run_to_running(job_id)
    error = {"code": "boom", "message": "x"}
    answer = ok(run.result(job_id, attempt, "failed", retryable=True, error=error))
    assert answer["state"] == "retrying"
    return attempt


def claim_response(run: SignedRun, max_jobs: int = 1) -> httpx.Response:
    """A claim whose answer may be an error (SignedRun.claim insists on 200)."""
    return run.post("/run/v1/jobs/claim", {"max_jobs": max_jobs})


# -- Requirement: Durable scheduling state ----------------------------------------------------


def test_platform_reload_preserves_active_attempt(cast: Cast) -> None:
    """A new app over the reopened store keeps the attempt authoritative and accepts its lease."""
    world, run = cast.world, cast.run.start()
    job = submit(cast)
    attempt = run.run_to_running(job)
    ok(run.progress(job, attempt, 1, percent=10.0))
    ok(cancel(cast, job, cast.owner[1]), 202)
    path = f"/run/v1/jobs/{job}/progress"
    early = json.dumps({**run.evidence(job, attempt), "seq": 2}).encode()
    signed_before_restart = run.signed_headers("POST", path, early)
    world.clock.advance(2 * SECOND)
    before = world.stored_row(job)

    world.restart()

    assert before == world.stored_row(job)
    # The new instance's nonce cache is empty, so it refuses what was signed before it started.
    replay = world.client.post(path, content=early, headers=signed_before_restart)
    assert error_of(replay) == (401, "signature_expired")
    assert before == world.stored_row(job)
    stored = world.stored(job)
    assert (run.endpoint_id, 1, "running", 1) == (
        stored.endpoint_id,
        stored.attempt,
        stored.state.value,
        stored.session_generation,
    )
    assert token_hash(run.leases[(job, attempt)]) == stored.lease_hash
    world.clock.advance(5 * SECOND)
    ok(run.heartbeat())
    answer = ok(run.progress(job, attempt, 2, percent=20.0))
    assert (True, in_ms(world, world.settings.lease_ttl_ms)) == (
        answer["cancel_requested"],
        answer["lease_expires_at"],
    )
    seen = view(cast, job, cast.owner[1])
    assert (
        seen["state"],
        seen["attempt"],
        seen["cancel"]["requested"],
        seen["progress"]["percent"],
    ) == ("running", 1, True, 20.0)


def test_file_and_mysql_reload_preserve_queued_work(cast: Cast) -> None:
    """After a reopen, retry-wait work is claimable exactly at its eligibility, attempt intact."""
    world, run = cast.world, cast.run.start()
    job = submit(cast)
    queued_at = world.clock.now() + 10 * SECOND
    queued = submit(cast, not_before=format_instant(queued_at))
    attempt = fail_retryably(run, job)
    eligible_at = world.stored(job).eligible_at

    world.restart()

    waiting = view(cast, job)
    assert ("retrying", attempt, format_instant(eligible_at)) == (
        waiting["state"],
        waiting["attempt"],
        waiting["retry"]["next_eligible_at"],
    )
    assert (view(cast, queued)["state"], view(cast, queued)["attempt"]) == ("queued", 0)
    run.start()
    world.clock.advance(eligible_at - 1 - world.clock.now())
    assert run.claim(4) == []
    world.clock.advance(1)
    assert [(job, attempt + 1)] == [(c["job_id"], c["attempt"]) for c in run.claim(4)]
    world.clock.advance(queued_at - 1 - world.clock.now())
    assert run.claim(4) == []
    world.clock.advance(1)
    assert [(queued, 1)] == [(c["job_id"], c["attempt"]) for c in run.claim(4)]


def test_a_claim_names_each_jobs_owner_whoever_submitted_it(cast: Cast) -> None:
    """Each granted job carries `owner_id`: its server's owner, also for a job that a server
    administrator submitted (protocol 90), so that Run can keep owners apart."""
    run = cast.run.start()
    by_owner = submit(cast)
    by_helper = cast.world.submit(cast.server_id, cast.helper[1])["id"]
    granted = run.claim(2)
    assert [(by_owner, cast.owner[0]), (by_helper, cast.owner[0])] == [
        (job["job_id"], job["owner_id"]) for job in granted
    ]
    assert cast.world.stored(by_helper).owner_id == cast.owner[0]


# -- Requirement: Lease and attempt fencing ----------------------------------------------------


def test_ack_deadline_expires(cast: Cast) -> None:
    """A late ack is refused; the job retries later, or fails once its budget is spent."""
    world, run = cast.world, cast.run.start()
    job = submit(cast)
    last_try = submit(cast, max_attempts=1)
    grants = {g["job_id"]: g["attempt"] for g in run.claim(2)}
    assert {job: 1, last_try: 1} == grants
    world.clock.advance(world.settings.ack_timeout_ms)

    assert error_of(run.ack(job, 1)) == (409, "ack_deadline_expired")
    assert world.platform.service.sweep() == 1

    retrying = view(cast, job)
    assert ("retrying", in_ms(world, SECOND)) == (
        retrying["state"],
        retrying["retry"]["next_eligible_at"],
    )
    assert (
        retrying["retry"]["last_failure"]["reason"],
        retrying["retry"]["last_failure"]["attempt"],
    ) == ("ack_timeout", 1)
    failed = view(cast, last_try)
    assert (
        failed["state"],
        failed["terminal"]["outcome"],
        failed["terminal"]["error"]["code"],
    ) == ("failed", "failed", "ack_timeout")
    for job_id in (job, last_try):
        assert error_of(run.ack(job_id, 1)) == (409, "ack_deadline_expired")
    world.clock.advance(3600 * SECOND)
    run.start()
    assert [(job, 2)] == [(c["job_id"], c["attempt"]) for c in run.claim(4)]
    assert view(cast, last_try)["state"] == "failed"


def test_execution_lease_expires(cast: Cast) -> None:
    """Without accepted renewals the lease is cleared and retry policy applies durably."""
    world, run = cast.world, cast.run.start()
    job = submit(cast)
    attempt = run.run_to_running(job)
    world.clock.advance(world.settings.lease_ttl_ms - 1)
    assert world.platform.service.sweep() == 0
    world.clock.advance(1)

    assert world.platform.service.sweep() == 1

    world.restart()
    stored = world.stored(job)
    assert (stored.state.value, stored.deadline_at) == ("retrying", None)
    assert token_hash(run.leases[(job, attempt)]) == stored.lease_hash  # kept as evidence
    assert view(cast, job)["retry"]["last_failure"]["reason"] == "lease_expired"
    before = world.stored_row(job)
    late = [
        run.ack(job, attempt),
        run.cancel_poll(job, attempt),
        run.progress(job, attempt, 9),
        run.result(job, attempt, "succeeded"),
    ]
    assert [error_of(r) for r in late] == [(409, "lease_expired")] * 4
    assert before == world.stored_row(job)


def test_old_attempt_arrives_late(cast: Cast) -> None:
    """Messages and reconcile entries of an older attempt or lease change nothing."""
    world, run = cast.world, cast.run.start()
    job = submit(cast)
    (first,) = run.claim()
    world.clock.advance(world.settings.ack_timeout_ms)
    world.platform.service.sweep()
    world.clock.advance(SECOND)
    (second,) = run.claim()
    ok(run.ack(job, second["attempt"]))
    current = world.stored_row(job)

    late = [
        run.ack(job, first["attempt"]),
        run.cancel_poll(job, first["attempt"]),
        run.progress(job, first["attempt"], 1),
        run.result(job, first["attempt"], "succeeded"),
    ]
    assert [error_of(r) for r in late] == [(409, "stale_attempt")] * 4
    forged = {"attempt": second["attempt"], "lease": first["lease"], "seq": 1}
    assert error_of(run.post(f"/run/v1/jobs/{job}/progress", forged)) == (409, "lease_mismatch")
    assert current == world.stored_row(job)

    ok(run.result(job, second["attempt"], "succeeded"))
    terminal = world.stored_row(job)
    report = ok(run.reconcile([run.entry(job, first["attempt"])]))
    assert [(job, first["attempt"], "terminal")] == [
        (d["job_id"], d["attempt"], d["reason"]) for d in report["discard"]
    ]
    assert (report["confirmed"], report["lost"]) == ([], [])
    late_result = run.result(job, first["attempt"], "failed", retryable=False)
    assert error_of(late_result) == (409, "stale_attempt")
    assert terminal == world.stored_row(job)


@dataclass
class Intrusion:
    """Two running jobs of host-a, and the means to attack them."""

    cast: Cast
    run: SignedRun
    job: str
    other: str
    attempt: int

    @property
    def world(self) -> HttpWorld:
        return self.cast.world

    def path(self, message: str, job_id: str | None = None) -> str:
        return f"/run/v1/jobs/{job_id or self.job}/{message}"

    def progress_body(self, seq: int = 5) -> dict[str, Any]:
        return {**self.run.evidence(self.job, self.attempt), "seq": seq}

    def job_messages(self, sender: SignedRun, **signing_options: Any) -> list[httpx.Response]:
        """Ack, cancel-poll, progress and result with host-a's evidence, signed as given."""
        evidence = self.run.evidence(self.job, self.attempt)
        result = {**evidence, "outcome": "succeeded", "retryable": False}
        return [
            sender.post(self.path("ack"), evidence, **signing_options),
            sender.post(self.path("cancel-poll"), evidence, **signing_options),
            sender.post(self.path("progress"), self.progress_body(), **signing_options),
            sender.post(self.path("result"), result, **signing_options),
        ]

    def send_raw(self, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        return self.world.client.post(path, content=body, headers=headers)

    def align_clock(self) -> float:
        """Move the clock to a whole second (signatures carry whole seconds); returns it."""
        self.world.clock.advance(-self.world.clock.now() % SECOND)
        return self.world.clock.now() / SECOND


Attack = Callable[[], list[httpx.Response]]


def another_endpoint(x: Intrusion) -> Attack:
    intruder = x.cast.other_run.start()
    intruder.leases.update(x.run.leases)
    return lambda: [*x.job_messages(intruder), intruder.send_logs(x.job, x.attempt, 1, "x")]


def rotated_session(x: Intrusion) -> Attack:
    old = {"key_id": f"session:{x.run.session_id}", "key": x.run.session_key}
    assert x.run.register(boot_id="boot-2").status_code == 201
    return lambda: [*x.job_messages(x.run, **old), x.run.post("/run/v1/heartbeat", {}, **old)]


def expired_session(x: Intrusion) -> Attack:
    x.world.clock.advance(x.world.settings.session_ttl_ms)
    return lambda: [*x.job_messages(x.run), x.run.heartbeat()]


def unknown_session(x: Intrusion) -> Attack:
    # The MAC verifies (the key is derived as the platform would), but no such session exists.
    forged = {"key_id": "session:ses_forged", "key": session_key(SECRET, "ses_forged")}
    return lambda: x.job_messages(x.run, **forged)


def wrong_key(x: Intrusion) -> Attack:
    return lambda: x.job_messages(x.run, key=secrets.token_bytes(32))


def tampered_body(x: Intrusion) -> Attack:
    def attack() -> list[httpx.Response]:
        path = x.path("progress")
        signed = json.dumps(x.progress_body(5)).encode()
        sent = json.dumps(x.progress_body(6)).encode()
        headers = x.run.signed_headers("POST", path, signed)
        redigested = {**x.run.signed_headers("POST", path, signed)}
        redigested["Content-Digest"] = signing.content_digest(sent)  # the MAC then fails
        return [x.send_raw(path, sent, headers), x.send_raw(path, sent, redigested)]

    return attack


def tampered_path(x: Intrusion) -> Attack:
    def attack() -> list[httpx.Response]:
        body = json.dumps(x.progress_body()).encode()
        other_job = x.run.signed_headers("POST", x.path("progress", x.other), body)
        other_message = x.run.signed_headers("POST", x.path("ack"), body)
        query = x.run.signed_headers("POST", x.path("progress"), body, query="x=1")
        return [
            x.send_raw(x.path("progress"), body, other_job),
            x.send_raw(x.path("progress"), body, other_message),
            x.send_raw(x.path("progress"), body, query),
        ]

    return attack


def replayed_nonce(x: Intrusion) -> Attack:
    path, body = x.path("progress"), json.dumps(x.progress_body()).encode()
    headers = x.run.signed_headers("POST", path, body)
    assert x.send_raw(path, body, headers).status_code == 200
    return lambda: [x.send_raw(path, body, headers), x.send_raw(path, body, headers)]


def created_301_s_ago(x: Intrusion) -> Attack:
    now_s = x.align_clock()
    assert x.run.post("/run/v1/heartbeat", {}, created=int(now_s) - 300).status_code == 200
    return lambda: x.job_messages(x.run, created=int(now_s) - 301)


def created_301_s_ahead(x: Intrusion) -> Attack:
    now_s = x.align_clock()
    assert x.run.post("/run/v1/heartbeat", {}, created=int(now_s) + 300).status_code == 200
    return lambda: x.job_messages(x.run, created=math.ceil(now_s) + 301)


def missing_signature(x: Intrusion) -> Attack:
    def attack() -> list[httpx.Response]:
        path, body = x.path("progress"), json.dumps(x.progress_body()).encode()
        signed = x.run.signed_headers("POST", path, body)
        without_digest = {k: v for k, v in signed.items() if k != "Content-Digest"}
        without_signature = {k: v for k, v in signed.items() if k != "Signature"}
        unparsable = {**signed, "Signature-Input": 'run=("@method" "@path'}
        return [
            x.send_raw(path, body, {"Content-Type": "application/json"}),
            x.send_raw(path, body, without_digest),
            x.send_raw(path, body, without_signature),
            x.send_raw(path, body, unparsable),
        ]

    return attack


INTRUSIONS: dict[str, tuple[Callable[[Intrusion], Attack], tuple[int, str]]] = {
    "another_endpoint": (another_endpoint, (403, "wrong_endpoint")),
    "rotated_session": (rotated_session, (401, "session_rotated")),
    "expired_session": (expired_session, (401, "session_expired")),
    "unknown_session": (unknown_session, (401, "signature_invalid")),
    "wrong_key": (wrong_key, (401, "signature_invalid")),
    "tampered_body": (tampered_body, (401, "signature_invalid")),
    "tampered_path": (tampered_path, (401, "signature_invalid")),
    "replayed_nonce": (replayed_nonce, (401, "replayed")),
    "created_301_s_ago": (created_301_s_ago, (401, "signature_expired")),
    "created_301_s_ahead": (created_301_s_ahead, (401, "signature_expired")),
    "missing_signature": (missing_signature, (401, "signature_missing")),
}


@pytest.mark.parametrize("intrusion", list(INTRUSIONS))
def test_invalid_endpoint_or_session(cast: Cast, intrusion: str) -> None:
    """Another endpoint, a rotated or expired session, or a bad signature leave the job as is."""
    world = cast.world
    # Far enough from the instance's start that `created` 301 s ago does not predate it.
    world.clock.advance(400 * SECOND)
    run = cast.run.start()
    job, other = submit(cast), submit(cast)
    grants = {g["job_id"]: g["attempt"] for g in run.claim(2)}
    for job_id, attempt in grants.items():
        ok(run.ack(job_id, attempt))
    situation = Intrusion(cast, run, job, other, grants[job])
    prepare, expected = INTRUSIONS[intrusion]
    attack = prepare(situation)
    before = {job_id: world.stored_row(job_id) for job_id in (job, other)}

    responses = attack()

    assert [expected] * len(responses) == [error_of(r) for r in responses]
    assert before == {job_id: world.stored_row(job_id) for job_id in (job, other)}


# -- Requirement: Retry and terminal policy ---------------------------------------------------


def test_retry_waits_for_backoff(cast: Cast) -> None:
    """A retryable failure records the next eligible time; no claim gets the job before it."""
    world, run = cast.world, cast.run.start()
    job = submit(cast)
    attempt = run.run_to_running(job)
    error = {"code": "boom", "message": "x"}
    answer = ok(run.result(job, attempt, "failed", retryable=True, error=error))

    assert ("retrying", in_ms(world, SECOND), False) == (
        answer["state"],
        answer["next_eligible_at"],
        answer["replayed"],
    )
    assert answer["next_eligible_at"] == view(cast, job)["retry"]["next_eligible_at"]
    world.clock.advance(SECOND - 1)
    assert run.claim() == []
    world.clock.advance(1)
    (again,) = run.claim()
    ok(run.ack(job, again["attempt"]))
    second = ok(run.result(job, again["attempt"], "failed", retryable=True))
    assert in_ms(world, 2 * SECOND) == second["next_eligible_at"]


def test_retry_claim_increments_attempt(cast: Cast) -> None:
    """The next claim is attempt + 1 under a different lease; the old lease stops working."""
    world, run = cast.world, cast.run.start()
    job = submit(cast)
    first = fail_retryably(run, job)
    world.clock.advance(SECOND)

    (granted,) = run.claim()

    assert (job, first + 1) == (granted["job_id"], granted["attempt"])
    assert run.leases[(job, first)] != granted["lease"]
    assert granted["lease"].startswith("mrl_")
    assert token_hash(granted["lease"]) == world.stored(job).lease_hash
    assert error_of(run.ack(job, first)) == (409, "stale_attempt")
    old_lease = {"attempt": granted["attempt"], "lease": run.leases[(job, first)]}
    assert error_of(run.post(f"/run/v1/jobs/{job}/ack", old_lease)) == (409, "lease_mismatch")
    assert (view(cast, job)["state"], view(cast, job)["attempt"]) == ("accepted", 2)


def test_retry_budget_is_exhausted(cast: Cast) -> None:
    """A retryable failure on the last attempt ends the job failed; claims never return it."""
    world, run = cast.world, cast.run.start()
    job = submit(cast, max_attempts=3)
    states = []
    for _ in range(3):
        world.clock.advance(4 * SECOND)
        attempt = run.run_to_running(job)
        states.append(ok(run.result(job, attempt, "failed", retryable=True))["state"])

    assert states == ["retrying", "retrying", "failed"]
    done = view(cast, job)
    assert (
        done["state"],
        done["attempt"],
        done["terminal"]["attempt"],
        done["terminal"]["outcome"],
        done["retry"]["next_eligible_at"],
    ) == ("failed", 3, 3, "failed", None)
    world.clock.advance(24 * 3600 * SECOND)
    assert run.start().claim(4) == []


def test_terminal_replay_conflicts(cast: Cast) -> None:
    """The same fingerprint replays the stored answer; another fingerprint or attempt is refused."""
    world, run = cast.world, cast.run.start()
    job = submit(cast)
    attempt = run.run_to_running(job)
    first = ok(run.result(job, attempt, "succeeded", output={"rows": 3}))
    stored = world.stored_row(job)

    world.clock.advance(SECOND)
    replay = ok(run.result(job, attempt, "succeeded", output={"rows": 3}))

    canonical = {"outcome": "succeeded", "retryable": False, "error": None, "output": {"rows": 3}}
    assert hashlib.sha256(rfc8785.dumps(canonical)).hexdigest() == first["fingerprint"]
    assert {**first, "replayed": True} == replay
    conflicts = [
        run.result(job, attempt, "succeeded", output={"rows": 4}),
        run.result(job, attempt, "failed", retryable=True),
    ]
    assert [error_of(r) for r in conflicts] == [(409, "terminal_conflict")] * 2
    other_attempt = {
        "attempt": attempt + 1,
        "lease": run.leases[(job, attempt)],
        "outcome": "succeeded",
        "retryable": False,
        "output": {"rows": 3},
    }
    other = run.post(f"/run/v1/jobs/{job}/result", other_attempt)
    assert error_of(other) == (409, "stale_attempt")
    assert stored == world.stored_row(job)


# -- Requirement: Idempotent durable cancellation ---------------------------------------------


def test_cancel_before_claim(cast: Cast) -> None:
    """Queued and retry-wait jobs record intent and the cancelled result at once, unclaimed."""
    world, run = cast.world, cast.run.start()
    waiting = submit(cast)
    fail_retryably(run, waiting)
    queued = submit(cast)

    answers = [ok(cancel(cast, job_id, cast.owner[1])) for job_id in (queued, waiting)]

    for answer in answers:
        assert ("cancelled", True, "cancelled", now(world), now(world)) == (
            answer["state"],
            answer["cancel"]["requested"],
            answer["cancel"]["result"],
            answer["cancel"]["requested_at"],
            answer["cancel"]["resolved_at"],
        )
        assert answer == view(cast, answer["id"])
    assert (view(cast, queued)["attempt"], view(cast, waiting)["attempt"]) == (0, 1)
    world.clock.advance(3600 * SECOND)
    assert run.start().claim(4) == []


def test_cancel_after_claim(cast: Cast) -> None:
    """Run's fenced polling sees the durable intent; its cancelled result completes it."""
    world, run = cast.world, cast.run.start()
    job = submit(cast)
    (granted,) = run.claim()
    attempt = granted["attempt"]

    intent = ok(cancel(cast, job, cast.helper[1]), 202)

    assert (
        intent["state"],
        intent["cancel"]["requested"],
        intent["cancel"]["result"],
    ) == ("accepted", True, None)
    assert {"cancel_requested": True, "requested_at": now(world)} == ok(
        run.cancel_poll(job, attempt)
    )
    ok(run.ack(job, attempt))
    assert ok(run.progress(job, attempt, 1))["cancel_requested"] is True
    answer = ok(run.result(job, attempt, "cancelled"))
    done = view(cast, job)
    assert ("cancelled", "cancelled", "cancelled", now(world)) == (
        answer["state"],
        done["terminal"]["outcome"],
        done["cancel"]["result"],
        done["cancel"]["resolved_at"],
    )


def test_cancel_is_repeated(cast: Cast) -> None:
    """Repeated cancels and polls return the existing intent and result, creating nothing new."""
    world, run = cast.world, cast.run.start()
    job = submit(cast)
    attempt = run.run_to_running(job)
    first = ok(cancel(cast, job, cast.owner[1]), 202)
    stored = world.stored_row(job)
    world.clock.advance(SECOND)

    again = ok(cancel(cast, job, ADMIN_TOKEN), 202)
    polls = [ok(run.cancel_poll(job, attempt)) for _ in range(3)]

    assert first == again
    assert stored == world.stored_row(job)
    assert [polls[0]] * 3 == polls
    assert {"cancel_requested": True, "requested_at": first["cancel"]["requested_at"]} == polls[0]
    assert ok(run.result(job, attempt, "failed", retryable=True))["state"] == "cancelled"
    done = view(cast, job)
    assert (
        done["state"],
        done["attempt"],
        done["cancel"]["result"],
    ) == ("cancelled", 1, "cancelled")
    assert done == ok(cancel(cast, job, cast.owner[1]))
    assert run.claim(4) == []


def test_cross_owner_cancellation_is_denied(cast: Cast) -> None:
    """A user who neither owns nor administers the server gets forbidden; no intent persists."""
    world = cast.world
    job = submit(cast)
    before = world.stored_row(job)

    assert error_of(cancel(cast, job, cast.stranger[1])) == (403, "forbidden")
    assert error_of(cancel(cast, "job_nosuchjob", cast.stranger[1])) == (404, "not_found")
    unauthenticated = world.api("POST", f"/api/v1/jobs/{job}/cancel", token=None)
    assert error_of(unauthenticated) == (401, "unauthenticated")

    assert before == world.stored_row(job)
    assert (view(cast, job)["cancel"]["requested"], view(cast, job)["state"]) == (False, "queued")


# -- Requirement: Run restart and platform reconciliation -------------------------------------


def test_run_restart_resumes_confirmed_attempt(cast: Cast) -> None:
    """After re-registering, reconcile confirms and rebinds the attempt before any new claim."""
    world, run = cast.world, cast.run.start(capacity=2)
    job, later = submit(cast), submit(cast)
    attempt = run.run_to_running(job)

    assert run.register(capacity=2, boot_id="boot-2").status_code == 201
    assert run.generation == 2
    assert error_of(claim_response(run)) == (409, "reconcile_required")
    assert error_of(run.progress(job, attempt, 1)) == (409, "reconcile_required")

    report = ok(run.reconcile([run.entry(job, attempt)]))

    assert [
        {
            "job_id": job,
            "attempt": attempt,
            "state": "running",
            "cancel_requested": False,
            "deadline": in_ms(world, world.settings.lease_ttl_ms),
        }
    ] == report["confirmed"]
    assert (report["discard"], report["lost"]) == ([], [])
    stored = world.stored(job)
    assert stored.reconcile is not None
    assert (
        stored.session_generation,
        stored.reconcile.outcome.value,
        stored.reconcile.generation,
    ) == (2, "confirmed", 2)
    assert view(cast, job)["reconcile"]["outcome"] == "confirmed"
    ok(run.progress(job, attempt, 1))
    assert [later] == [c["job_id"] for c in run.claim(4)]
    assert ok(run.result(job, attempt, "succeeded"))["state"] == "succeeded"


def test_run_reports_stale_journal_entry(cast: Cast) -> None:
    """Terminal, unknown, foreign, wrong-attempt and wrong-lease entries are discarded."""
    world, run = cast.world, cast.run.start(capacity=1)
    done, waiting, live = submit(cast), submit(cast), submit(cast)
    foreign = world.submit(cast.other_server_id, cast.stranger[1])["id"]
    done_attempt = run.run_to_running(done)
    ok(run.result(done, done_attempt, "succeeded"))
    waiting_attempt = fail_retryably(run, waiting)
    live_attempt = run.run_to_running(live)
    (foreign_grant,) = cast.other_run.start().claim()
    before = {j: world.stored_row(j) for j in (done, waiting, foreign)}

    entries = [
        run.entry(done, done_attempt),
        {"job_id": "job_unknown", "attempt": 1, "lease": "mrl_whatever"},
        {"job_id": foreign, "attempt": foreign_grant["attempt"], "lease": foreign_grant["lease"]},
        {
            "job_id": waiting,
            "attempt": waiting_attempt + 1,
            "lease": run.leases[(waiting, waiting_attempt)],
        },
        {"job_id": live, "attempt": live_attempt, "lease": "mrl_not-the-lease"},
    ]
    assert run.register(capacity=1, boot_id="boot-2").status_code == 201
    report = ok(run.reconcile(entries))

    assert [
        (done, "terminal"),
        ("job_unknown", "unknown"),
        (foreign, "wrong_endpoint"),
        (waiting, "wrong_attempt"),
        (live, "wrong_lease"),
    ] == [(d["job_id"], d["reason"]) for d in report["discard"]]
    assert report["confirmed"] == []
    assert [{"job_id": live, "attempt": live_attempt, "state": "retrying"}] == report["lost"]
    assert before == {j: world.stored_row(j) for j in (done, waiting, foreign)}
    not_active = ok(run.reconcile([run.entry(waiting, waiting_attempt)]))
    assert [(waiting, "not_active")] == [(d["job_id"], d["reason"]) for d in not_active["discard"]]
    assert view(cast, waiting)["state"] == "retrying"


def test_platform_restart_accepts_reconciliation(cast: Cast) -> None:
    """A restarted platform validates Run's journal against the store alone."""
    world, run = cast.world, cast.run.start()
    job = submit(cast)
    attempt = run.run_to_running(job)

    world.restart()
    same_session = ok(run.reconcile([run.entry(job, attempt)]))
    assert run.register(boot_id="boot-2").status_code == 201
    new_session = ok(run.reconcile([run.entry(job, attempt)]))

    assert [(job, attempt, "running")] == [
        (c["job_id"], c["attempt"], c["state"]) for c in same_session["confirmed"]
    ]
    assert [(job, attempt, "running")] == [
        (c["job_id"], c["attempt"], c["state"]) for c in new_session["confirmed"]
    ]
    assert (
        same_session["discard"],
        same_session["lost"],
        new_session["discard"],
        new_session["lost"],
    ) == ([], [], [], [])
    assert world.stored(job).session_generation == 2
    assert ok(run.result(job, attempt, "succeeded"))["state"] == "succeeded"


def test_platform_active_work_is_missing_from_run(cast: Cast) -> None:
    """Active jobs the report omits are recorded lost and go to cancel or retry policy."""
    run = cast.run.start(capacity=3)
    accepted, running, last_try = submit(cast), submit(cast), submit(cast, max_attempts=1)
    grants = {g["job_id"]: g["attempt"] for g in run.claim(3)}
    ok(run.ack(running, grants[running]))
    ok(run.ack(last_try, grants[last_try]))
    ok(cancel(cast, running, cast.owner[1]), 202)

    assert run.register(capacity=3, boot_id="boot-2").status_code == 201
    report = ok(run.reconcile([]))

    assert {accepted: "retrying", running: "cancelled", last_try: "failed"} == {
        lost["job_id"]: lost["state"] for lost in report["lost"]
    }
    assert (report["confirmed"], report["discard"]) == ([], [])
    for job_id, state in ((accepted, "retrying"), (running, "cancelled"), (last_try, "failed")):
        seen = view(cast, job_id)
        assert (state, "lost", "reconcile_lost") == (
            seen["state"],
            seen["reconcile"]["outcome"],
            seen["retry"]["last_failure"]["reason"],
        )


# -- Requirement: Credential-free user projection ---------------------------------------------


JOB_VIEW_FIELDS = {
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
    "waiting_for",
    "concurrency",
    "priority",
}


def test_authorized_user_reads_job_scheduling_status(cast: Cast) -> None:
    """Owner, server administrator and platform admin read the safe scheduling fields."""
    world, run = cast.world, cast.run.start()
    job = submit(cast, payload={"secret_ref": "vault:canary-payload"})
    attempt = run.run_to_running(job)
    ok(run.progress(job, attempt, 1, percent=50.0, message="half"))
    ok(cancel(cast, job, cast.owner[1]), 202)
    lease = run.leases[(job, attempt)]
    secrets_ = [
        lease,
        token_hash(lease),
        "canary-payload",
        run.session_id,
        signing.b64url(run.session_key),
        ADMIN_TOKEN,
        cast.owner[1],
        cast.helper[1],
    ]

    for token in (cast.owner[1], cast.helper[1], ADMIN_TOKEN):
        response = world.api("GET", f"/api/v1/jobs/{job}", token=token)
        seen = ok(response)
        assert set(seen) == JOB_VIEW_FIELDS
        assert (job, 1, 3, "running") == (
            seen["id"],
            seen["attempt"],
            seen["max_attempts"],
            seen["state"],
        )
        assert (
            seen["progress"]["percent"],
            seen["progress"]["message"],
            seen["cancel"]["requested"],
            seen["terminal"],
        ) == (50.0, "half", True, None)
        assert {"next_eligible_at", "initial_s", "multiplier", "max_s", "last_failure"} == set(
            seen["retry"]
        )
        assert {"requested", "requested_at", "result", "resolved_at"} == set(seen["cancel"])
        assert {"outcome", "at"} == set(seen["reconcile"])
        listed = world.api("GET", "/api/v1/jobs", token=token)
        assert [seen] == ok(listed)["jobs"]
        for text in (response.text, listed.text):
            assert [secret for secret in secrets_ if secret in text] == []


def test_unauthorized_user_reads_another_owners_job(cast: Cast) -> None:
    """Without access a job is forbidden, a missing one not found, and lists leave it out."""
    world = cast.world
    job = submit(cast)
    stranger = cast.stranger[1]

    reads = {
        f"/api/v1/jobs/{job}": (403, "forbidden"),
        f"/api/v1/jobs/{job}/logs": (403, "forbidden"),
        "/api/v1/jobs/job_missing": (404, "not_found"),
    }
    for path, expected in reads.items():
        assert expected == error_of(world.api("GET", path, token=stranger))
    assert error_of(world.api("GET", f"/api/v1/jobs/{job}", token=None)) == (401, "unauthenticated")
    by_server = world.api("GET", f"/api/v1/jobs?server_id={cast.server_id}", token=stranger)
    assert error_of(by_server) == (403, "forbidden")
    assert ok(world.api("GET", "/api/v1/jobs", token=stranger))["jobs"] == []
    helper_jobs = ok(world.api("GET", "/api/v1/jobs", token=cast.helper[1]))["jobs"]
    assert [job] == [j["id"] for j in helper_jobs]


def test_a_removed_server_administrator_loses_the_servers_jobs(cast: Cast) -> None:
    """After the owner removes them, a server administrator no longer sees or creates jobs."""
    world, helper = cast.world, cast.helper
    job = world.submit(cast.server_id, cast.owner[1])
    path = f"/api/v1/servers/{cast.server_id}/admins/{helper[0]}"
    removed = world.api("DELETE", path, token=cast.owner[1])
    assert (removed.status_code, removed.json()["admin_ids"]) == (200, [])
    assert world.api("GET", f"/api/v1/jobs/{job['id']}", token=helper[1]).status_code == 403
    again = world.api("DELETE", path, token=cast.owner[1])
    assert again.status_code == 200
