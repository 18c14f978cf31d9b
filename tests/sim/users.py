"""Simulated users: they create jobs (alone or in batches, mostly with an Idempotency-Key that
they reuse when they retry a request whose answer did not come), cancel jobs, read them
and delete some, over the same simulated network as the Runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from moonrun.errors import MoonrunError
from moonrun.run.client import TRANSIENT
from moonrun.scheduling.records import Server, User
from moonrun.service.specs import JobSpec
from tests.sim.kernel import Body, Call, LocalClock, Node, Resume, Sleep

if TYPE_CHECKING:
    from tests.sim.world import Simulation

USER_TIMEOUT_MS = 2000
USER_RETRIES = 12


class UserNode(Node):
    def __init__(self, sim: Simulation, user: User, servers: list[Server]) -> None:
        super().__init__(sim.scheduler, "user", LocalClock(sim.scheduler))
        self.sim = sim
        self.user = user
        self.servers = servers
        self.known: list[str] = []
        """Ids of the jobs this user was told about, in the order it learned them."""
        self._keys = 0

    def rpc(self, call: Call, resume: Resume) -> None:
        self.sim.send(self, call, resume)

    def busy(self) -> bool:
        return any(not task.done for task in self.tasks)

    def create(self) -> None:
        self.spawn(self._create(), "create")

    def fanout(self) -> None:
        self.spawn(self._fanout(), "fanout")

    def cancel(self) -> None:
        if self.known:
            self.spawn(self._cancel(self.sim.rng.choice(self.known)), "cancel")

    def read(self) -> None:
        if self.known:
            self.spawn(self._read(self.sim.rng.choice(self.known)), "read")

    def delete(self) -> None:
        if self.known:
            self.spawn(self._delete(self.sim.retention_rng.choice(self.known)), "delete")

    def _retrying(self, call: Call, *, retry: bool) -> Body:
        """Send until answered (a refusal counts as an answer); at most USER_RETRIES times."""
        rng = self.sim.rng
        for _ in range(USER_RETRIES if retry else 1):
            answer = yield call
            if not isinstance(answer, TRANSIENT):
                return answer
            yield Sleep(rng.randint(300, 1500))
        return None

    def _create(self) -> Body:
        rng, user = self.sim.rng, self.user
        server = rng.choice(self.servers)
        specs = [self.sim.job_spec() for _ in range(1 if rng.random() < 0.8 else rng.randint(2, 4))]
        key: str | None = None
        if rng.random() < 0.85:
            self._keys += 1
            key = f"sim-key-{self._keys}"
        call: Call
        if len(specs) == 1:
            spec = specs[0]
            fields: dict[str, Any] = {
                "kind": spec.kind,
                "payload": spec.payload,
                "max_attempts": spec.max_attempts,
                "backoff": spec.backoff,
                "not_before": spec.not_before,
                "idempotency_key": key,
                "concurrency": spec.concurrency,
                "priority": spec.priority,
            }
            # Now and then a job waits on one or two jobs the user already knows of.
            chooser = self.sim.dependency_rng
            if self.known and chooser.random() < 0.3:
                count = min(len(self.known), chooser.randint(1, 2))
                fields["after"] = chooser.sample(self.known, count)
            call = Call(
                "create_job",
                (user, server.id),
                USER_TIMEOUT_MS,
                fields,
                signed=False,
                entries={"idempotency_key": key},
            )
        else:
            call = Call(
                "create_jobs",
                (user, server.id, specs),
                USER_TIMEOUT_MS,
                {"idempotency_key": key},
                signed=False,
                entries={"idempotency_key": key},
            )
        # Without a key a retry could make a second job: such a user does not retry.
        answer = yield from self._retrying(call, retry=key is not None)
        for job in answer if isinstance(answer, list) else [answer]:
            if job is not None and not isinstance(job, MoonrunError):
                self.known.append(job.id)

    def _fanout(self) -> Body:
        """One job on every server (all are labelled role=sim) as a group, mostly one or two
        at a time, now and then stopping on a failure; always with a key (it retries)."""
        rng = self.sim.rng
        self._keys += 1
        key = f"sim-fanout-{self._keys}"
        call = Call(
            "groups.fanout",
            (self.user, "role=sim", self.sim.job_spec()),
            USER_TIMEOUT_MS,
            {
                "max_parallel": rng.choice([1, 1, 2, None]),
                "stop_on_failure": rng.random() < 0.3,
                "idempotency_key": key,
            },
            signed=False,
            entries={"idempotency_key": key},
        )
        answer = yield from self._retrying(call, retry=True)
        for job in getattr(answer, "jobs", ()):
            self.known.append(job.id)

    def _cancel(self, job_id: str) -> Body:
        user = self.user
        call = Call(
            "cancel_job",
            (user, job_id),
            USER_TIMEOUT_MS,
            signed=False,
            entries={job_id: None},
        )
        yield from self._retrying(call, retry=True)  # idempotent

    def _read(self, job_id: str) -> Body:
        user = self.user
        call = Call(
            "get_job",
            (user, job_id),
            USER_TIMEOUT_MS,
            signed=False,
            entries={job_id: None},
        )
        yield from self._retrying(call, retry=False)

    def _delete(self, job_id: str) -> Body:
        """`DELETE /api/v1/jobs/{id}`: refused while the job has not ended or something still
        needs it (the checker's `pruned_needed` judges what it deleted)."""
        call = Call(
            "delete_job",
            (self.user, job_id, _no_files),
            USER_TIMEOUT_MS,
            signed=False,
            entries={job_id: None},
        )
        yield from self._retrying(call, retry=True)  # a second delete is only 404


def _no_files(job: Any) -> None:
    """What a delete forgets beside the store: the simulation keeps no logs or artifacts."""


def spec_of(sim: Simulation) -> JobSpec:
    """A random job: mostly resumable work of a few seconds that may fail a few times."""
    rng = sim.rng
    roll = rng.random()
    kind = "sim.work" if roll < 0.75 else "sim.once" if roll < 0.97 else "sim.unknown"
    duration = rng.choice(
        [rng.randint(20, 500), rng.randint(500, 4000), rng.randint(500, 4000), sim.max_work_ms]
    )
    payload: dict[str, Any] = {"ms": rng.randint(20, duration)}
    fail = rng.choice([0, 0, 0, 1, 1, 2, 3])
    if fail:
        payload["fail"] = fail
    if rng.random() < 0.1:
        payload["fatal"] = True
    max_attempts = None if rng.random() < 0.6 else rng.randint(1, 4)
    backoff = None
    if rng.random() < 0.3:
        initial = round(rng.uniform(0.05, 1.0), 3)
        backoff = {
            "initial_s": initial,
            "multiplier": round(rng.uniform(1.0, 3.0), 3),
            "max_s": round(rng.uniform(initial, sim.max_backoff_s), 3),
        }
    not_before = None
    if rng.random() < 0.15:
        not_before = sim.scheduler.now() + rng.randint(-2000, sim.max_not_before_ms)
    concurrency = None
    if rng.random() < 0.3:
        key = rng.choice(list(KEY_LIMITS))
        concurrency = {"key": key, "limit": KEY_LIMITS[key]}
    # Most jobs take the default; some are urgent, some can wait (drawn apart, so that a seed's
    # other draws stay as they were before jobs had priorities).
    chooser = sim.priority_rng
    priority = None if chooser.random() < 0.5 else chooser.choice([0, 2, 5, 7, 9])
    return JobSpec(
        kind=kind,
        payload=payload,
        max_attempts=max_attempts,
        backoff=backoff,
        not_before=not_before,
        concurrency=concurrency,
        priority=priority,
    )


KEY_LIMITS: dict[str, int] = {"sim-one": 1, "sim-two": 2}
"""The concurrency keys jobs may carry, each always with its one limit."""
