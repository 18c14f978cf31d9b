"""The store contract: every store must behave like this, observed only through the Store seam.

Records are built directly with the pure dataclasses and transitions; no service is involved.
Each test opens a fresh store from the parametrized `store_factory` and closes it afterwards;
MySQLStore runs once on PyMySQL and once on mysqlclient.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import pytest

from moonrun.errors import AlreadyExists
from moonrun.scheduling.jobs import (
    AttemptSummary,
    CancelResult,
    CancelState,
    ErrorInfo,
    Event,
    Failure,
    FailureReason,
    Job,
    JobState,
    Outcome,
    Progress,
    ReconcileMark,
    ReconcileOutcome,
    RecordedResult,
    RunResult,
    Terminal,
    claim,
    create_job,
    transition,
)
from moonrun.scheduling.records import Advertisement, Endpoint, Server, Session, User
from moonrun.scheduling.retry import RetryPolicy
from moonrun.scheduling.time import Instant
from moonrun.store.protocol import IdempotencyRecord, Store
from tests.conftest import build_factory
from tests.support.stores import CONTRACT_STORE_NAMES, StoreFactory

T0: Instant = 1_795_000_000_000
"""The reference instant (ms) every test's times are relative to."""

POLICY = RetryPolicy(max_attempts=3, initial_s=1.0, multiplier=2.0, max_s=60.0, jitter=0.25)
ACK_TIMEOUT_MS = 30_000
LEASE_TTL_MS = 40_000
SESSION_TTL_MS = 50_000


# -- helpers -----------------------------------------------------------------------------------


def make_job(
    job_id: str = "job-1",
    *,
    endpoint_id: str = "ep-1",
    server_id: str = "srv-1",
    owner_id: str = "usr-1",
    created_at: Instant = T0,
    eligible_at: Instant | None = None,
) -> Job:
    """A fresh queued job, eligible at `eligible_at` (or at creation)."""
    return create_job(
        job_id=job_id,
        server_id=server_id,
        endpoint_id=endpoint_id,
        owner_id=owner_id,
        kind="report.build",
        payload={"report": job_id, "pages": [1, 2, 3]},
        policy=POLICY,
        now=created_at,
        not_before=eligible_at,
    )


def accepted(job: Job, *, at: Instant, ack_timeout_ms: int = ACK_TIMEOUT_MS) -> Job:
    """The job claimed at `at`: accepted, with an ack deadline `ack_timeout_ms` later."""
    return claim(
        job, now=at, lease_hash=f"lease-{job.id}", generation=1, ack_timeout_ms=ack_timeout_ms
    )


def running(job: Job, *, at: Instant, lease_ms: int = LEASE_TTL_MS) -> Job:
    """An accepted job acked at `at`: running, with its lease expiring `lease_ms` later."""
    return transition(
        job, Event.ACK, JobState.RUNNING, at, ack_deadline=None, lease_expires_at=at + lease_ms
    )


def retrying(job: Job, *, eligible_at: Instant) -> Job:
    """The job waiting for another attempt from `eligible_at` (a new version of the record)."""
    return replace(
        job,
        state=JobState.RETRYING,
        version=job.version + 1,
        eligible_at=eligible_at,
        ack_deadline=None,
        lease_expires_at=None,
    )


def with_state(job: Job, state: JobState) -> Job:
    """The job forced into `state` (a new version), keeping every other field."""
    return replace(job, state=state, version=job.version + 1)


def make_endpoint(
    endpoint_id: str = "ep-1", *, name: str = "alpha", created_at: Instant = T0
) -> Endpoint:
    return Endpoint(
        id=endpoint_id,
        name=name,
        created_at=created_at,
        join_token_hash=f"join-hash-{endpoint_id}",
        join_token_expires_at=created_at + 3_600_000,
    )


def make_session(
    session_id: str = "sess-1", *, endpoint_id: str = "ep-1", created_at: Instant = T0
) -> Session:
    return Session(
        id=session_id,
        endpoint_id=endpoint_id,
        generation=1,
        boot_id="boot-1",
        capacity=4,
        run_version="0.1.0",
        created_at=created_at,
        last_seen_at=created_at,
        expires_at=created_at + SESSION_TTL_MS,
    )


def make_user(
    user_id: str = "user-1", *, name: str = "ada", created_at: Instant = T0, admin: bool = False
) -> User:
    return User(id=user_id, name=name, platform_admin=admin, created_at=created_at)


def make_server(
    server_id: str = "srv-1",
    *,
    name: str = "build-box",
    owner_id: str = "user-1",
    admin_ids: tuple[str, ...] = (),
    created_at: Instant = T0,
) -> Server:
    return Server(
        id=server_id,
        name=name,
        endpoint_id="ep-1",
        owner_id=owner_id,
        created_at=created_at,
        admin_ids=admin_ids,
    )


def insert_jobs(store: Store, *jobs: Job) -> None:
    for job in jobs:
        store.insert_job(job)


def advance(store: Store, old: Job, new: Job) -> Job:
    """Replace `old` with `new` (which must succeed) and return `new`."""
    assert store.replace_job(new, expected=old)
    return new


def by_id(records: list[Any]) -> list[Any]:
    """Records in id order, for results whose order the contract leaves open."""
    return sorted(records, key=lambda record: record.id)


def typed(value: object) -> object:
    """`value` with the exact type of every nested part, so that `==` also compares types
    (a store returning "queued" for JobState.QUEUED, or 1 for True, would otherwise pass)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (type(value), tuple((f.name, typed(getattr(value, f.name))) for f in fields))
    if isinstance(value, tuple):
        return (tuple, tuple(typed(item) for item in value))
    return (type(value), value)


@pytest.fixture(params=CONTRACT_STORE_NAMES)
def store_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> StoreFactory:
    """Every store, and MySQLStore on each of its two drivers."""
    return build_factory(request.param, request, tmp_path_factory)


@pytest.fixture
def store(store_factory: StoreFactory) -> Iterator[Store]:
    store = store_factory.open()
    yield store
    store.close()


# -- jobs: insert and get ----------------------------------------------------------------------


def fresh_job() -> Job:
    return make_job("job-fresh")


def running_job() -> Job:
    job = running(accepted(make_job("job-running"), at=T0 + 100), at=T0 + 200)
    return replace(job, progress=Progress(seq=1, percent=None, message=None, at=T0 + 300))


def finished_job() -> Job:
    """A job with every optional and nested field set."""
    error = ErrorInfo("boom", "it broke: ünïcødé ✓")
    run_result = RunResult.of("failed", False, error.as_dict(), {"rows": 3, "note": "naïve"})
    return replace(
        make_job("job-finished", eligible_at=T0 + 50),
        payload_json='{"nested":{"list":[1,2.5,"x",null,true]},"text":"ünïcødé ✓"}',
        state=JobState.FAILED,
        attempt=2,
        version=9,
        updated_at=T0 + 9_000,
        lease_hash="lease-hash-2",
        session_generation=3,
        claimed_at=T0 + 5_000,
        ack_deadline=T0 + 35_000,
        lease_expires_at=T0 + 45_000,
        progress=Progress(seq=4, percent=42.5, message="halfway", at=T0 + 6_000),
        cancel=CancelState(
            requested_at=T0 + 7_000,
            requested_by="user-1",
            result=CancelResult.COMPLETED_FIRST,
            resolved_at=T0 + 8_000,
        ),
        last_failure=Failure(FailureReason.FAILED, 2, T0 + 9_000, "boom", "it broke"),
        result=RecordedResult(attempt=2, result=run_result, at=T0 + 9_000),
        terminal=Terminal(Outcome.FAILED, 2, T0 + 9_000, error),
        reconcile=ReconcileMark(ReconcileOutcome.CONFIRMED, T0 + 5_500, 3),
        history=(
            AttemptSummary(1, None, T0 + 4_000, "lease_expired", "lease_expired"),
            AttemptSummary(2, T0 + 5_000, T0 + 9_000, "failed", "boom"),
        ),
    )


@pytest.mark.parametrize("build", [fresh_job, running_job, finished_job])
def test_insert_then_get_round_trips_the_job_exactly(store: Store, build: Any) -> None:
    """A stored job reads back equal, field by field and type by type, nested values included."""
    expected = build()
    store.insert_job(expected)
    actual = store.get_job(expected.id)
    assert expected == actual
    assert typed(expected) == typed(actual)


def test_get_job_of_unknown_id_is_none(store: Store) -> None:
    """Reading a job that was never inserted gives None."""
    store.insert_job(make_job("job-1"))
    assert store.get_job("job-2") is None


def test_insert_job_with_duplicate_id_raises_already_exists(store: Store) -> None:
    """A second insert under the same id raises AlreadyExists and keeps the first record."""
    first = make_job("job-1")
    store.insert_job(first)
    with pytest.raises(AlreadyExists):
        store.insert_job(replace(first, kind="other.kind"))
    assert first == store.get_job("job-1")


# -- jobs: compare-and-swap --------------------------------------------------------------------


def test_replace_job_with_stored_version_succeeds(store: Store) -> None:
    """Replacing with the stored version returns True and the new record is what get returns."""
    job = make_job()
    store.insert_job(job)
    claimed = accepted(job, at=T0 + 1_000)
    assert store.replace_job(claimed, expected=job) is True
    assert claimed == store.get_job(job.id)


def test_replace_job_with_stale_version_fails_and_changes_nothing(store: Store) -> None:
    """Replacing with an outdated version returns False and leaves the stored record as is."""
    job = make_job()
    store.insert_job(job)
    claimed = advance(store, job, accepted(job, at=T0 + 1_000))
    late = replace(accepted(job, at=T0 + 2_000), lease_hash="lease-late")
    assert store.replace_job(late, expected=job) is False
    assert claimed == store.get_job(job.id)


def test_replace_job_of_unknown_id_returns_false(store: Store) -> None:
    """Replacing a job that was never inserted returns False and creates nothing."""
    job = make_job("job-ghost")
    assert store.replace_job(job, expected=job) is False
    assert store.get_job("job-ghost") is None


def test_concurrent_replace_from_same_version_has_exactly_one_winner(store: Store) -> None:
    """Eight threads CAS the same job from the same version: exactly one succeeds."""
    job = make_job()
    store.insert_job(job)
    candidates = [replace(job, version=2, lease_hash=f"lease-{n}") for n in range(8)]
    barrier = threading.Barrier(len(candidates))

    def attempt(candidate: Job) -> bool:
        barrier.wait()
        return store.replace_job(candidate, expected=job)

    with ThreadPoolExecutor(max_workers=len(candidates)) as pool:
        outcomes = list(pool.map(attempt, candidates))
    winners = [c for c, won in zip(candidates, outcomes, strict=True) if won]
    assert len(winners) == 1
    assert winners == [store.get_job(job.id)]


# -- jobs: claimable -----------------------------------------------------------------------------


def test_claimable_includes_job_eligible_exactly_now_but_not_one_later(store: Store) -> None:
    """eligible_at == now is claimable; eligible_at == now + 1 is not."""
    now = T0 + 10_000
    on_time = make_job("job-on-time", eligible_at=now)
    early = make_job("job-early", eligible_at=now + 1)
    insert_jobs(store, on_time, early)
    assert [on_time] == store.claimable_jobs("ep-1", now, limit=10)
    assert [on_time, early] == store.claimable_jobs("ep-1", now + 1, limit=10)


def test_claimable_lists_only_queued_and_retrying_jobs(store: Store) -> None:
    """Active and terminal jobs are never claimable, even when their eligible_at has passed."""
    queued = make_job("job-queued")
    retry = retrying(make_job("job-retrying"), eligible_at=T0 + 1)
    others = [
        accepted(make_job("job-accepted"), at=T0),
        running(accepted(make_job("job-running"), at=T0), at=T0),
        *(with_state(make_job(f"job-{s}"), s) for s in (JobState.SUCCEEDED, JobState.FAILED)),
        with_state(make_job("job-cancelled"), JobState.CANCELLED),
    ]
    insert_jobs(store, queued, retry, *others)
    assert [queued, retry] == store.claimable_jobs("ep-1", T0 + 10_000, limit=10)


def test_claimable_never_lists_a_job_with_a_cancel_intent(store: Store) -> None:
    """A waiting job carrying a cancel intent is not claimable, whether inserted or replaced so."""
    intent = CancelState(requested_at=T0, requested_by="user-1")
    inserted = replace(make_job("job-inserted"), cancel=intent)
    later = make_job("job-later")
    insert_jobs(store, inserted, later)
    assert [later] == store.claimable_jobs("ep-1", T0 + 1_000, limit=10)
    advance(store, later, replace(later, version=later.version + 1, cancel=intent))
    assert store.claimable_jobs("ep-1", T0 + 1_000, limit=10) == []


def test_claimable_never_lists_another_endpoints_job(store: Store) -> None:
    """Claimable jobs belong to the asked endpoint only."""
    mine = make_job("job-mine", endpoint_id="ep-1")
    theirs = make_job("job-theirs", endpoint_id="ep-2")
    insert_jobs(store, mine, theirs)
    assert [mine] == store.claimable_jobs("ep-1", T0 + 1_000, limit=10)
    assert [theirs] == store.claimable_jobs("ep-2", T0 + 1_000, limit=10)
    assert store.claimable_jobs("ep-3", T0 + 1_000, limit=10) == []


def test_claimable_orders_by_eligible_at_then_created_at_then_id(store: Store) -> None:
    """Oldest eligible_at first; ties by created_at, then by id."""
    last = make_job("job-a", created_at=T0, eligible_at=T0 + 20)
    newer = make_job("job-b", created_at=T0 + 2, eligible_at=T0 + 10)
    same_c = make_job("job-c", created_at=T0 + 1, eligible_at=T0 + 10)
    same_d = make_job("job-d", created_at=T0 + 1, eligible_at=T0 + 10)
    same_e = make_job("job-e", created_at=T0 + 1, eligible_at=T0 + 10)
    insert_jobs(store, same_e, last, newer, same_d, same_c)
    expected = [same_c, same_d, same_e, newer, last]
    assert expected == store.claimable_jobs("ep-1", T0 + 1_000, limit=10)


def test_claimable_honours_limit(store: Store) -> None:
    """At most `limit` jobs come back, the first ones in claim order."""
    jobs = [make_job(f"job-{n}", eligible_at=T0 + n) for n in range(5)]
    insert_jobs(store, *reversed(jobs))
    assert jobs[:2] == store.claimable_jobs("ep-1", T0 + 1_000, limit=2)
    assert jobs == store.claimable_jobs("ep-1", T0 + 1_000, limit=5)


def test_claimed_job_is_no_longer_claimable(store: Store) -> None:
    """Once a job is replaced into accepted it leaves the claimable set."""
    first, second = make_job("job-1"), make_job("job-2", created_at=T0 + 1)
    insert_jobs(store, first, second)
    advance(store, first, accepted(first, at=T0 + 1_000))
    assert [second] == store.claimable_jobs("ep-1", T0 + 1_000, limit=10)


def test_retrying_job_is_claimable_at_its_new_eligible_time(store: Store) -> None:
    """A retrying job's moved eligible_at is what claimability follows, each time it moves."""
    job = make_job()
    store.insert_job(job)
    claimed = advance(store, job, accepted(job, at=T0 + 1_000))
    waiting = advance(store, claimed, retrying(claimed, eligible_at=T0 + 5_000))
    assert store.claimable_jobs("ep-1", T0 + 4_999, limit=10) == []
    assert [waiting] == store.claimable_jobs("ep-1", T0 + 5_000, limit=10)
    moved = advance(store, waiting, retrying(waiting, eligible_at=T0 + 9_000))
    assert store.claimable_jobs("ep-1", T0 + 5_000, limit=10) == []
    assert [moved] == store.claimable_jobs("ep-1", T0 + 9_000, limit=10)


def test_job_requeued_under_the_same_key_is_claimable_once(store: Store) -> None:
    """A job that leaves the queue and comes back at the same instant is listed once."""
    job = make_job()
    store.insert_job(job)
    claimed = advance(store, job, accepted(job, at=T0))
    back = advance(store, claimed, retrying(claimed, eligible_at=T0))
    assert [back] == store.claimable_jobs("ep-1", T0, limit=10)
    assert [back] == store.claimable_jobs("ep-1", T0, limit=10)


# -- jobs: atomic claims -----------------------------------------------------------------------


def grant_at(at: Instant) -> Any:
    """The `grant` a claimer passes to claim_jobs: the pure claim transition."""
    return lambda job: accepted(job, at=at)


def test_claim_jobs_stores_and_returns_what_grant_made(store: Store) -> None:
    """Claims take the claim order, honour the limit, and store the granted records."""
    jobs = [make_job(f"job-{n}", created_at=T0 + n) for n in range(3)]
    insert_jobs(store, *jobs)
    claimed = store.claim_jobs("ep-1", T0 + 10, 2, grant_at(T0 + 10))
    assert [accepted(job, at=T0 + 10) for job in jobs[:2]] == claimed
    assert claimed == [store.get_job(job.id) for job in jobs[:2]]
    assert [jobs[2]] == store.claimable_jobs("ep-1", T0 + 10, limit=10)


def test_claim_jobs_takes_only_claimable_jobs(store: Store) -> None:
    """Not yet eligible, cancelled and other endpoints' jobs are never granted."""
    later = make_job("job-later", eligible_at=T0 + 500)
    foreign = make_job("job-foreign", endpoint_id="ep-2")
    cancelled = make_job("job-cancelled")
    insert_jobs(store, later, foreign, cancelled)
    advance(store, cancelled, replace(cancelled, cancel=CancelState(T0, "u"), version=2))
    assert store.claim_jobs("ep-1", T0 + 499, 10, grant_at(T0 + 499)) == []


def test_claim_jobs_is_all_or_nothing_when_grant_fails(store: Store) -> None:
    """A grant that raises leaves every job as it was."""
    jobs = [make_job(f"job-{n}", created_at=T0 + n) for n in range(2)]
    insert_jobs(store, *jobs)
    calls = []

    def failing(job: Job) -> Job:
        calls.append(job.id)
        if len(calls) == 2:
            raise RuntimeError("grant failed")
        return accepted(job, at=T0 + 10)

    with pytest.raises(RuntimeError):
        store.claim_jobs("ep-1", T0 + 10, 2, failing)
    assert jobs == [store.get_job(job.id) for job in jobs]


def test_concurrent_claims_never_grant_a_job_twice(store: Store) -> None:
    """Eight threads claiming from one queue share it without overlap and without loss."""
    jobs = [make_job(f"job-{n:02d}", created_at=T0 + n) for n in range(40)]
    insert_jobs(store, *jobs)

    def claim_all() -> list[str]:
        mine: list[str] = []
        while granted := store.claim_jobs("ep-1", T0 + 100, 3, grant_at(T0 + 100)):
            mine.extend(job.id for job in granted)
        return mine

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = [f.result() for f in [pool.submit(claim_all) for _ in range(8)]]
    granted = [job_id for ids in results for job_id in ids]
    assert sorted(job.id for job in jobs) == sorted(granted)


# -- jobs: owners take turns at claims --------------------------------------------------------


def backlog(
    owner_id: str, count: int, *, start: Instant = T0, eligible_at: Instant | None = None
) -> list[Job]:
    """`count` queued jobs of one owner, 1 ms apart from `start`."""
    return [
        make_job(
            f"job-{owner_id}-{n:04d}",
            owner_id=owner_id,
            created_at=start + n,
            eligible_at=eligible_at,
        )
        for n in range(count)
    ]


def owners(jobs: list[Job]) -> list[str]:
    return [job.owner_id for job in jobs]


def test_one_owners_backlog_does_not_hold_back_anothers_next_job(store: Store) -> None:
    """Alice's 300 jobs came first, Bob's one last: the first claim grants Bob's job."""
    alice = backlog("usr-alice", 300)
    bob = make_job("job-bob", owner_id="usr-bob", created_at=T0 + 1_000)
    store.insert_jobs([*alice, bob])
    claimed = store.claim_jobs("ep-1", T0 + 2_000, 4, grant_at(T0 + 2_000))
    assert [alice[0].id, bob.id, alice[1].id, alice[2].id] == [job.id for job in claimed]


def test_claims_of_one_alternate_owners_from_the_owner_served_last(store: Store) -> None:
    """Each claim starts after the owner the previous one served last, wrapping round."""
    store.insert_jobs([*backlog("usr-a", 5), *backlog("usr-b", 5), *backlog("usr-c", 1)])
    served, last = [], None
    for _ in range(6):
        (job,) = store.claim_jobs("ep-1", T0 + 100, 1, grant_at(T0 + 100), after_owner=last)
        served.append(job.owner_id)
        last = job.owner_id
    assert served == ["usr-a", "usr-b", "usr-c", "usr-a", "usr-b", "usr-a"]


def test_within_one_owner_claims_keep_the_claim_order(store: Store) -> None:
    """Owners interleave, and each owner's jobs are granted oldest eligible_at first (then
    created_at), across claims."""
    a, b = backlog("usr-a", 6), backlog("usr-b", 4, start=T0 + 50)
    late = make_job("job-usr-a-late", owner_id="usr-a", created_at=T0 - 10, eligible_at=T0 + 80)
    store.insert_jobs([*a, *b, late])
    granted: list[Job] = []
    last = None
    while claimed := store.claim_jobs("ep-1", T0 + 100, 3, grant_at(T0 + 100), after_owner=last):
        granted += claimed
        last = claimed[-1].owner_id
    assert [job.id for job in [*a, late]] == [job.id for job in granted if job.owner_id == "usr-a"]
    assert [job.id for job in b] == [job.id for job in granted if job.owner_id == "usr-b"]
    assert owners(granted[:8]) == ["usr-a", "usr-b"] * 4


def test_an_owner_with_nothing_claimable_takes_no_turn(store: Store) -> None:
    """Bob's jobs are not eligible yet, Carol's has a cancel intent, Dan's runs: Alice's
    backlog gets every job of the claim, and Bob's turn comes once his jobs are eligible."""
    cancelled = make_job("job-carol", owner_id="usr-carol")
    running_dan = accepted(make_job("job-dan", owner_id="usr-dan"), at=T0)
    store.insert_jobs(
        [
            *backlog("usr-alice", 10),
            *backlog("usr-bob", 2, eligible_at=T0 + 500),
            cancelled,
            running_dan,
        ]
    )
    advance(store, cancelled, replace(cancelled, cancel=CancelState(T0, "u"), version=2))
    assert owners(store.claim_jobs("ep-1", T0 + 10, 3, grant_at(T0 + 10))) == ["usr-alice"] * 3
    later = store.claim_jobs("ep-1", T0 + 500, 3, grant_at(T0 + 500), after_owner="usr-alice")
    assert owners(later) == ["usr-bob", "usr-alice", "usr-bob"]


def test_a_retrying_job_takes_its_owners_turn_again(store: Store) -> None:
    """Bob's one job is claimed, then waits to retry: once eligible, it is in the turns again."""
    store.insert_jobs([*backlog("usr-alice", 20), make_job("job-bob", owner_id="usr-bob")])
    first = store.claim_jobs("ep-1", T0 + 10, 2, grant_at(T0 + 10))
    bob = next(job for job in first if job.owner_id == "usr-bob")
    advance(store, bob, retrying(bob, eligible_at=T0 + 60))
    assert (
        owners(store.claim_jobs("ep-1", T0 + 59, 2, grant_at(T0 + 59), after_owner="usr-bob"))
        == ["usr-alice"] * 2
    )
    again = store.claim_jobs("ep-1", T0 + 60, 2, grant_at(T0 + 60), after_owner="usr-alice")
    assert [(job.owner_id, job.attempt) for job in again] == [("usr-bob", 2), ("usr-alice", 1)]


def test_owners_take_turns_on_their_own_endpoint_only(store: Store) -> None:
    """Bob's jobs on another endpoint never take a turn on this one."""
    theirs = make_job("job-bob", owner_id="usr-bob", endpoint_id="ep-2")
    store.insert_jobs([*backlog("usr-alice", 3), theirs])
    assert owners(store.claim_jobs("ep-1", T0 + 10, 4, grant_at(T0 + 10))) == ["usr-alice"] * 3
    assert [theirs.id] == [
        job.id for job in store.claim_jobs("ep-2", T0 + 10, 4, grant_at(T0 + 10))
    ]


def test_concurrent_claims_of_several_owners_never_grant_a_job_twice(store: Store) -> None:
    """Eight threads claiming from four owners' queues at once share them without overlap and
    without loss."""
    jobs = [job for n in range(4) for job in backlog(f"usr-{n}", 15, start=T0 + n)]
    store.insert_jobs(jobs)

    def claim_all() -> list[str]:
        mine: list[str] = []
        last = None
        while granted := store.claim_jobs(
            "ep-1", T0 + 100, 3, grant_at(T0 + 100), after_owner=last
        ):
            mine.extend(job.id for job in granted)
            last = granted[-1].owner_id
        return mine

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = [f.result() for f in [pool.submit(claim_all) for _ in range(8)]]
    granted = [job_id for ids in results for job_id in ids]
    assert sorted(job.id for job in jobs) == sorted(granted)


def test_job_counts_by_state(store: Store) -> None:
    """Counts follow the stored states."""
    jobs = [make_job(f"job-{n}", created_at=T0 + n) for n in range(3)]
    insert_jobs(store, *jobs)
    advance(store, jobs[0], accepted(jobs[0], at=T0 + 10))
    counts = {state: n for state, n in store.job_counts().items() if n}
    assert counts == {JobState.QUEUED: 2, JobState.ACCEPTED: 1}


# -- jobs: due deadlines -------------------------------------------------------------------------


def test_accepted_job_is_due_at_its_ack_deadline(store: Store) -> None:
    """An accepted job is due once now reaches ack_deadline, not a millisecond before."""
    job = accepted(make_job(), at=T0)
    store.insert_job(job)
    deadline = T0 + ACK_TIMEOUT_MS
    assert store.due_jobs(deadline - 1, limit=10) == []
    assert [job] == store.due_jobs(deadline, limit=10)


def test_running_job_is_due_at_its_lease_expiry(store: Store) -> None:
    """A running job is due once now reaches lease_expires_at, not a millisecond before."""
    job = running(accepted(make_job(), at=T0), at=T0 + 1_000)
    store.insert_job(job)
    expiry = T0 + 1_000 + LEASE_TTL_MS
    assert store.due_jobs(expiry - 1, limit=10) == []
    assert [job] == store.due_jobs(expiry, limit=10)


def test_due_uses_the_deadline_of_the_current_state(store: Store) -> None:
    """Accepted jobs go by ack_deadline and running ones by lease_expires_at, whatever the other
    field holds."""
    stale_lease = replace(accepted(make_job("job-accepted"), at=T0), lease_expires_at=T0 + 1)
    stale_ack = replace(
        running(accepted(make_job("job-running"), at=T0), at=T0), ack_deadline=T0 + 1
    )
    insert_jobs(store, stale_lease, stale_ack)
    assert store.due_jobs(T0 + 1_000, limit=10) == []


def test_due_lists_earliest_deadline_first_and_honours_limit(store: Store) -> None:
    """Due jobs come back by deadline, earliest first, at most `limit` of them."""
    late = accepted(make_job("job-late"), at=T0, ack_timeout_ms=3_000)
    early = running(accepted(make_job("job-early"), at=T0), at=T0, lease_ms=1_000)
    middle = accepted(make_job("job-middle"), at=T0, ack_timeout_ms=2_000)
    insert_jobs(store, late, early, middle)
    assert [early, middle, late] == store.due_jobs(T0 + 10_000, limit=10)
    assert [early, middle] == store.due_jobs(T0 + 10_000, limit=2)


def test_due_never_lists_waiting_or_terminal_jobs(store: Store) -> None:
    """Queued, retrying and terminal jobs are never due, whatever deadlines their fields hold."""
    leftovers = {"ack_deadline": T0 + 1, "lease_expires_at": T0 + 1}
    jobs = [
        replace(make_job("job-queued"), **leftovers),
        replace(retrying(make_job("job-retrying"), eligible_at=T0), **leftovers),
        *(
            replace(with_state(make_job(f"job-{state}"), state), **leftovers)
            for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
        ),
    ]
    insert_jobs(store, *jobs)
    assert store.due_jobs(T0 + 1_000_000, limit=10) == []


def test_renewed_lease_is_no_longer_due(store: Store) -> None:
    """After a replace with a later lease_expires_at the job is due only at the new expiry."""
    job = running(accepted(make_job(), at=T0), at=T0)
    store.insert_job(job)
    old_expiry = T0 + LEASE_TTL_MS
    renewed = advance(
        store, job, replace(job, version=job.version + 1, lease_expires_at=old_expiry + 20_000)
    )
    assert store.due_jobs(old_expiry, limit=10) == []
    assert [renewed] == store.due_jobs(old_expiry + 20_000, limit=10)


def test_job_leaving_active_states_is_no_longer_due(store: Store) -> None:
    """A due job replaced into a waiting or terminal state drops out of the due list."""
    first = accepted(make_job("job-1"), at=T0)
    second = running(accepted(make_job("job-2"), at=T0), at=T0)
    insert_jobs(store, first, second)
    advance(store, first, retrying(first, eligible_at=T0 + 100_000))
    advance(store, second, with_state(second, JobState.SUCCEEDED))
    assert store.due_jobs(T0 + 1_000_000, limit=10) == []


# -- jobs: active --------------------------------------------------------------------------------


def test_active_jobs_are_the_endpoints_accepted_and_running_jobs(store: Store) -> None:
    """Exactly the endpoint's accepted and running jobs, nothing waiting, ended or elsewhere."""
    taken = accepted(make_job("job-accepted"), at=T0)
    busy = running(accepted(make_job("job-running"), at=T0), at=T0)
    insert_jobs(
        store,
        taken,
        busy,
        make_job("job-queued"),
        retrying(make_job("job-retrying"), eligible_at=T0),
        with_state(make_job("job-done"), JobState.SUCCEEDED),
        accepted(make_job("job-elsewhere", endpoint_id="ep-2"), at=T0),
    )
    assert [taken, busy] == by_id(store.active_jobs("ep-1"))
    assert store.active_jobs("ep-3") == []
    deadlines = [(job.id, job.deadline_at) for job in (taken, busy)]
    assert deadlines == sorted(store.active_deadlines("ep-1"))
    assert store.active_deadlines("ep-3") == []


def test_active_jobs_follow_state_changes(store: Store) -> None:
    """Claims add jobs to the active set; endings take them out."""
    first, second = make_job("job-1"), make_job("job-2")
    insert_jobs(store, first, second)
    assert store.active_jobs("ep-1") == []
    first = advance(store, first, accepted(first, at=T0))
    second = advance(store, second, accepted(second, at=T0))
    assert [first, second] == by_id(store.active_jobs("ep-1"))
    first = advance(store, first, running(first, at=T0 + 1))
    second = advance(store, second, retrying(second, eligible_at=T0 + 5_000))
    assert [first] == store.active_jobs("ep-1")
    advance(store, first, with_state(first, JobState.SUCCEEDED))
    assert store.active_jobs("ep-1") == []


# -- jobs: listing -------------------------------------------------------------------------------


def listing_jobs() -> list[Job]:
    """Six jobs on two servers, some sharing created_at, in no particular order."""
    return [
        make_job("job-a", server_id="srv-1", created_at=T0),
        make_job("job-b", server_id="srv-2", created_at=T0 + 1),
        with_state(make_job("job-c", server_id="srv-1", created_at=T0 + 1), JobState.SUCCEEDED),
        make_job("job-d", server_id="srv-1", created_at=T0 + 1),
        with_state(make_job("job-e", server_id="srv-2", created_at=T0 + 2), JobState.SUCCEEDED),
        make_job("job-f", server_id="srv-3", created_at=T0 + 3),
    ]


def job_ids(jobs: list[Job]) -> list[str]:
    return [job.id for job in jobs]


def test_list_jobs_is_newest_first_by_created_at_then_id(store: Store) -> None:
    """All jobs, by created_at descending, ties by id descending."""
    jobs = listing_jobs()
    insert_jobs(store, *jobs)
    expected = ["job-f", "job-e", "job-d", "job-c", "job-b", "job-a"]
    assert expected == job_ids(store.list_jobs(server_ids=None, state=None, limit=100))


def test_list_jobs_returns_the_stored_records(store: Store) -> None:
    """Listed jobs are the full records that get_job returns."""
    jobs = listing_jobs()
    insert_jobs(store, *jobs)
    listed = store.list_jobs(server_ids=None, state=None, limit=100)
    assert by_id(jobs) == by_id(listed)


def test_list_jobs_filters_by_server_ids(store: Store) -> None:
    """server_ids=None lists every server, an empty collection none, otherwise just those."""
    insert_jobs(store, *listing_jobs())

    def listed(server_ids: list[str] | None) -> list[str]:
        return job_ids(store.list_jobs(server_ids=server_ids, state=None, limit=100))

    everything = ["job-f", "job-e", "job-d", "job-c", "job-b", "job-a"]
    on_srv_1 = ["job-d", "job-c", "job-a"]
    on_srv_2_and_3 = ["job-f", "job-e", "job-b"]
    assert everything == listed(None)
    assert listed([]) == []
    assert on_srv_1 == listed(["srv-1"])
    assert on_srv_2_and_3 == listed(["srv-2", "srv-3"])
    assert listed(["srv-unknown"]) == []


def test_list_jobs_filters_by_state(store: Store) -> None:
    """Only jobs in the given state, combined with the server filter."""
    insert_jobs(store, *listing_jobs())
    succeeded = store.list_jobs(server_ids=None, state=JobState.SUCCEEDED, limit=100)
    queued_on_srv_1 = store.list_jobs(server_ids=["srv-1"], state=JobState.QUEUED, limit=100)
    expected_succeeded, expected_queued = ["job-e", "job-c"], ["job-d", "job-a"]
    assert expected_succeeded == job_ids(succeeded)
    assert expected_queued == job_ids(queued_on_srv_1)
    assert store.list_jobs(server_ids=None, state=JobState.RUNNING, limit=100) == []


def test_list_jobs_honours_limit(store: Store) -> None:
    """At most `limit` jobs, the newest ones."""
    insert_jobs(store, *listing_jobs())
    newest_two = ["job-f", "job-e"]
    assert newest_two == job_ids(store.list_jobs(server_ids=None, state=None, limit=2))


def test_list_jobs_after_cursor_continues_strictly_after_it(store: Store) -> None:
    """`after` = (created_at, id) of a listed job resumes with the next older one."""
    insert_jobs(store, *listing_jobs())
    after = (T0 + 1, "job-d")
    listed = store.list_jobs(server_ids=None, state=None, limit=100, after=after)
    older = ["job-c", "job-b", "job-a"]
    assert older == job_ids(listed)


@pytest.mark.parametrize(
    ("server_ids", "state"),
    [(None, None), (["srv-1", "srv-2"], None), (None, JobState.QUEUED)],
)
def test_list_jobs_pagination_visits_every_job_exactly_once(
    store: Store, server_ids: list[str] | None, state: JobState | None
) -> None:
    """Following the cursor page by page yields the unpaged listing, with no repeats or gaps."""
    jobs = [
        make_job(f"job-{n:02d}", server_id=f"srv-{n % 3 + 1}", created_at=T0 + n // 3)
        for n in range(20)
    ]
    insert_jobs(store, *jobs)
    everything = store.list_jobs(server_ids=server_ids, state=state, limit=100)
    seen: list[Job] = []
    after = None
    for _ in range(len(jobs) + 1):  # bounded, so a cursor that never advances cannot hang
        page = store.list_jobs(server_ids=server_ids, state=state, limit=3, after=after)
        if not page:
            break
        seen.extend(page)
        after = (page[-1].created_at, page[-1].id)
    assert everything == seen
    assert len(set(job_ids(seen))) == len(seen)


def search_jobs() -> list[Job]:
    """Eight jobs of two kinds on two servers, with ids sharing prefixes."""
    kinds = ["build", "test", "build", "build", "test", "build", "test", "build"]
    return [
        replace(
            make_job(
                f"job_{'ab' if n < 5 else 'cd'}{n}", server_id=f"srv-{n % 2 + 1}", created_at=T0 + n
            ),
            kind=kinds[n],
        )
        for n in range(8)
    ]


def test_list_jobs_filters_by_kind(store: Store) -> None:
    """Only jobs of the kind, newest first, combined with the server and state filters."""
    jobs = search_jobs()
    jobs[3] = with_state(jobs[3], JobState.SUCCEEDED)
    insert_jobs(store, *jobs)

    def listed(kind: str, server_ids: list[str] | None, state: JobState | None = None) -> list[str]:
        return job_ids(store.list_jobs(server_ids=server_ids, state=state, limit=100, kind=kind))

    builds, tests = (
        ["job_cd7", "job_cd5", "job_ab3", "job_ab2", "job_ab0"],
        ["job_cd6", "job_ab4", "job_ab1"],
    )
    builds_on_srv_2, succeeded_builds = ["job_cd7", "job_cd5", "job_ab3"], ["job_ab3"]
    queued_builds_on_srv_1 = ["job_ab2", "job_ab0"]
    assert builds == listed("build", None)
    assert tests == listed("test", None)
    assert builds_on_srv_2 == listed("build", ["srv-2"])
    assert succeeded_builds == listed("build", None, JobState.SUCCEEDED)
    assert queued_builds_on_srv_1 == listed("build", ["srv-1"], JobState.QUEUED)
    assert listed("deploy", None) == []


def test_list_jobs_filters_by_id_prefix(store: Store) -> None:
    """Only jobs whose id starts with the prefix, newest first, with every other filter."""
    insert_jobs(store, *search_jobs())

    def listed(
        prefix: str, server_ids: list[str] | None = None, kind: str | None = None
    ) -> list[str]:
        jobs = store.list_jobs(
            server_ids=server_ids, state=None, limit=100, kind=kind, id_prefix=prefix
        )
        return job_ids(jobs)

    with_ab = ["job_ab4", "job_ab3", "job_ab2", "job_ab1", "job_ab0"]
    with_ab_on_srv_2, tests_with_ab, exactly = (
        ["job_ab3", "job_ab1"],
        ["job_ab4", "job_ab1"],
        ["job_cd6"],
    )
    assert with_ab == listed("job_ab")
    assert with_ab_on_srv_2 == listed("job_ab", ["srv-2"])
    assert tests_with_ab == listed("job_ab", kind="test")
    assert exactly == listed("job_cd6")
    assert listed("job_ab9") == []
    assert listed("job_a~") == []


def test_list_jobs_by_id_prefix_pages_like_any_listing(store: Store) -> None:
    """A prefix search follows the cursor page by page with no repeats or gaps."""
    insert_jobs(store, *search_jobs())
    after, seen = None, []
    for _ in range(10):
        page = store.list_jobs(
            server_ids=["srv-1", "srv-2"], state=None, limit=2, after=after, id_prefix="job_"
        )
        if not page:
            break
        seen.extend(job_ids(page))
        after = (page[-1].created_at, page[-1].id)
    every_job = [f"job_{'ab' if n < 5 else 'cd'}{n}" for n in reversed(range(8))]
    assert every_job == seen


# -- what every kind of record shares -----------------------------------------------------------


@dataclass(frozen=True)
class RecordKind:
    """A kind of record the store keeps (not jobs: theirs is above), by the seam's methods for
    it; `listed`, `by_name` and `replace` where the seam has them."""

    name: str
    make: Callable[[int], Any]
    """The n-th record of the kind: its own id and name, created at T0 + n."""
    full: Callable[[], Any]
    """A record with every optional field set."""
    insert: Callable[[Store, Any], None]
    get: Callable[[Store, str], Any]
    listed: Callable[[Store], list[Any]] | None = None
    by_name: Callable[[Store, str], Any] | None = None
    replace: Callable[[Store, Any, int], bool] | None = None
    changed: Callable[[Any, int], Any] | None = None
    """The record with a field changed (differently for each n), as its next version."""

    def __str__(self) -> str:
        return self.name


def seam(method: str) -> Callable[..., Any]:
    """The store's own method of that name (the Protocol's would do nothing)."""
    return lambda store, *args: getattr(store, method)(*args)


ENDPOINTS = RecordKind(
    "endpoint",
    make=lambda n: make_endpoint(f"ep-{n}", name=f"host-{n}", created_at=T0 + n),
    full=lambda: replace(
        make_endpoint(),
        version=4,
        identity_public_key="AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8",
        joined_at=T0 + 1_000,
        generation=3,
        current_session_id="sess-3",
    ),
    insert=seam("insert_endpoint"),
    get=seam("get_endpoint"),
    listed=seam("list_endpoints"),
    by_name=lambda store, name: next((e for e in store.list_endpoints() if e.name == name), None),
    replace=lambda store, record, version: store.replace_endpoint(record, expected_version=version),
    changed=lambda endpoint, n: replace(
        endpoint, version=endpoint.version + 1, identity_public_key=f"key-{n}", joined_at=T0 + n
    ),
)
SESSIONS = RecordKind(
    "session",
    make=lambda n: make_session(f"sess-{n}", created_at=T0 + n),
    full=lambda: replace(make_session(), generation=7, reconciled_at=T0 + 10),
    insert=seam("insert_session"),
    get=seam("get_session"),
)
USERS = RecordKind(
    "user",
    make=lambda n: make_user(f"user-{n}", name=f"name-{n}", created_at=T0 + n),
    full=lambda: replace(make_user(admin=True), password_hash="$argon2id$v=19$hash"),
    insert=seam("insert_user"),
    get=seam("get_user"),
    listed=seam("list_users"),
    by_name=seam("user_by_name"),
)
SERVERS = RecordKind(
    "server",
    make=lambda n: make_server(f"srv-{n}", name=f"box-{n}", created_at=T0 + n),
    full=lambda: replace(make_server(admin_ids=("user-2", "user-3")), version=3),
    insert=seam("insert_server"),
    get=seam("get_server"),
    listed=seam("list_servers"),
    replace=lambda store, record, version: store.replace_server(record, expected_version=version),
    changed=lambda server, n: replace(
        server, version=server.version + 1, admin_ids=(f"user-{n + 1}",)
    ),
)
KINDS = [ENDPOINTS, SESSIONS, USERS, SERVERS]


def kinds_with(*methods: str) -> list[RecordKind]:
    return [kind for kind in KINDS if all(getattr(kind, m) is not None for m in methods)]


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_a_record_reads_back_exactly_as_stored(store: Store, kind: RecordKind) -> None:
    """A stored record reads back equal, every optional field set and of its exact type; an
    unknown id gives None."""
    expected = kind.full()
    kind.insert(store, expected)
    actual = kind.get(store, expected.id)
    assert expected == actual
    assert typed(expected) == typed(actual)
    assert kind.get(store, "unknown-id") is None


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_a_second_record_with_the_same_id_raises_and_keeps_the_first(
    store: Store, kind: RecordKind
) -> None:
    """AlreadyExists, and the second (another name, same id) is not stored under either."""
    first = kind.make(1)
    kind.insert(store, first)
    second = replace(kind.make(2), id=first.id)
    with pytest.raises(AlreadyExists):
        kind.insert(store, second)
    assert first == kind.get(store, first.id)
    if kind.by_name is not None:
        assert kind.by_name(store, second.name) is None


@pytest.mark.parametrize("kind", kinds_with("by_name"), ids=str)
def test_a_second_record_with_the_same_name_raises_and_is_not_stored(
    store: Store, kind: RecordKind
) -> None:
    first = kind.make(1)
    kind.insert(store, first)
    with pytest.raises(AlreadyExists):
        kind.insert(store, replace(kind.make(2), name=first.name))
    assert kind.get(store, kind.make(2).id) is None
    assert kind.by_name is not None
    assert first == kind.by_name(store, first.name)


@pytest.mark.parametrize("kind", kinds_with("listed"), ids=str)
def test_every_record_is_listed_exactly_once(store: Store, kind: RecordKind) -> None:
    records = [kind.make(n) for n in range(3)]
    for record in reversed(records):
        kind.insert(store, record)
    assert kind.listed is not None
    assert records == by_id(kind.listed(store))


@pytest.mark.parametrize("kind", kinds_with("replace"), ids=str)
def test_replace_is_compare_and_swap(store: Store, kind: RecordKind) -> None:
    """The stored version wins and is then read back; a stale version changes nothing."""
    assert kind.replace is not None
    assert kind.changed is not None
    record = kind.make(1)
    kind.insert(store, record)
    newer = kind.changed(record, 1)
    assert kind.replace(store, newer, record.version) is True
    assert newer == kind.get(store, record.id)
    stale = kind.changed(record, 2)
    assert kind.replace(store, stale, record.version) is False
    assert newer == kind.get(store, record.id)


@pytest.mark.parametrize("kind", kinds_with("replace"), ids=str)
def test_replace_of_an_unknown_id_returns_false_and_creates_nothing(
    store: Store, kind: RecordKind
) -> None:
    assert kind.replace is not None
    ghost = kind.make(9)
    assert kind.replace(store, ghost, ghost.version) is False
    assert kind.get(store, ghost.id) is None


def test_a_user_is_found_by_name(store: Store) -> None:
    """By name as by id; an unknown name gives None."""
    ada = make_user("user-1", name="ada")
    store.insert_user(ada)
    assert (store.user_by_name("ada"), store.user_by_name("nobody")) == (ada, None)


# -- endpoints -----------------------------------------------------------------------------------


def test_endpoint_by_join_token_finds_by_hash(store: Store) -> None:
    """The endpoint whose join_token_hash matches; None for an unknown hash."""
    first = make_endpoint("ep-1", name="alpha")
    second = make_endpoint("ep-2", name="beta")
    store.insert_endpoint(first)
    store.insert_endpoint(second)
    assert second == store.endpoint_by_join_token("join-hash-ep-2")
    assert first == store.endpoint_by_join_token("join-hash-ep-1")
    assert store.endpoint_by_join_token("join-hash-unknown") is None


def test_replace_endpoint_stores_draining(store: Store) -> None:
    """An endpoint's draining flag is stored by replace and read back everywhere."""
    endpoint = make_endpoint()
    store.insert_endpoint(endpoint)
    draining = replace(endpoint, draining=True, version=2)
    assert store.replace_endpoint(draining, expected_version=1) is True
    assert (store.get_endpoint(endpoint.id), store.list_endpoints()) == (draining, [draining])


def test_delete_endpoint_is_refused_while_servers_point_at_it(store: Store) -> None:
    """An endpoint with servers stays; the answer is how many servers point at it."""
    store.insert_endpoint(make_endpoint())
    store.insert_server(make_server("srv-1", name="one"))
    store.insert_server(make_server("srv-2", name="two"))
    assert store.delete_endpoint("ep-1") == 2
    assert store.get_endpoint("ep-1") == make_endpoint()


def test_delete_endpoint_removes_it_and_its_sessions(store: Store) -> None:
    """An endpoint no server points at is deleted with its sessions; other endpoints stay."""
    store.insert_endpoint(make_endpoint())
    store.insert_endpoint(make_endpoint("ep-2", name="beta"))
    store.insert_session(make_session())
    store.insert_session(make_session("sess-2", endpoint_id="ep-2"))
    assert store.delete_endpoint("ep-1") == 0
    assert store.get_endpoint("ep-1") is None
    assert store.get_session("sess-1") is None
    assert store.session_with_endpoint("sess-1") is None
    assert [make_endpoint("ep-2", name="beta")] == store.list_endpoints()
    assert store.get_session("sess-2") == make_session("sess-2", endpoint_id="ep-2")


def test_delete_endpoint_of_unknown_id_answers_zero(store: Store) -> None:
    """Deleting an endpoint that does not exist changes nothing."""
    assert store.delete_endpoint("ep-ghost") == 0


def test_an_advertisement_reads_back_and_is_replaced_whole(store: Store) -> None:
    """What a Run advertised reads back equal; a later one replaces it; None clears it."""
    store.insert_endpoint(make_endpoint())
    assert store.get_advertisement("ep-1") is None
    first = Advertisement("ep-1", '{"noop":{"type":"object"}}', T0)
    second = Advertisement("ep-1", '{"sleep":{}}', T0 + 5)
    store.set_advertisement("ep-1", first)
    assert first == store.get_advertisement("ep-1")
    store.set_advertisement("ep-1", second)
    assert second == store.get_advertisement("ep-1")
    store.set_advertisement("ep-1", None)
    assert store.get_advertisement("ep-1") is None


def test_delete_endpoint_removes_its_advertisement(store: Store) -> None:
    """A deleted endpoint's advertisement goes with it; another endpoint's stays."""
    store.insert_endpoint(make_endpoint())
    store.insert_endpoint(make_endpoint("ep-2", name="beta"))
    kept = Advertisement("ep-2", "{}", T0)
    store.set_advertisement("ep-1", Advertisement("ep-1", "{}", T0))
    store.set_advertisement("ep-2", kept)
    assert store.delete_endpoint("ep-1") == 0
    assert store.get_advertisement("ep-1") is None
    assert kept == store.get_advertisement("ep-2")


# -- sessions ------------------------------------------------------------------------------------


def test_extend_session_moves_last_seen_and_expiry_forward(store: Store) -> None:
    """A later expiry is stored together with the new last_seen_at."""
    session = make_session()
    store.insert_session(session)
    store.extend_session(session.id, T0 + 10_000, T0 + 10_000 + SESSION_TTL_MS)
    expected = replace(session, last_seen_at=T0 + 10_000, expires_at=T0 + 10_000 + SESSION_TTL_MS)
    assert expected == store.get_session(session.id)


def test_extend_session_never_shortens_expiry(store: Store) -> None:
    """An extension to an earlier expiry than the stored one is ignored."""
    session = make_session()
    store.insert_session(session)
    store.extend_session(session.id, T0 + 20_000, T0 + 20_000 + SESSION_TTL_MS)
    extended = store.get_session(session.id)
    store.extend_session(session.id, T0 + 10_000, T0 + 10_000 + SESSION_TTL_MS)
    assert extended == store.get_session(session.id)


def test_mark_session_reconciled_sets_reconciled_at(store: Store) -> None:
    """Marking records the reconciliation instant and nothing else."""
    session = make_session()
    store.insert_session(session)
    store.mark_session_reconciled(session.id, T0 + 500)
    assert replace(session, reconciled_at=T0 + 500) == store.get_session(session.id)


def test_extend_after_mark_keeps_reconciled_at(store: Store) -> None:
    """An extension does not clobber an earlier reconciliation mark."""
    session = make_session()
    store.insert_session(session)
    store.mark_session_reconciled(session.id, T0 + 500)
    store.extend_session(session.id, T0 + 1_000, T0 + 1_000 + SESSION_TTL_MS)
    expected = replace(
        session,
        reconciled_at=T0 + 500,
        last_seen_at=T0 + 1_000,
        expires_at=T0 + 1_000 + SESSION_TTL_MS,
    )
    assert expected == store.get_session(session.id)


def test_mark_after_extend_keeps_expiry(store: Store) -> None:
    """A reconciliation mark does not clobber an earlier extension."""
    session = make_session()
    store.insert_session(session)
    store.extend_session(session.id, T0 + 1_000, T0 + 1_000 + SESSION_TTL_MS)
    store.mark_session_reconciled(session.id, T0 + 1_500)
    expected = replace(
        session,
        reconciled_at=T0 + 1_500,
        last_seen_at=T0 + 1_000,
        expires_at=T0 + 1_000 + SESSION_TTL_MS,
    )
    assert expected == store.get_session(session.id)


def test_extend_or_mark_of_unknown_session_creates_nothing(store: Store) -> None:
    """Touching a session that was never inserted neither raises nor creates it."""
    store.extend_session("sess-ghost", T0, T0 + SESSION_TTL_MS)
    store.mark_session_reconciled("sess-ghost", T0)
    assert store.get_session("sess-ghost") is None


# -- users and API tokens ------------------------------------------------------------------------


def test_user_by_api_token_finds_the_tokens_user(store: Store) -> None:
    """Each inserted token hash leads to its user; an unknown hash gives None."""
    ada, grace = make_user("user-1", name="ada"), make_user("user-2", name="grace")
    store.insert_user(ada)
    store.insert_user(grace)
    store.insert_api_token("token-hash-1", ada.id, T0)
    store.insert_api_token("token-hash-2", ada.id, T0 + 1)
    store.insert_api_token("token-hash-3", grace.id, T0 + 2)
    assert ada == store.user_by_api_token("token-hash-1")
    assert ada == store.user_by_api_token("token-hash-2")
    assert grace == store.user_by_api_token("token-hash-3")
    assert store.user_by_api_token("token-hash-unknown") is None


def test_insert_api_token_with_duplicate_hash_raises(store: Store) -> None:
    """A token hash can belong to one user only; the first keeps it."""
    ada, grace = make_user("user-1", name="ada"), make_user("user-2", name="grace")
    store.insert_user(ada)
    store.insert_user(grace)
    store.insert_api_token("token-hash-1", ada.id, T0)
    with pytest.raises(AlreadyExists):
        store.insert_api_token("token-hash-1", grace.id, T0 + 1)
    assert ada == store.user_by_api_token("token-hash-1")


def test_replace_api_tokens_leaves_the_new_token_the_users_only_one(store: Store) -> None:
    """The user's old tokens lead nowhere; the new one leads to them; others' are untouched."""
    ada, grace = make_user("user-1", name="ada"), make_user("user-2", name="grace")
    store.insert_user(ada)
    store.insert_user(grace)
    store.insert_api_token("token-hash-1", ada.id, T0)
    store.insert_api_token("token-hash-2", ada.id, T0 + 1)
    store.insert_api_token("token-hash-3", grace.id, T0 + 2)
    store.replace_api_tokens(ada.id, "token-hash-4", T0 + 3)
    found = [store.user_by_api_token(f"token-hash-{n}") for n in range(1, 5)]
    assert found == [None, None, grace, ada]


def test_set_password_hash_sets_and_clears_a_users_password(store: Store) -> None:
    """A stored password hash is read back with the user; None clears it."""
    ada = make_user("user-1", name="ada")
    store.insert_user(ada)
    store.set_password_hash(ada.id, "$argon2id$v=19$hash")
    with_password = store.get_user(ada.id)
    store.set_password_hash(ada.id, None)
    assert (with_password, store.get_user(ada.id)) == (
        replace(ada, password_hash="$argon2id$v=19$hash"),
        ada,
    )


def test_set_user_disabled_marks_and_clears_a_user(store: Store) -> None:
    """A disabled user reads back disabled, by id, name, token and listing; enabling clears
    it; an unknown id changes nothing."""
    ada = make_user("user-1", name="ada")
    store.insert_user(ada)
    store.insert_api_token("token-hash-1", ada.id, T0)
    store.set_user_disabled(ada.id, True)
    store.set_user_disabled("user-unknown", True)
    disabled = replace(ada, disabled=True)
    seen = (
        store.get_user(ada.id),
        store.user_by_name("ada"),
        store.user_by_api_token("token-hash-1"),
        store.list_users(),
    )
    store.set_user_disabled(ada.id, False)
    assert seen == (disabled, disabled, disabled, [disabled])
    assert store.get_user(ada.id) == ada


# -- servers -------------------------------------------------------------------------------------


def test_servers_of_user_are_the_owned_and_administered_ones(store: Store) -> None:
    """A user's servers are those they own or administer, and no others."""
    owned = make_server("srv-1", name="owned", owner_id="user-1")
    administered = make_server("srv-2", name="admin", owner_id="user-2", admin_ids=("user-1",))
    unrelated = make_server("srv-3", name="other", owner_id="user-2", admin_ids=("user-3",))
    for server in (unrelated, administered, owned):
        store.insert_server(server)
    assert [owned, administered] == by_id(store.servers_of_user("user-1"))
    assert [administered, unrelated] == by_id(store.servers_of_user("user-2"))
    assert [unrelated] == by_id(store.servers_of_user("user-3"))
    assert store.servers_of_user("user-4") == []


def test_servers_of_user_follow_administrator_changes(store: Store) -> None:
    """Adding or removing an administrator changes which servers are theirs."""
    server = make_server(owner_id="user-1")
    store.insert_server(server)
    assert store.servers_of_user("user-2") == []
    promoted = replace(server, version=2, admin_ids=("user-2",))
    assert store.replace_server(promoted, expected_version=1)
    assert [promoted] == store.servers_of_user("user-2")
    demoted = replace(promoted, version=3, admin_ids=())
    assert store.replace_server(demoted, expected_version=2)
    assert store.servers_of_user("user-2") == []


def test_delete_server_is_refused_while_any_of_its_jobs_is_not_terminal(store: Store) -> None:
    """A server with waiting or active jobs stays; the answer is how many are not terminal."""
    store.insert_server(make_server())
    queued = make_job("job-queued")
    active = running(accepted(make_job("job-running"), at=T0 + 1), at=T0 + 2)
    other = make_job("job-other", server_id="srv-2")
    insert_jobs(store, queued, active, other, with_state(make_job("job-done"), JobState.FAILED))
    assert store.delete_server("srv-1") == 2
    assert store.get_server("srv-1") == make_server()


def test_delete_server_removes_it_and_keeps_its_ended_jobs(store: Store) -> None:
    """A server whose jobs all ended is deleted (gone from every listing); its jobs stay."""
    server = make_server(owner_id="user-1", admin_ids=("user-2",))
    store.insert_server(server)
    done = with_state(make_job(), JobState.SUCCEEDED)
    store.insert_job(done)
    assert store.delete_server("srv-1") == 0
    assert store.get_server("srv-1") is None
    assert store.list_servers() == []
    assert store.servers_of_user("user-2") == []
    assert store.get_job(done.id) == done


def test_delete_server_of_unknown_id_answers_zero(store: Store) -> None:
    """Deleting a server that does not exist changes nothing."""
    assert store.delete_server("srv-ghost") == 0


# -- console sessions --------------------------------------------------------------------------


def test_web_sessions_find_their_user_until_they_expire(store: Store) -> None:
    """A session hash maps to its user while unexpired; deleting it ends it at once."""
    user = make_user("usr-web", name="web")
    store.insert_user(user)
    store.insert_web_session("hash-1", user.id, T0, T0 + 1_000)
    assert user == store.web_session_user("hash-1", T0 + 999)
    assert store.web_session_user("hash-1", T0 + 1_000) is None
    assert store.web_session_user("hash-unknown", T0) is None
    store.delete_web_session("hash-1")
    assert store.web_session_user("hash-1", T0) is None
    store.insert_web_session("hash-2", user.id, T0, T0 + 1_000)
    with pytest.raises(AlreadyExists):
        store.insert_web_session("hash-2", user.id, T0, T0 + 1_000)


def test_idempotency_keys_are_per_user_and_taken_once(store: Store) -> None:
    """A key records one (fingerprint, jobs) per user; reusing it is AlreadyExists and stores
    none of the second request's jobs."""
    first = IdempotencyRecord("usr-1", "key", "fp-1", ("job-1",), T0)
    other_user = IdempotencyRecord("usr-2", "key", "fp-2", ("job-2", "job-3"), T0)
    store.insert_jobs([make_job("job-1")], first)
    store.insert_jobs([make_job("job-2"), make_job("job-3")], other_user)
    assert store.idempotency_record("usr-1", "key") == first
    assert store.idempotency_record("usr-2", "key") == other_user
    assert store.idempotency_record("usr-1", "other") is None
    with pytest.raises(AlreadyExists):
        store.insert_jobs(
            [make_job("job-4")], IdempotencyRecord("usr-1", "key", "fp-3", ("job-4",), T0)
        )
    assert store.get_job("job-4") is None
