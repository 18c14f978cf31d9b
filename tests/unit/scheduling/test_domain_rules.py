"""The domain's refusals say why, to the word, at their exact bounds; and every transition
stamps what changed and clears what belongs to the attempt before (`moonrun.scheduling`).

What a user or a Run reads in a 422 is API; a bound that moved by one is a changed contract.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from moonrun.errors import (
    MoonrunError,
    NotActive,
    SequenceRegression,
    StaleAttempt,
    TerminalConflict,
)
from moonrun.scheduling import jobs, messages, reconcile
from moonrun.scheduling.fingerprint import canonical_json, compact_json, token_hash
from moonrun.scheduling.jobs import (
    NOT_BEFORE_HORIZON_MS,
    CancelResult,
    Event,
    FailureReason,
    Job,
    JobState,
    RunResult,
    create_job,
)
from moonrun.scheduling.messages import Caller, Evidence
from moonrun.scheduling.retry import RetryPolicy
from moonrun.scheduling.time import parse_instant
from moonrun.scheduling.views import job_view

NOW = 1_795_000_000_000
POLICY = RetryPolicy(max_attempts=3, initial_s=1, multiplier=2, max_s=60)
LEASE = "mrl_lease"
CALLER = Caller("ep_1", 1)
EVIDENCE = Evidence(1, LEASE)


def refusal(call: Callable[[], Any]) -> tuple[str, str]:
    """The error type's name and message that `call` raises."""
    try:
        call()
    except (MoonrunError, TypeError) as error:
        return type(error).__name__, str(error)
    raise AssertionError("accepted")


def new_job(**fields: Any) -> Job:
    arguments: dict[str, Any] = {
        "job_id": "job_1",
        "server_id": "srv_1",
        "endpoint_id": "ep_1",
        "owner_id": "usr_1",
        "kind": "noop",
        "payload": {},
        "policy": POLICY,
        "now": NOW,
    }
    return create_job(**(arguments | fields))


def nested(levels: int) -> dict[str, Any]:
    """An object `levels` containers deep."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


# -- what a user may submit ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"kind": "Noop"}, ("InvalidRequest", "kind must match ^[a-z][a-z0-9_.-]{0,63}$")),
        ({"payload": [1]}, ("InvalidRequest", "payload must be a JSON object")),
        (
            {"payload": {"a": "x" * 70_000}},
            ("TooLarge", "payload is 70008 bytes as JSON; the limit is 65536"),
        ),
        (
            {"payload": {"a": math.nan}},
            (
                "InvalidRequest",
                "payload is not representable as JSON: Out of range float values are not JSON "
                "compliant",
            ),
        ),
        (
            {"payload": {"a": "\ud800"}},
            ("InvalidRequest", "payload holds a lone surrogate, which is not Unicode"),
        ),
        (
            {"payload": nested(33)},
            ("InvalidRequest", "payload nests deeper than 32 levels (depth limit)"),
        ),
        (
            {"payload": {"a": list(range(10_000))}},
            ("InvalidRequest", "payload holds more than 10000 keys and items (member limit)"),
        ),
        (
            {"not_before": -1},
            ("InvalidRequest", "not_before must be from 1970 to one year from now"),
        ),
        (
            {"not_before": NOW + NOT_BEFORE_HORIZON_MS + 1},
            ("InvalidRequest", "not_before must be from 1970 to one year from now"),
        ),
    ],
    ids=[
        "kind",
        "payload type",
        "payload size",
        "nan",
        "surrogate",
        "depth",
        "members",
        "1969",
        "too late",
    ],
)
def test_a_job_that_cannot_be_created_says_why(fields: dict[str, Any], expected: Any) -> None:
    """Kind, payload type, size, JSON-ness, shape and not_before: each its own words."""
    assert refusal(lambda: new_job(**fields)) == expected


def test_the_bounds_of_a_job_are_inclusive() -> None:
    """32 levels, 9,999 items and one key (10,000 members), 1970-01-01 and a year from now
    all pass; the stored payload keeps its characters as they are (not \\u escapes)."""
    accepted = [
        new_job(payload=nested(32)),
        new_job(payload={"a": list(range(9_999))}),
        new_job(not_before=0),
        new_job(not_before=NOW + NOT_BEFORE_HORIZON_MS),
    ]
    unicode = new_job(payload={"é": "ü"})
    eligible = [job.eligible_at for job in accepted[2:]]
    assert (eligible, unicode.payload_json) == ([NOW, NOW + NOT_BEFORE_HORIZON_MS], '{"é":"ü"}')


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (("done", False), "outcome must be one of succeeded, failed, cancelled"),
        (("failed", 1), "retryable must be a boolean"),
        (("failed", False, "boom"), "error must be an object with code and message"),
        (
            ("failed", False, {"code": "Bad", "message": "m"}),
            "error.code must match ^[a-z][a-z0-9_.-]{0,63}$",
        ),
        (
            ("failed", False, {"code": "x", "message": 3}),
            "error.message must be a string of at most 4096 characters",
        ),
        (
            ("failed", False, {"code": "x", "message": "m" * 4097}),
            "error.message must be a string of at most 4096 characters",
        ),
    ],
    ids=["outcome", "retryable", "error type", "code", "message type", "message length"],
)
def test_a_result_that_does_not_validate_says_why(result: tuple[Any, ...], expected: str) -> None:
    """Each field of a reported result, checked in order."""
    assert refusal(lambda: RunResult.of(*result)) == ("InvalidRequest", expected)


def test_a_result_keeps_its_output_and_a_message_of_exactly_the_limit() -> None:
    """4096 characters of message pass; output is stored compact; too much output is 413."""
    fine = RunResult.of("failed", False, {"code": "x", "message": "m" * 4096}, {"b": 1, "a": 2})
    bare = RunResult.of("succeeded", False)
    too_large = refusal(lambda: RunResult.of("succeeded", False, None, {"a": "x" * 70_000}))
    assert (fine.output_json, bare.output_json) == ('{"a":2,"b":1}', None)
    assert too_large == ("TooLarge", "output is 70008 bytes as JSON; the limit is 65536")


@pytest.mark.parametrize(
    ("seq", "percent", "message", "expected"),
    [
        (True, None, None, "seq must be a non-negative integer"),
        (-1, None, None, "seq must be a non-negative integer"),
        (2**53, None, None, "seq must be a non-negative integer"),
        (0, -0.5, None, "percent must be a number from 0 to 100"),
        (0, 100.5, None, "percent must be a number from 0 to 100"),
        (0, True, None, "percent must be a number from 0 to 100"),
        (0, None, "m" * 4097, "message must be a string of at most 4096 characters"),
        (0, None, 3, "message must be a string of at most 4096 characters"),
    ],
)
def test_progress_that_does_not_validate_says_why(
    seq: Any, percent: Any, message: Any, expected: str
) -> None:
    """seq from 0 to 2^53-1, percent from 0 to 100, a message of at most 4096 characters."""
    check = messages._check_progress
    assert refusal(lambda: check(seq, percent, message)) == ("InvalidRequest", expected)


def test_progress_bounds_are_inclusive() -> None:
    """seq 2^53-1, percent 0 and 100, a 4096-character message: all accepted."""
    for seq, percent, message in ((2**53 - 1, 0, None), (0, 100, "m" * 4096), (0, 0.0, "")):
        messages._check_progress(seq, percent, message)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ((0, 1, 2, 3), "max_attempts must be an integer from 1 to 1000"),
        ((1001, 1, 2, 3), "max_attempts must be an integer from 1 to 1000"),
        ((1, -1, 2, 3), "initial_s must be a number from 0 to 604800"),
        ((1, 1, 0.5, 3), "multiplier must be a number from 1 to 100"),
        ((1, 1, 2, math.inf), "max_s must be a number from 0 to 604800"),
        ((1, 1, 2, 3, 1.5), "jitter must be a number from 0 to 1"),
    ],
)
def test_a_retry_policy_out_of_bounds_names_its_field(
    policy: tuple[Any, ...], expected: str
) -> None:
    """Each field of a retry policy, with the bounds it must lie within."""
    assert refusal(lambda: RetryPolicy(*policy)) == ("InvalidRequest", expected)


def test_a_backoff_is_asked_for_real_attempts_and_draws() -> None:
    """Attempt 0 and a draw of 1 (or below 0) are refusals that say what was given."""
    found = [
        refusal(lambda: POLICY.backoff_s(0)),
        refusal(lambda: POLICY.backoff_ms(1, 1.0)),
        refusal(lambda: POLICY.backoff_ms(1, -0.1)),
    ]
    assert [message for _, message in found] == [
        "attempt must be >= 1, got 0",
        "jitter draw must be in [0, 1), got 1.0",
        "jitter draw must be in [0, 1), got -0.1",
    ]


def test_json_limits_are_inclusive_and_their_refusals_say_so() -> None:
    """A value of exactly the limit passes, one byte more is 413 naming both numbers."""
    found = [
        compact_json("abc", field="f", limit=5),
        canonical_json("abc", field="f", limit=5),
        refusal(lambda: compact_json("abc", field="f", limit=4)),
        refusal(lambda: canonical_json("abc", field="f", limit=4)),
        refusal(lambda: canonical_json({"a": math.nan}, field="f", limit=100)),
    ]
    assert found == [
        '"abc"',
        b'"abc"',
        ("TooLarge", "f is 5 bytes as JSON; the limit is 4"),
        ("TooLarge", "f is 5 bytes canonical; the limit is 4"),
        (
            "InvalidRequest",
            "f is not representable as canonical JSON: nan is not representable in JCS",
        ),
    ]


def test_a_token_with_a_lone_surrogate_still_hashes() -> None:
    """Whatever string a client sends as a lease, it hashes (and then simply does not match)."""
    assert len(token_hash("mrl_\ud800")) == 64


# -- the records each transition leaves -----------------------------------------------------------


def claimed(job: Job | None = None, now: int = NOW) -> Job:
    return jobs.claim(
        job or new_job(), now=now, lease_hash=token_hash(LEASE), generation=1, ack_timeout_ms=30_000
    )


def running(now: int = NOW) -> Job:
    decision = messages.ack(claimed(), CALLER, EVIDENCE, now=now, lease_ttl_ms=40_000, draw=0.0)
    return decision.job


def test_every_transition_stamps_the_time_it_happened() -> None:
    """claim, ack, progress, result, retry and failure: updated_at is when each happened."""
    acked = messages.ack(claimed(), CALLER, EVIDENCE, now=NOW + 1, lease_ttl_ms=40_000, draw=0.0)
    renewed = messages.progress(
        acked.job,
        CALLER,
        EVIDENCE,
        seq=1,
        percent=None,
        message=None,
        now=NOW + 2,
        lease_ttl_ms=40_000,
        draw=0.0,
    )
    failure = RunResult.of("failed", True, {"code": "x", "message": "y"})
    retried = messages.result(renewed.job, CALLER, EVIDENCE, failure, now=NOW + 3, draw=0.0)
    fatal = RunResult.of("failed", False, {"code": "x", "message": "y"})
    failed = messages.result(running(), CALLER, EVIDENCE, fatal, now=NOW + 4, draw=0.0)
    stamps = [
        claimed().updated_at,
        acked.job.updated_at,
        renewed.job.updated_at,
        retried.job.updated_at,
        failed.job.updated_at,
        failed.job.result.at if failed.job.result else None,
        renewed.job.progress.at if renewed.job.progress else None,
    ]
    assert stamps == [NOW, NOW + 1, NOW + 2, NOW + 3, NOW + 4, NOW + 4, NOW + 2]
    assert (retried.job.state, failed.job.state) == (JobState.RETRYING, JobState.FAILED)


def test_a_new_claim_starts_its_attempt_afresh() -> None:
    """Progress, result, reconcile mark and lease expiry of the attempt before are cleared."""
    failure = RunResult.of("failed", True, {"code": "x", "message": "y"})
    previous = messages.progress(
        running(),
        CALLER,
        EVIDENCE,
        seq=3,
        percent=50,
        message="half",
        now=NOW,
        lease_ttl_ms=40_000,
        draw=0.0,
    ).job
    ended = messages.result(previous, CALLER, EVIDENCE, failure, now=NOW, draw=0.0).job
    marked = replace(ended, reconcile=jobs.ReconcileMark(jobs.ReconcileOutcome.CONFIRMED, NOW, 1))
    again = claimed(marked, now=ended.eligible_at)
    fresh = (again.attempt, again.progress, again.result, again.reconcile, again.lease_expires_at)
    assert fresh == (2, None, None, None, None)
    assert (again.claimed_at, again.ack_deadline) == (ended.eligible_at, ended.eligible_at + 30_000)


def test_a_finished_job_holds_no_lease_expiry_and_its_view_no_error() -> None:
    """Succeeded: no lease expiry left; its view's terminal error is null."""
    done = messages.result(
        running(), CALLER, EVIDENCE, RunResult.of("succeeded", False), now=NOW, draw=0.0
    )
    view = job_view(done.job)
    assert (done.job.lease_expires_at, view["terminal"]["error"]) == (None, None)
    assert view["terminal"]["outcome"] == "succeeded"


def test_an_ack_says_whether_a_cancel_was_requested_the_first_time_and_again() -> None:
    """The ack answer's cancel_requested, on the ack that starts the attempt and on a repeat."""
    intent = jobs.request_cancel(claimed(), user_id="usr_1", now=NOW)
    first = messages.ack(intent, CALLER, EVIDENCE, now=NOW, lease_ttl_ms=40_000, draw=0.0)
    again = messages.ack(first.job, CALLER, EVIDENCE, now=NOW, lease_ttl_ms=40_000, draw=0.0)
    plain = messages.ack(claimed(), CALLER, EVIDENCE, now=NOW, lease_ttl_ms=40_000, draw=0.0)
    answers = [d.answer.cancel_requested if d.answer else None for d in (first, again, plain)]
    assert answers == [True, True, False]


def test_a_deadline_or_a_loss_records_when_and_with_which_code() -> None:
    """A lapsed lease and a reconcile loss: the failure's time is now, its code the reason's."""
    lapsed = jobs.apply_due_deadline(running(), now=NOW + 40_000, draw=0.0)
    lost = reconcile.lose(running(), CALLER, now=NOW + 5, draw=0.0)
    failures = [(f.reason, f.at, f.code) for f in (lapsed.last_failure, lost.last_failure) if f]
    assert failures == [
        (FailureReason.LEASE_EXPIRED, NOW + 40_000, "lease_expired"),
        (FailureReason.RECONCILE_LOST, NOW + 5, "reconcile_lost"),
    ]


def test_only_an_active_job_with_an_open_cancel_waits_on_run() -> None:
    """Waiting on Run: a cancel intent, unresolved, on an accepted or running job; nothing else."""
    queued_cancelled = jobs.request_cancel(new_job(), user_id="usr_1", now=NOW)
    active_cancel = jobs.request_cancel(claimed(), user_id="usr_1", now=NOW)
    verdicts = [
        jobs.cancel_waits_on_run(job)
        for job in (new_job(), claimed(), active_cancel, queued_cancelled)
    ]
    assert verdicts == [False, False, True, False]
    assert queued_cancelled.cancel is not None
    assert queued_cancelled.cancel.result == CancelResult.CANCELLED


# -- refusals of Run's messages ----------------------------------------------------------------


def test_each_refusal_of_a_run_message_says_what_state_it_met() -> None:
    """not_active names the state; stale_attempt both attempts; a regression both seqs."""
    queued, active = new_job(), running()
    progressed = messages.progress(
        active,
        CALLER,
        EVIDENCE,
        seq=5,
        percent=None,
        message=None,
        now=NOW,
        lease_ttl_ms=40_000,
        draw=0.0,
    ).job
    done = RunResult.of("succeeded", False)
    lost = reconcile.lose(running(), CALLER, now=NOW, draw=0.0)
    terminal_lost = reconcile.lose(
        replace(running(), policy=replace(POLICY, max_attempts=1)), CALLER, now=NOW, draw=0.0
    )
    errors = [
        messages.ack(
            replace(queued, attempt=1, lease_hash=token_hash(LEASE)),
            CALLER,
            EVIDENCE,
            now=NOW,
            lease_ttl_ms=1,
            draw=0.0,
        ).error,
        messages.cancel_poll(
            replace(queued, attempt=1, lease_hash=token_hash(LEASE)),
            CALLER,
            EVIDENCE,
            now=NOW,
            draw=0.0,
        ).error,
        messages.progress(
            claimed(),
            CALLER,
            EVIDENCE,
            seq=1,
            percent=None,
            message=None,
            now=NOW,
            lease_ttl_ms=1,
            draw=0.0,
        ).error,
        messages.result(claimed(), CALLER, EVIDENCE, done, now=NOW, draw=0.0).error,
        messages.ack(active, CALLER, Evidence(2, LEASE), now=NOW, lease_ttl_ms=1, draw=0.0).error,
        messages.progress(
            progressed,
            CALLER,
            EVIDENCE,
            seq=4,
            percent=None,
            message=None,
            now=NOW,
            lease_ttl_ms=1,
            draw=0.0,
        ).error,
        messages.result(lost, CALLER, EVIDENCE, done, now=NOW, draw=0.0).error,
        messages.result(terminal_lost, CALLER, EVIDENCE, done, now=NOW, draw=0.0).error,
    ]
    found = [(type(error), error.message) if error else None for error in errors]
    assert found == [
        (NotActive, "the job is queued"),
        (NotActive, "the job is queued"),
        (NotActive, "the job is accepted"),
        (NotActive, "the job is accepted; ack first"),
        (StaleAttempt, "attempt 2 is not the current attempt 1"),
        (SequenceRegression, "seq 4 is below the last seq 5"),
        (NotActive, "the job is retrying"),
        (TerminalConflict, "the job ended without a result from this attempt"),
    ]


def test_a_refused_cancel_poll_leaves_the_record_as_it_was() -> None:
    """A poll for a job that is not active is refused and changes nothing."""
    queued = replace(new_job(), attempt=1, lease_hash=token_hash(LEASE))
    decision = messages.cancel_poll(queued, CALLER, EVIDENCE, now=NOW, draw=0.0)
    assert (decision.job is queued, type(decision.error)) == (True, NotActive)


def test_an_illegal_transition_names_the_event_the_states_and_the_job() -> None:
    """The one guard's refusal, and a claim of a job that is not claimable, say what."""
    found = [
        refusal(lambda: jobs.transition(new_job(), Event.ACK, JobState.RUNNING, NOW)),
        refusal(lambda: claimed(running())),
        refusal(lambda: jobs._evolve(new_job(), bogus=1)),
    ]
    assert found == [
        ("IllegalTransition", "ack does not lead from queued to running (job job_1)"),
        ("IllegalTransition", "job job_1 is not claimable"),
        ("TypeError", "Job has no fields ['bogus']"),
    ]


def test_the_depth_limit_holds_past_a_scalar_sibling() -> None:
    """A member too deep is found whatever scalars sit beside it, in any order."""
    for payload in ({"a": nested(32), "b": 1}, {"b": 1, "a": nested(32)}, {"a": [1, nested(32)]}):
        assert refusal(lambda payload=payload: new_job(payload=payload)) == (
            "InvalidRequest",
            "payload nests deeper than 32 levels (depth limit)",
        )


def test_a_timestamp_that_does_not_parse_names_its_field_never_its_value() -> None:
    """`timestamp` unless the caller names the field; the value itself is never repeated."""
    found = [
        refusal(lambda: parse_instant("yesterday")),
        refusal(lambda: parse_instant("2026-02-30T00:00:00Z", "not_before")),
    ]
    example = "must be an RFC 3339 timestamp such as 2026-11-30T04:00:00.000Z"
    assert found == [
        ("InvalidRequest", f"timestamp {example}"),
        ("InvalidRequest", f"not_before {example}"),
    ]
