"""SchedulingService and Directory behaviour beyond the spec's scenarios, on every store."""

from __future__ import annotations

import re
from typing import Any

import pytest

from moonrun.errors import (
    AlreadyExists,
    Forbidden,
    InvalidRequest,
    JobNotFound,
    JoinTokenInvalid,
    MoonrunError,
    NotActive,
    NotFound,
    ReconcileRequired,
    SequenceRegression,
    SessionExpired,
    SignatureInvalid,
    TooLarge,
    Unauthenticated,
)
from moonrun.scheduling.jobs import JobState
from moonrun.scheduling.messages import Evidence
from moonrun.security.tokens import SeededTokenSource
from moonrun.service.answers import CancelOutcome
from moonrun.service.directory import Bootstrap, Directory, check_bootstrap_token
from moonrun.service.scheduling import SchedulingService
from moonrun.store.memory import MemoryStore
from tests.support.harness import World, public_key

SECOND = 1000
LEASE_FORMAT = re.compile(r"^mrl_[A-Za-z0-9_-]{43}$")


# -- enrollment and sessions -----------------------------------------------------------------


def test_join_token_is_single_use(world: World) -> None:
    """A join token works once; a second join with it is join_token_invalid."""
    enrolled = world.service.create_endpoint(world.admin, "host-c")
    assert enrolled.join_token.startswith("mrj_")
    world.service.join_endpoint(enrolled.join_token, public_key(3))
    with pytest.raises(JoinTokenInvalid):
        world.service.join_endpoint(enrolled.join_token, public_key(4))
    stored = world.store.get_endpoint(enrolled.endpoint.id)
    assert stored is not None
    assert public_key(3) == stored.identity_public_key


def test_a_join_presented_again_with_the_same_key_gets_the_same_endpoint(world: World) -> None:
    """The join's answer was lost: the same token and key again, within the replay window,
    is the same join (even past the token's own lifetime); nothing about the endpoint moves."""
    enrolled = world.service.create_endpoint(world.admin, "host-c")
    world.clock.advance(round(world.settings.join_token_ttl_s * SECOND) - SECOND)
    joined = world.service.join_endpoint(enrolled.join_token, public_key(3))
    world.clock.advance(round(world.settings.join_replay_s * SECOND) - 1)

    again = world.service.join_endpoint(enrolled.join_token, public_key(3) + "=")

    assert again == joined == world.store.get_endpoint(enrolled.endpoint.id)


def test_a_join_replayed_with_another_key_or_too_late_is_refused(world: World) -> None:
    """Another key never takes over a joined endpoint; the same key is refused once the
    replay window has passed."""
    enrolled = world.service.create_endpoint(world.admin, "host-c")
    world.service.join_endpoint(enrolled.join_token, public_key(3))
    with pytest.raises(JoinTokenInvalid):
        world.service.join_endpoint(enrolled.join_token, public_key(4))
    world.clock.advance(round(world.settings.join_replay_s * SECOND))
    with pytest.raises(JoinTokenInvalid):
        world.service.join_endpoint(enrolled.join_token, public_key(3))
    stored = world.store.get_endpoint(enrolled.endpoint.id)
    assert stored is not None
    assert public_key(3) == stored.identity_public_key


def test_join_token_expires(world: World) -> None:
    """A join token older than its lifetime is refused."""
    enrolled = world.service.create_endpoint(world.admin, "host-c")
    world.clock.advance(round(world.settings.join_token_ttl_s * SECOND))
    with pytest.raises(JoinTokenInvalid):
        world.service.join_endpoint(enrolled.join_token, public_key(3))


def test_only_platform_admins_create_endpoints(world: World) -> None:
    """Owners cannot enroll hosts."""
    with pytest.raises(Forbidden):
        world.service.create_endpoint(world.owner, "host-c")


def test_endpoint_names_are_unique_and_checked(world: World) -> None:
    """A duplicate or malformed name is a typed error and creates nothing."""
    with pytest.raises(AlreadyExists):
        world.service.create_endpoint(world.admin, "host-a")
    with pytest.raises(InvalidRequest):
        world.service.create_endpoint(world.admin, "bad name!")
    assert len(world.store.list_endpoints()) == 2


def test_join_rejects_a_key_that_is_not_32_bytes(world: World) -> None:
    """The identity key must be 32 raw bytes in base64url, padded or not."""
    enrolled = world.service.create_endpoint(world.admin, "host-c")
    for bad in ("", "not base64!", public_key(1)[:20]):
        with pytest.raises(InvalidRequest):
            world.service.join_endpoint(enrolled.join_token, bad)
    world.service.join_endpoint(enrolled.join_token, public_key(5) + "=")


def test_registration_increments_generation_and_rotates_older_sessions(world: World) -> None:
    """Each registration is generation + 1 and only the newest session is accepted."""
    run = world.run()
    generations = [run.register(boot_id=f"boot-{n}") for n in range(3)]
    assert generations == [1, 2, 3]
    endpoint = world.store.get_endpoint(world.endpoint.id)
    assert endpoint is not None
    assert (3, run.session_id) == (endpoint.generation, endpoint.current_session_id)


def test_registration_of_an_unknown_or_unjoined_endpoint_is_refused(world: World) -> None:
    """Only joined endpoints may register sessions."""
    enrolled = world.service.create_endpoint(world.admin, "host-c")
    for endpoint_id in ("ep_unknown", enrolled.endpoint.id):
        with pytest.raises(SignatureInvalid):
            world.service.register_session(endpoint_id, boot_id="b", run_version="1.0", capacity=1)


@pytest.mark.parametrize(
    ("field", "value"),
    [("capacity", 0), ("capacity", 5000), ("boot_id", ""), ("run_version", "v 1")],
)
def test_registration_validates_its_fields(world: World, field: str, value: Any) -> None:
    """Bad registration input is invalid_request and leaves the generation alone."""
    fields: dict[str, Any] = {"boot_id": "b", "run_version": "1.0", "capacity": 1}
    fields[field] = value
    with pytest.raises(InvalidRequest):
        world.service.register_session(world.endpoint.id, **fields)
    endpoint = world.store.get_endpoint(world.endpoint.id)
    assert endpoint is not None
    assert endpoint.generation == 0


def test_activity_keeps_a_session_alive(world: World) -> None:
    """A session expires session_ttl after its last request, not after its registration."""
    run = world.run().start()
    for _ in range(5):
        world.clock.advance(world.settings.session_ttl_ms - SECOND)
        run.heartbeat()
    world.clock.advance(world.settings.session_ttl_ms)
    with pytest.raises(SessionExpired):
        run.heartbeat()


def test_endpoint_views_show_the_current_session(world: World) -> None:
    """Platform admins see online state, generation, capacity and version; nothing secret."""
    run = world.run().start(capacity=3)
    views = {v["name"]: v for v in world.service.endpoint_views(world.admin)}
    assert (
        views["host-a"]["online"],
        views["host-a"]["generation"],
        views["host-a"]["capacity"],
        views["host-a"]["run_version"],
    ) == (True, 1, 3, "0.1.0")
    assert views["host-b"]["online"] is False
    assert run.session_id not in repr(views)
    with pytest.raises(Forbidden):
        world.service.endpoint_views(world.owner)


# -- claims ----------------------------------------------------------------------------------


def test_claim_requires_reconcile_after_registration(world: World) -> None:
    """Run must reconcile (even an empty journal) before its first claim."""
    world.submit()
    run = world.run()
    run.register()
    with pytest.raises(ReconcileRequired):
        run.claim()
    world.service.reconcile(run.session_id, [])
    assert len(run.claim()) == 1


def test_claim_respects_capacity_and_max_jobs(world: World) -> None:
    """A claim returns at most max_jobs and at most capacity minus active jobs."""
    for _ in range(5):
        world.submit()
    run = world.run().start(capacity=3)
    assert len(run.claim(2)) == 2
    assert len(run.claim(4)) == 1
    assert len(run.claim(4)) == 0


def test_claim_hands_out_oldest_eligible_first(world: World) -> None:
    """Eligible jobs come oldest eligible_at first; later ones wait."""
    late = world.submit(not_before=world.clock.now() + 5 * SECOND)
    first, second = world.submit(), world.submit()
    run = world.run().start(capacity=10)
    assert [first.id, second.id] == [c.job_id for c in run.claim(10)]
    world.clock.advance(5 * SECOND)
    assert [late.id] == [c.job_id for c in run.claim(10)]


def test_successive_claims_let_owners_take_turns(world: World) -> None:
    """Each claim starts after the owner that the endpoint's previous claim served last: the
    owner's five jobs (queued first) and the stranger's two, claimed one at a time, alternate
    until the stranger's run out, each owner's oldest first; every grant names its owner."""
    theirs = world.directory.create_server(
        world.admin, "web-2", endpoint_id=world.endpoint.id, owner_id=world.stranger.id
    )
    mine = [world.submit() for _ in range(5)]
    others = [world.submit(server=theirs, actor=world.stranger) for _ in range(2)]
    run = world.run().start(capacity=10)
    granted = [job for _ in range(5) for job in run.claim(1)]
    first, second = sorted([world.owner.id, world.stranger.id])
    assert [first, second, first, second, world.owner.id] == [job.owner_id for job in granted]
    assert [job.id for job in mine[:3]] == [
        j.job_id for j in granted if j.owner_id == world.owner.id
    ]
    assert [job.id for job in others] == [
        j.job_id for j in granted if j.owner_id == world.stranger.id
    ]


def test_claim_returns_only_the_endpoints_jobs(world: World) -> None:
    """A Run never receives another endpoint's jobs."""
    world.submit(server=world.other_server, actor=world.stranger)
    assert world.run().start().claim(4) == []


def test_expired_active_jobs_free_capacity(world: World) -> None:
    """An attempt whose deadline passed stops counting against capacity at the next claim."""
    stuck = world.submit()
    waiting = world.submit()
    run = world.run().start(capacity=1)
    run.claim()
    world.clock.advance(world.settings.ack_timeout_ms)
    run.heartbeat()
    assert [waiting.id] == [c.job_id for c in run.claim()]
    assert world.job(stuck.id).state == JobState.RETRYING


def test_lease_tokens_are_typed_random_and_only_hashed_at_rest(world: World) -> None:
    """Leases are mrl_ + 43 base64url characters, all different, and never stored raw."""
    for _ in range(4):
        world.submit()
    grants = world.run().start(capacity=4).claim(4)
    leases = [g.lease for g in grants]
    assert all(LEASE_FORMAT.match(lease) for lease in leases)
    assert len(set(leases)) == 4
    stored = repr([world.store.get_job(g.job_id) for g in grants])
    assert not any(lease[4:] in stored for lease in leases)


# -- job messages ----------------------------------------------------------------------------


def test_message_for_an_unknown_job_is_job_not_found(world: World) -> None:
    """The first check is whether the job exists at all."""
    run = world.run().start()
    with pytest.raises(JobNotFound) as missing:
        world.service.ack(run.session_id, "job_missing", Evidence(1, "mrl_x"))
    assert (missing.value.status, missing.value.code) == (404, "job_not_found")


def test_ack_is_idempotent_for_the_same_attempt(world: World) -> None:
    """A repeated ack answers as before and changes nothing."""
    job = world.submit()
    run = world.run().start()
    (granted,) = run.claim()
    first = run.ack(job.id, granted.attempt)
    stored = world.job(job.id)
    world.clock.advance(SECOND)
    assert first == run.ack(job.id, granted.attempt)
    assert stored == world.job(job.id)


def test_progress_before_ack_is_not_active(world: World) -> None:
    """Progress and result need the ack first; cancel-poll does not."""
    job = world.submit()
    run = world.run().start()
    (granted,) = run.claim()
    with pytest.raises(NotActive):
        run.progress(job.id, granted.attempt, 1)
    with pytest.raises(NotActive):
        run.result(job.id, granted.attempt, "succeeded")
    assert run.cancel_poll(job.id, granted.attempt).cancel_requested is False


def test_progress_sequence_repeats_and_regressions(world: World) -> None:
    """A repeated seq answers as before; a lower seq is sequence_regression."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    first = run.progress(job.id, attempt, 5, percent=50.0, message="half")
    stored = world.job(job.id)
    world.clock.advance(SECOND)
    assert first == run.progress(job.id, attempt, 5, percent=60.0)
    assert stored == world.job(job.id)
    with pytest.raises(SequenceRegression):
        run.progress(job.id, attempt, 4)
    assert stored == world.job(job.id)


@pytest.mark.parametrize(
    "fields",
    [
        {"seq": -1},
        {"seq": 1, "percent": 101},
        {"seq": 1, "percent": -0.5},
        {"seq": 1, "message": "x" * 5000},
        {"seq": True},
    ],
)
def test_bad_progress_is_invalid_request_and_changes_nothing(
    world: World, fields: dict[str, Any]
) -> None:
    """Malformed progress is a typed error with no state change."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    before = world.job(job.id)
    with pytest.raises(InvalidRequest):
        world.service.progress(run.session_id, job.id, run.evidence(job.id, attempt), **fields)
    assert before == world.job(job.id)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"outcome": "done", "retryable": False}, InvalidRequest),
        ({"outcome": "failed", "retryable": "yes"}, InvalidRequest),
        ({"outcome": "failed", "retryable": True, "error": {"code": "X Y"}}, InvalidRequest),
        ({"outcome": "succeeded", "retryable": False, "output": float("nan")}, InvalidRequest),
        ({"outcome": "succeeded", "retryable": False, "output": "x" * 70_000}, TooLarge),
    ],
)
def test_bad_results_are_typed_errors_and_change_nothing(
    world: World, fields: dict[str, Any], error: type[MoonrunError]
) -> None:
    """Malformed results are refused before anything is stored."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    before = world.job(job.id)
    with pytest.raises(error):
        world.service.result(run.session_id, job.id, run.evidence(job.id, attempt), **fields)
    assert before == world.job(job.id)


def test_reconcile_rejects_duplicate_entries(world: World) -> None:
    """A journal listing a job twice is invalid_request and decides nothing."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    before = world.job(job.id)
    entry = run.entry(job.id, attempt)
    with pytest.raises(InvalidRequest):
        world.service.reconcile(run.session_id, [entry, entry])
    assert before == world.job(job.id)


def test_reconcile_of_an_expired_attempt_discards_it(world: World) -> None:
    """An attempt whose lease already passed is not revived by reconcile."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    world.clock.advance(world.settings.lease_ttl_ms)
    run.register(boot_id="boot-2")
    report = world.service.reconcile(run.session_id, [run.entry(job.id, attempt)])
    assert (
        list(report.confirmed),
        [d.reason.value for d in report.discard],
    ) == ([], ["not_active"])
    assert world.job(job.id).state == JobState.RETRYING


def test_a_replayed_reconciliation_loses_no_attempt_claimed_since(world: World) -> None:
    """A copy of a session's empty reconciliation applied again after the session claimed a
    job (another platform instance, or one restarted, had not seen its nonce) loses nothing:
    the job stays running under its lease, and its reconcile mark stays unset."""
    job = world.submit()
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    report = world.service.reconcile(run.session_id, [])
    stored = world.job(job.id)
    assert (list(report.lost), stored.state, stored.attempt) == ([], JobState.RUNNING, attempt)
    assert stored.reconcile is None


# -- sweeper ---------------------------------------------------------------------------------


def test_sweep_applies_passed_deadlines_in_bounded_batches(world: World) -> None:
    """A sweep handles at most its batch; repeated sweeps finish the rest."""
    for _ in range(5):
        world.submit()
    run = world.run().start(capacity=5)
    run.claim(5)
    world.clock.advance(world.settings.ack_timeout_ms)
    assert [world.service.sweep(limit=2) for _ in range(4)] == [2, 2, 1, 0]


def test_a_second_service_over_the_same_store_sees_the_same_state(world: World) -> None:
    """Two service instances over one store interleave as if they were one."""
    twin = SchedulingService(world.store, world.clock, SeededTokenSource(99), world.settings)
    job = world.submit()
    run = world.run().start()
    (granted,) = run.claim()
    twin.ack(run.session_id, job.id, run.evidence(job.id, granted.attempt))
    run.progress(job.id, granted.attempt, 1)
    answer = twin.result(
        run.session_id,
        job.id,
        run.evidence(job.id, granted.attempt),
        outcome="succeeded",
        retryable=False,
    )
    replay = run.result(job.id, granted.attempt, "succeeded")
    assert (False, True, answer.fingerprint) == (
        answer.replayed,
        replay.replayed,
        replay.fingerprint,
    )


# -- users, servers, jobs --------------------------------------------------------------------


def test_api_tokens_authenticate_their_user(world: World) -> None:
    """A user's token maps back to the user; anything else is unauthenticated."""
    created = world.directory.create_user(world.admin, "carol")
    assert created.api_token.startswith("mra_")
    assert created.user == world.directory.authenticate(created.api_token)
    for bad in (None, "", "mra_nope"):
        with pytest.raises(Unauthenticated):
            world.directory.authenticate(bad)


def test_bootstrap_admin_is_created_once(world: World) -> None:
    """Starting twice with the same bootstrap token keeps one admin."""
    again = world.directory.ensure_bootstrap_admin("mra_bootstrap-admin-token")
    assert world.admin == again
    assert sum(1 for user in world.store.list_users() if user.name == "admin") == 1


ROTATED_TOKEN = "mra_" + "r" * 43


def test_another_bootstrap_token_rotates_the_admins_token(world: World) -> None:
    """A different bootstrap token replaces the admin's token: the old one stops working."""
    admin, outcome = world.directory.bootstrap_admin(ROTATED_TOKEN)
    assert (admin.id, outcome) == (world.admin.id, Bootstrap.ROTATED)
    assert world.directory.authenticate(ROTATED_TOKEN) == admin
    with pytest.raises(Unauthenticated):
        world.directory.authenticate("mra_bootstrap-admin-token")


def test_the_same_bootstrap_token_again_changes_nothing(world: World) -> None:
    """Bootstrapping with the token the admin already holds leaves it as it was."""
    admin, outcome = world.directory.bootstrap_admin("mra_bootstrap-admin-token")
    assert (admin, outcome) == (world.admin, Bootstrap.UNCHANGED)
    assert world.directory.authenticate("mra_bootstrap-admin-token") == world.admin


def test_bootstrap_with_a_password_lets_the_admin_sign_in(world: World) -> None:
    """A bootstrap password is set on the admin, who can then sign in with it."""
    world.directory.bootstrap_admin(ROTATED_TOKEN, password="correct horse")
    signed_in = world.directory.sign_in("admin", "correct horse")
    assert (signed_in.id if signed_in else None) == world.admin.id


def test_bootstrap_refuses_a_name_that_is_not_a_platform_admin(world: World) -> None:
    """Bootstrapping a name held by an ordinary user is refused and changes nothing."""
    world.directory.create_user(world.admin, "dora")
    with pytest.raises(InvalidRequest):
        world.directory.bootstrap_admin(ROTATED_TOKEN, name="dora")
    with pytest.raises(Unauthenticated):
        world.directory.authenticate(ROTATED_TOKEN)


def test_a_new_store_has_no_platform_admin_until_bootstrap(world: World) -> None:
    """`has_platform_admin` is false on an empty store and true once an admin exists."""
    empty = Directory(MemoryStore(), world.clock, world.tokens)
    assert (empty.has_platform_admin(), world.directory.has_platform_admin()) == (False, True)


@pytest.mark.parametrize(
    ("token", "accepted"),
    [("x", False), ("mra_" + "a" * 31, False), ("a" * 32, True), ("mra_" + "a" * 32, True)],
)
def test_bootstrap_tokens_need_32_characters_after_the_prefix(token: str, accepted: bool) -> None:
    """Tokens shorter than 32 characters after an optional `mra_` are refused."""
    try:
        check_bootstrap_token(token)
    except InvalidRequest:
        refused = True
    else:
        refused = False
    assert (not refused) == accepted


def test_only_owner_or_platform_admin_adds_server_admins(world: World) -> None:
    """Server administrators cannot appoint further administrators; owners can."""
    with pytest.raises(Forbidden):
        world.directory.add_server_admin(world.helper, world.server.id, world.stranger.id)
    with pytest.raises(NotFound):
        world.directory.add_server_admin(world.owner, world.server.id, "usr_missing")
    server = world.directory.add_server_admin(world.owner, world.server.id, world.helper.id)
    assert (world.helper.id,) == server.admin_ids


def test_create_job_checks_access_and_input(world: World) -> None:
    """Only those who manage the server may queue jobs, and only well-formed ones."""
    with pytest.raises(Forbidden):
        world.submit(actor=world.stranger)
    with pytest.raises(NotFound):
        world.service.create_job(world.owner, "srv_missing", kind="noop")
    bad: list[dict[str, Any]] = [
        {"kind": "Bad Kind"},
        {"kind": "noop", "payload": [1, 2]},
        {"kind": "noop", "max_attempts": 0},
        {"kind": "noop", "backoff": {"initial_s": -1}},
        {"kind": "noop", "backoff": {"jitter": 0.5}},
    ]
    for fields in bad:
        with pytest.raises(InvalidRequest):
            world.service.create_job(world.owner, world.server.id, **fields)
    with pytest.raises(TooLarge):
        world.service.create_job(
            world.owner, world.server.id, kind="noop", payload={"x": "y" * 70_000}
        )
    assert list(world.service.list_jobs(world.admin).jobs) == []


def test_job_listing_pages_newest_first(world: World) -> None:
    """Listings go newest first, filter by state, and page with an opaque cursor."""
    ids = [world.submit().id for _ in range(5)]
    seen: list[str] = []
    cursor = None
    while True:
        page = world.service.list_jobs(world.owner, limit=2, cursor=cursor)
        seen.extend(job.id for job in page.jobs)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert list(reversed(ids)) == seen
    world.service.cancel_job(world.owner, ids[0])
    assert [ids[0]] == [j.id for j in world.service.list_jobs(world.owner, state="cancelled").jobs]
    for bad in ({"state": "exploded"}, {"limit": 0}, {"cursor": "%%%"}):
        with pytest.raises(InvalidRequest):
            world.service.list_jobs(world.owner, **bad)


# -- cancelling several jobs at once ---------------------------------------------------------


def answered(outcome: CancelOutcome | MoonrunError) -> tuple[Any, ...]:
    """What a cancel answers, as a comparable value: the refusal, or the outcome."""
    if isinstance(outcome, MoonrunError):
        return (type(outcome), outcome.status, outcome.code, outcome.message)
    return (outcome.job.state, outcome.waits_on_run, outcome.had_ended)


def test_cancel_jobs_answers_each_job_as_its_own_cancel_would(world: World) -> None:
    """In one call: a queued job ends cancelled, a running one gets an intent that waits on
    Run, an ended one is left alone; each answered in the order asked, as alone."""
    run = world.run().start()
    running = world.submit()
    run.run_to_running(running.id)
    queued, ended = world.submit(), world.submit()
    world.service.cancel_job(world.owner, ended.id)
    before = world.job(ended.id)

    outcomes = world.service.cancel_jobs(world.helper, [queued.id, running.id, ended.id])

    expected = [
        (JobState.CANCELLED, False, False),
        (JobState.RUNNING, True, False),
        (JobState.CANCELLED, False, True),
    ]
    assert expected == [answered(outcome) for outcome in outcomes]
    stored = [world.job(job.id) for job in (queued, running, ended)]
    assert [outcome.job for outcome in outcomes if not isinstance(outcome, MoonrunError)] == stored
    assert stored[1].cancel is not None
    assert stored[1].cancel.requested_by == world.helper.id
    assert before == stored[2]
    again = [world.service.cancel_job(world.helper, job.id) for job in (queued, running, ended)]
    assert [(JobState.CANCELLED, False, True), expected[1], expected[2]] == [
        answered(outcome) for outcome in again
    ]


def test_cancel_jobs_refuses_another_owners_job_in_its_entry_as_a_single_cancel_would(
    world: World,
) -> None:
    """A job of a server the caller may not manage is its entry's 403, a missing one its 404,
    each exactly the refusal a cancel of it alone gets (so an entry tells no more about
    another owner's job); the caller's own job beside them is cancelled, the other one not."""
    mine = world.submit()
    theirs = world.submit(world.other_server, world.stranger)
    before = world.job(theirs.id)

    outcomes = world.service.cancel_jobs(world.owner, [theirs.id, mine.id, "job_missing"])

    alone = []
    for job_id in (theirs.id, "job_missing"):
        with pytest.raises(MoonrunError) as refused:
            world.service.cancel_job(world.owner, job_id)
        alone.append(answered(refused.value))
    assert [alone[0], (JobState.CANCELLED, False, False), alone[1]] == [
        answered(outcome) for outcome in outcomes
    ]
    assert [(Forbidden, 403, "forbidden"), (NotFound, 404, "not_found")] == [a[:3] for a in alone]
    assert before == world.job(theirs.id)
    assert [
        answered(outcome) for outcome in world.service.cancel_jobs(world.stranger, [theirs.id])
    ] == [(JobState.CANCELLED, False, False)]


@pytest.mark.parametrize("count", [0, 1001])
def test_cancel_jobs_takes_1_to_1000_jobs(world: World, count: int) -> None:
    """Nothing, or more than 1,000 jobs, is `invalid_request` for the whole call: no job is
    cancelled."""
    job = world.submit()
    with pytest.raises(InvalidRequest):
        world.service.cancel_jobs(world.owner, [job.id, *(f"job_{n}" for n in range(1000))][:count])
    assert world.job(job.id).state == JobState.QUEUED


def test_cancel_jobs_takes_1000_jobs_and_each_job_once(world: World) -> None:
    """1,000 jobs are answered one by one; a job named twice is `invalid_request` for the whole
    call."""
    job = world.submit()
    outcomes = world.service.cancel_jobs(world.owner, [job.id] + [f"job_{n}" for n in range(999)])
    assert len(outcomes) == 1000
    assert {NotFound} == {type(outcome) for outcome in outcomes[1:]}
    other = world.submit()
    with pytest.raises(InvalidRequest):
        world.service.cancel_jobs(world.owner, [other.id, other.id])
    assert (
        world.job(job.id).state,
        world.job(other.id).state,
    ) == (JobState.CANCELLED, JobState.QUEUED)
