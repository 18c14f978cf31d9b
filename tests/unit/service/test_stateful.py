"""A Hypothesis state machine that interleaves everything Run, users and time can do.

Two endpoints with one Run each, a manual clock, and rules for create, claim, ack, progress,
cancel-poll, result (replays and conflicting ones included), user cancel, clock advances,
sweeps, retention (the sweeper's pruning and users' deletes), reconcile with good and stale
entries, session rotation, messages with stale attempt/lease/session/endpoint, and platform
restarts (a new service over the same store).
The invariants hold after every step. `make soak` raises the counts; a failure prints its seed.
"""

from __future__ import annotations

import os
from dataclasses import fields
from typing import Any

from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    get_state_machine_test,
    initialize,
    invariant,
    rule,
)

from moonrun.errors import (
    Forbidden,
    JobNotFinished,
    JobRejected,
    MoonrunError,
    NotFound,
    SessionExpired,
    SessionRotated,
    StaleAttempt,
)
from moonrun.scheduling.fingerprint import token_hash
from moonrun.scheduling.jobs import FailureReason, Job, JobState
from moonrun.scheduling.messages import Evidence
from moonrun.scheduling.reconcile import ReconcileEntry
from moonrun.scheduling.records import User
from moonrun.service.config import SchedulingSettings
from tests.support.harness import Run, World
from tests.support.seeds import seed_from
from tests.support.stores import StoreFactory

FAST = SchedulingSettings(
    ack_timeout_s=3,
    lease_ttl_s=4,
    session_ttl_s=10,
    heartbeat_interval_s=2,
    max_attempts=3,
    backoff_initial_s=1,
    backoff_multiplier=2,
    backoff_max_s=4,
    backoff_jitter=0.5,
    session_extend_granularity_s=0,
    retain_finished_s=5,
    transfer_grace_s=2,
)
RETAIN_MS = 5_000
"""What `prune` keeps a finished job for here: FAST's retention, which is past its grace."""
ENDPOINTS = ("a", "b")
FINISHES: list[tuple[str, bool] | None] = [
    None,
    ("succeeded", False),
    ("failed", True),
    ("failed", False),
    ("cancelled", False),
]
MAX_JOBS = 10
UNCHANGED_BY_DEADLINE = (
    "id",
    "server_id",
    "endpoint_id",
    "kind",
    "payload_json",
    "policy",
    "attempt",
    "lease_hash",
    "session_generation",
    "claimed_at",
    "progress",
    "result",
    "reconcile",
    "created_at",
)

RUNS = {"memory": (500, 50), "file": (200, 50), "mysql": (100, 30), "postgres": (100, 30)}
"""Examples x steps per store in `make test`; `make soak` raises them through the environment."""


def run_counts(store: str) -> tuple[int, int]:
    examples, steps = RUNS[store]
    return (
        int(os.environ.get("MOONRUN_STATEFUL_EXAMPLES", examples)),
        int(os.environ.get("MOONRUN_STATEFUL_STEPS", steps)),
    )


def check_rejection(before: Job, after: Job, now: int) -> None:
    """A rejected message changes nothing, except applying a deadline that had already passed."""
    if after == before:
        return
    assert before.deadline_at is not None, (before, after)
    assert before.deadline_at <= now, (before, after)
    assert not after.state.is_active
    assert after.last_failure is not None
    assert after.last_failure.reason in (FailureReason.ACK_TIMEOUT, FailureReason.LEASE_EXPIRED)
    assert after.last_failure.attempt == before.attempt
    for name in UNCHANGED_BY_DEADLINE:
        assert getattr(before, name) == getattr(after, name), name


class SchedulingMachine(RuleBasedStateMachine):
    def __init__(self, factory: StoreFactory) -> None:
        super().__init__()
        self.world = World(factory, settings=FAST)
        w = self.world
        self.runs: dict[str, Run] = {"a": w.run(w.endpoint), "b": w.run(w.other_endpoint)}
        for run in self.runs.values():
            run.start(capacity=2)
        self.servers = {"a": w.server, "b": w.other_server}
        self.owners: dict[str, User] = {"a": w.owner, "b": w.stranger}
        self.rotated: dict[str, list[str]] = {"a": [], "b": []}
        self.job_ids: list[str] = []
        self.job_endpoint: dict[str, str] = {}
        self.grants: dict[str, list[tuple[int, str]]] = {}
        self.snapshot: dict[str, Job] = {}
        self.generations: dict[str, int] = {}
        self.leases: set[str] = set()
        self.recorded: dict[tuple[str, int], str] = {}
        self.reported: dict[tuple[str, int], tuple[str, bool, dict[str, int] | None]] = {}
        self.deleted: set[str] = set()

    def teardown(self) -> None:
        self.world.store.close()

    # -- helpers -----------------------------------------------------------------------------

    def _job(self, index: int) -> str | None:
        """A job to target, preferring ones that were ever claimed (that is where fences matter)."""
        granted = [job_id for job_id in self.job_ids if self.grants[job_id]]
        pool = granted if granted and index % 4 else self.job_ids
        return pool[index % len(pool)] if pool else None

    def _evidence(self, job_id: str, choice: str) -> Evidence:
        grants = self.grants.get(job_id) or [(1, "mrl_never-granted")]
        attempt, lease = grants[-1]
        if choice == "older" and len(grants) > 1:
            attempt, lease = grants[-2]
        elif choice == "older_lease" and len(grants) > 1:
            lease = grants[-2][1]
        elif choice == "forged":
            lease = "mrl_forged-" + lease[-6:]
        return Evidence(attempt, lease)

    def _sender(self, job_id: str, choice: str) -> str:
        home = self.job_endpoint[job_id]
        if choice == "other":
            return self.runs["b" if home == "a" else "a"].session_id
        if choice == "rotated" and self.rotated[home]:
            return self.rotated[home][-1]
        return self.runs[home].session_id

    def _send(self, job_id: str, sender: str, evidence: Evidence, send: Any) -> None:
        before = self.world.job(job_id)
        now = self.world.clock.now()
        try:
            send(sender, job_id, evidence)
        except MoonrunError as error:
            check_rejection(before, self.world.job(job_id), now)
            self._check_stale_attempt(job_id, sender, evidence, before, error)
            return
        # Accepted: only the latest grant, from the home endpoint's current session, may be,
        # and an active attempt only from the generation it is bound to.
        home = self.job_endpoint[job_id]
        assert sender == self.runs[home].session_id
        assert (evidence.attempt, evidence.lease) == self.grants[job_id][-1]
        session = self.world.store.get_session(sender)
        assert session is not None
        if before.state.is_active and (before.deadline_at or 0) > now:
            assert before.session_generation == session.generation

    def _check_stale_attempt(
        self, job_id: str, sender: str, evidence: Evidence, before: Job, error: MoonrunError
    ) -> None:
        """From the home session, a job message naming another attempt is stale_attempt."""
        home = self.runs[self.job_endpoint[job_id]].session_id
        if isinstance(error, JobRejected) and evidence.attempt != before.attempt and sender == home:
            assert isinstance(error, StaleAttempt), error

    # -- rules -------------------------------------------------------------------------------

    @initialize(
        jobs=st.lists(
            st.tuples(st.sampled_from(ENDPOINTS), st.integers(1, 3)), min_size=1, max_size=4
        )
    )
    def seed_jobs(self, jobs: list[tuple[str, int]]) -> None:
        for endpoint, max_attempts in jobs:
            self.create(endpoint, max_attempts, 0)

    @rule(
        endpoint=st.sampled_from(ENDPOINTS),
        max_attempts=st.integers(1, 3),
        delay=st.sampled_from([0, 0, 500, 3000]),
    )
    def create(self, endpoint: str, max_attempts: int, delay: int) -> None:
        if len(self.job_ids) >= MAX_JOBS:
            return
        job = self.world.service.create_job(
            self.owners[endpoint],
            self.servers[endpoint].id,
            kind="noop",
            max_attempts=max_attempts,
            not_before=self.world.clock.now() + delay,
        )
        self.job_ids.append(job.id)
        self.job_endpoint[job.id] = endpoint
        self.grants[job.id] = []

    @rule(endpoint=st.sampled_from(ENDPOINTS), count=st.integers(1, 3))
    def claim(self, endpoint: str, count: int) -> None:
        now = self.world.clock.now()
        before = {job_id: self.world.job(job_id) for job_id in self.job_ids}
        try:
            granted = self.world.service.claim(self.runs[endpoint].session_id, count)
        except MoonrunError:
            return
        for grant in granted:
            prior = before[grant.job_id]
            assert prior.state.is_waiting
            assert prior.eligible_at <= now
            assert prior.cancel is None
            assert prior.attempt + 1 == grant.attempt <= prior.max_attempts
            assert self.job_endpoint[grant.job_id] == endpoint
            self.grants[grant.job_id].append((grant.attempt, grant.lease))
            self.runs[endpoint].leases[(grant.job_id, grant.attempt)] = grant.lease
            self.leases.add(grant.lease)

    @rule(
        endpoint=st.sampled_from(ENDPOINTS),
        seq=st.integers(1, 1000),
        count=st.integers(1, 2),
        finish=st.sampled_from(FINISHES),
    )
    def drive(self, endpoint: str, seq: int, count: int, finish: tuple[str, bool] | None) -> None:
        """A well-behaved Run: heartbeat (registering and reconciling again when told to), claim,
        ack what it holds, report progress, and maybe finish one running job."""
        run = self.runs[endpoint]
        service = self.world.service
        try:
            run.heartbeat()
        except (SessionExpired, SessionRotated):
            self.rotate_session(endpoint, 2)
        session = self.world.store.get_session(run.session_id)
        if session is not None and session.reconciled_at is None:
            self.reconcile(endpoint, "journal", [])
        self.claim(endpoint, count)
        for job_id in self.job_ids:
            if self.job_endpoint[job_id] != endpoint or not self.grants[job_id]:
                continue
            state = self.world.job(job_id).state
            if state is JobState.ACCEPTED:
                self._send(job_id, run.session_id, self._evidence(job_id, "latest"), service.ack)
            elif state is JobState.RUNNING and finish is not None:
                outcome, retryable = finish
                finish = None
                self._report(job_id, run.session_id, "latest", outcome, retryable, None)
            elif state is JobState.RUNNING:
                self._send(
                    job_id,
                    run.session_id,
                    self._evidence(job_id, "latest"),
                    lambda s, j, e: service.progress(s, j, e, seq=seq),
                )

    @rule(endpoint=st.sampled_from(ENDPOINTS), capacity=st.integers(1, 3))
    def rotate_session(self, endpoint: str, capacity: int) -> None:
        run = self.runs[endpoint]
        self.rotated[endpoint].append(run.session_id)
        run.register(capacity=capacity, boot_id=f"boot-{len(self.rotated[endpoint])}")

    @rule(
        endpoint=st.sampled_from(ENDPOINTS),
        mode=st.sampled_from(["journal", "empty", "stale", "partial"]),
        picks=st.lists(st.integers(0, 40), max_size=4),
    )
    def reconcile(self, endpoint: str, mode: str, picks: list[int]) -> None:
        mine = [j for j in self.job_ids if self.job_endpoint[j] == endpoint and self.grants[j]]
        entries: dict[str, ReconcileEntry] = {}
        if mode in ("journal", "partial"):
            chosen = mine if mode == "journal" else [mine[p % len(mine)] for p in picks if mine]
            for job_id in chosen:
                attempt, lease = self.grants[job_id][-1]
                entries[job_id] = ReconcileEntry(job_id, attempt, lease)
        elif mode == "stale":
            for p in picks:
                if not self.job_ids:
                    entries["job_unknown"] = ReconcileEntry("job_unknown", 1, "mrl_x")
                    continue
                job_id = self.job_ids[p % len(self.job_ids)]
                evidence = self._evidence(job_id, ["older", "older_lease", "forged"][p % 3])
                entries[job_id] = ReconcileEntry(job_id, evidence.attempt, evidence.lease)
        before = {job_id: self.world.job(job_id) for job_id in self.job_ids}
        run = self.runs[endpoint]
        try:
            report = self.world.service.reconcile(run.session_id, list(entries.values()))
        except MoonrunError:
            return
        session = self.world.store.get_session(run.session_id)
        assert session is not None
        for confirmed in report.confirmed:
            stored = self.world.job(confirmed.job_id)
            assert stored.state.is_active
            assert stored.session_generation == session.generation
            assert (confirmed.attempt, entries[confirmed.job_id].lease) == self.grants[
                confirmed.job_id
            ][-1]
        for lost in report.lost:
            assert before[lost.job_id].state.is_active
            assert not self.world.job(lost.job_id).state.is_active
        for job_id, prior in before.items():
            confirmed_ids = {c.job_id for c in report.confirmed}
            lost_ids = {lost.job_id for lost in report.lost}
            if job_id not in confirmed_ids | lost_ids:
                check_rejection(prior, self.world.job(job_id), self.world.clock.now())

    @rule(
        kind=st.sampled_from(["ack", "progress", "cancel_poll"]),
        index=st.integers(0, MAX_JOBS),
        evidence=st.sampled_from(["latest", "latest", "latest", "older", "older_lease", "forged"]),
        sender=st.sampled_from(["own", "own", "own", "other", "rotated"]),
        seq=st.integers(0, 4),
    )
    def message(self, kind: str, index: int, evidence: str, sender: str, seq: int) -> None:
        job_id = self._job(index)
        if job_id is None:
            return
        service = self.world.service
        send = {
            "ack": service.ack,
            "cancel_poll": service.cancel_poll,
            "progress": lambda s, j, e: service.progress(s, j, e, seq=seq, percent=seq * 20),
        }[kind]
        self._send(job_id, self._sender(job_id, sender), self._evidence(job_id, evidence), send)

    @rule(
        index=st.integers(0, MAX_JOBS),
        outcome=st.sampled_from(["succeeded", "failed", "failed", "cancelled"]),
        retryable=st.booleans(),
        output=st.sampled_from([None, {"n": 1}]),
        evidence=st.sampled_from(["latest", "latest", "latest", "older", "forged"]),
        sender=st.sampled_from(["own", "own", "own", "other", "rotated"]),
    )
    def result(
        self,
        index: int,
        outcome: str,
        retryable: bool,
        output: dict[str, int] | None,
        evidence: str,
        sender: str,
    ) -> None:
        job_id = self._job(index)
        if job_id is None:
            return
        self._report(job_id, self._sender(job_id, sender), evidence, outcome, retryable, output)

    def _report(
        self,
        job_id: str,
        sender: str,
        evidence: str,
        outcome: str,
        retryable: bool,
        output: dict[str, int] | None,
    ) -> None:
        proof = self._evidence(job_id, evidence)

        def send(session_id: str, job: str, proof: Evidence) -> None:
            answer = self.world.service.result(
                session_id, job, proof, outcome=outcome, retryable=retryable, output=output
            )
            recorded = self.recorded.setdefault((job, proof.attempt), answer.fingerprint)
            assert recorded == answer.fingerprint
            self.reported[(job, proof.attempt)] = (outcome, retryable, output)

        self._send(job_id, sender, proof, send)

    @rule(index=st.integers(0, MAX_JOBS))
    def replay_result(self, index: int) -> None:
        """Run resends the result it last got accepted; the same answer comes back, replayed."""
        job_id = self._job(index)
        if job_id is None or not self.grants[job_id]:
            return
        attempt, lease = self.grants[job_id][-1]
        reported = self.reported.get((job_id, attempt))
        if reported is None:
            return
        outcome, retryable, output = reported
        run = self.runs[self.job_endpoint[job_id]]
        try:
            answer = self.world.service.result(
                run.session_id,
                job_id,
                Evidence(attempt, lease),
                outcome=outcome,
                retryable=retryable,
                output=output,
            )
        except (SessionExpired, SessionRotated):
            return
        assert answer.replayed is True
        assert self.recorded[(job_id, attempt)] == answer.fingerprint

    @rule(index=st.integers(0, MAX_JOBS), actor=st.sampled_from(["owner", "stranger", "admin"]))
    def user_cancel(self, index: int, actor: str) -> None:
        job_id = self._job(index)
        if job_id is None:
            return
        home = self.job_endpoint[job_id]
        user = {
            "owner": self.owners[home],
            "stranger": self.owners["b" if home == "a" else "a"],
            "admin": self.world.admin,
        }[actor]
        before = self.world.job(job_id)
        try:
            outcome = self.world.service.cancel_job(user, job_id)
        except Forbidden:
            assert actor == "stranger"
            assert before == self.world.job(job_id)
            return
        assert actor != "stranger"
        job = outcome.job
        assert job.state.is_terminal or job.cancel is not None
        if before.cancel is not None or before.state.is_terminal:
            assert before.cancel == job.cancel or before.deadline_at is not None

    @rule(ms=st.sampled_from([1, 250, 999, 1000, 1000, 2000, 3000, 4000, 6000]))
    def advance(self, ms: int) -> None:
        self.world.clock.advance(ms)

    @rule(endpoint=st.sampled_from(ENDPOINTS))
    def heartbeat(self, endpoint: str) -> None:
        try:
            self.runs[endpoint].heartbeat()
        except MoonrunError:
            return

    @rule()
    def sweep(self) -> None:
        self.world.service.sweep()

    @rule()
    def prune(self) -> None:
        """The sweeper's retention pass: only a finished job that ended RETAIN_MS ago or more
        goes, with nothing of it left behind."""
        now = self.world.clock.now()
        for job in self.world.service.prune(lambda job: None):
            prior = self.snapshot[job.id]
            assert prior.state.is_terminal
            assert job == prior
            assert prior.terminal is not None
            assert prior.terminal.at <= now - RETAIN_MS
            self._deleted(job.id)

    @rule(index=st.integers(0, MAX_JOBS), actor=st.sampled_from(["owner", "stranger", "admin"]))
    def user_delete(self, index: int, actor: str) -> None:
        """A user deletes a job: only a finished one, only one they may manage (404 else)."""
        job_id = self._job(index)
        if job_id is None:
            return
        home = self.job_endpoint[job_id]
        user = {
            "owner": self.owners[home],
            "stranger": self.owners["b" if home == "a" else "a"],
            "admin": self.world.admin,
        }[actor]
        before = self.world.job(job_id)
        try:
            self.world.service.delete_job(user, job_id, lambda job: None)
        except NotFound:
            assert actor == "stranger"
            assert before == self.world.job(job_id)
            return
        except JobNotFinished:
            assert not before.state.is_terminal
            assert before == self.world.job(job_id)
            return
        assert actor != "stranger"
        assert before.state.is_terminal
        self._deleted(job_id)

    def _deleted(self, job_id: str) -> None:
        self.job_ids.remove(job_id)
        self.deleted.add(job_id)

    @rule()
    def restart(self) -> None:
        """A platform restart: close the store, reopen it as a new object, new services."""
        self.world.restart()

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def jobs_obey_the_rules(self) -> None:
        for job_id in self.job_ids:
            job = self.world.job(job_id)
            prior = self.snapshot.get(job_id)
            grants = self.grants[job_id]
            assert job.attempt <= job.max_attempts
            assert len(grants) == job.attempt
            if grants:
                assert token_hash(grants[-1][1]) == job.lease_hash
            if prior is not None:
                assert job.attempt >= prior.attempt
                assert job.version >= prior.version
                if prior.state.is_terminal:
                    assert job == prior
            assert job.state.is_terminal == (job.terminal is not None)
            if job.state.is_active:
                assert job.deadline_at is not None
                assert job.session_generation is not None
            if job.state.is_waiting:
                assert job.cancel is None
            if job.state.is_terminal and job.cancel is not None:
                assert job.cancel.result is not None
            self.snapshot[job_id] = job

    @invariant()
    def a_deleted_job_stays_gone(self) -> None:
        assert self.world.store.get_jobs(self.deleted) == {}

    @invariant()
    def generations_never_decrease(self) -> None:
        for endpoint in (self.world.endpoint, self.world.other_endpoint):
            stored = self.world.store.get_endpoint(endpoint.id)
            assert stored is not None
            assert stored.generation >= self.generations.get(endpoint.id, 0)
            self.generations[endpoint.id] = stored.generation

    @invariant()
    def no_raw_lease_in_the_store(self) -> None:
        store = self.world.store
        text = repr([store.get_job(job_id) for job_id in self.job_ids])
        text += repr([store.get_session(run.session_id) for run in self.runs.values()])
        text += repr(store.list_endpoints())
        for lease in self.leases:
            assert lease[4:] not in text


def test_scheduling_state_machine(store_factory: StoreFactory) -> None:
    """Random interleavings of every message, restart and clock move keep every invariant."""
    chosen_seed = seed_from("MOONRUN_HYPOTHESIS_SEED")
    examples, steps = run_counts(store_factory.name)
    machine_settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        print_blob=True,
    )
    test = get_state_machine_test(
        lambda: SchedulingMachine(store_factory), settings=machine_settings
    )
    try:
        seed(chosen_seed)(test)()
    except BaseException as failure:
        failure.add_note(f"reproduce with MOONRUN_HYPOTHESIS_SEED={chosen_seed}")
        raise


def test_machine_rules_cover_the_acceptance_list() -> None:
    """The machine has a rule for every interleaving the core issue names."""
    names = {f.name for f in fields(Job)}
    assert "lease_hash" in names
    rules = {
        "create",
        "claim",
        "rotate_session",
        "reconcile",
        "message",
        "result",
        "replay_result",
        "drive",
        "user_cancel",
        "advance",
        "heartbeat",
        "sweep",
        "restart",
        "prune",
        "user_delete",
    }
    assert rules <= set(vars(SchedulingMachine))
