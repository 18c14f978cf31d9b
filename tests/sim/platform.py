"""The platform side of the simulation: one or two platform processes ("instances"), each a
real `SchedulingService` and `Directory` over its own handle on the one store, with the parts
of the HTTP layer that decide whether a request reaches the service at all (an instance that
is down refuses connections; a signed request whose nonce this instance saw is `replayed`,
one created before it started or more than 300 s ago is `signature_expired`), and a sweeper.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from moonrun.clock import ManualClock
from moonrun.errors import (
    IllegalTransition,
    MoonrunError,
    PlatformUnreachable,
    Replayed,
    SignatureExpired,
)
from moonrun.scheduling.jobs import Job
from moonrun.scheduling.retention import PRUNE_BATCH_LIMIT
from moonrun.security.tokens import SeededTokenSource
from moonrun.service.answers import CancelOutcome, ClaimedJob, Registration
from moonrun.service.config import SchedulingSettings
from moonrun.service.directory import Directory
from moonrun.service.groups import FanOut
from moonrun.service.scheduling import SchedulingService
from moonrun.service.sweeper import RELEASE_PAGES
from moonrun.store.protocol import Store
from tests.sim.history import Cause, History, Snapshot
from tests.sim.kernel import Scheduler
from tests.sim.network import Network
from tests.sim.recording import RecordingStore, StoreKind, StoreWrapper

SIGNATURE_WINDOW_MS = 300_000
ABOUT_ONE_JOB = (
    "progress",
    "cancel_poll",
    "cancel_job",
    "get_job",
    "ack_many",
    "result_many",
    "delete_job",
)
"""Calls whose `entries` name the one job their answer (or whole refusal) is about."""
ServiceFactory = Callable[..., SchedulingService]
FIRE_INTERVAL_MS = 500
"""How often each instance runs a firing pass of the schedules (the app's is 250 ms)."""


@dataclass
class Request:
    sender: str
    kind: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    session_id: str | None
    nonce: str | None
    created: int
    entries: dict[str, Any]


@dataclass
class Instance:
    """One platform process."""

    index: int
    store: Store
    """The store as this process opened it (inside the recording wrapper)."""
    raw: Store
    service: SchedulingService
    directory: Directory
    started_at: int
    up: bool = True
    nonces: set[str] = field(default_factory=set)
    sweeper_paused_until: int = 0


class Platform:
    def __init__(
        self,
        *,
        scheduler: Scheduler,
        clock: ManualClock,
        network: Network,
        history: History,
        store_kind: StoreKind,
        settings: SchedulingSettings,
        token_seed: int,
        instances: int,
        wrap_store: StoreWrapper | None = None,
        service_class: ServiceFactory = SchedulingService,
        sweep_interval_ms: int = 1000,
        start_slack_ms: int = 0,
    ) -> None:
        self._scheduler = scheduler
        self._clock = clock
        self._network = network
        self._history = history
        self._store_kind = store_kind
        self._settings = settings
        self._tokens = SeededTokenSource(token_seed)
        self._wrap = wrap_store or (lambda store: store)
        self._service_class = service_class
        self.sweep_interval_ms = sweep_interval_ms
        self._start_slack_ms = start_slack_ms
        """How long before an instance started a signature may have been created (the real
        platform allows 1 s)."""
        self._calls = 0
        self.instances = [self._start(index, store_kind.open()) for index in range(instances)]
        for instance in self.instances:
            self._scheduler.after(sweep_interval_ms, lambda i=instance.index: self._sweep(i))
            self._scheduler.after(FIRE_INTERVAL_MS, lambda i=instance.index: self._fire(i))
            history.up[instance.index] = [(clock.now(), None)]

    def _start(self, index: int, raw: Store) -> Instance:
        store = RecordingStore(self._wrap(raw), self._history, self._clock)
        service = self._service_class(store, self._clock, self._tokens, self._settings)
        directory = Directory(store, self._clock, self._tokens)  # type: ignore[arg-type]
        return Instance(index, store, raw, service, directory, self._clock.now())  # type: ignore[arg-type]

    @property
    def service(self) -> SchedulingService:
        """The first instance's service (for setting the world up)."""
        return self.instances[0].service

    @property
    def directory(self) -> Directory:
        return self.instances[0].directory

    # -- requests ----------------------------------------------------------------------------

    def receive(self, index: int, request: Request, reply: Callable[[Any], None]) -> None:
        """A request reached instance `index`: answer it (`reply` sends the answer back)."""
        instance = self.instances[index]
        if not instance.up:
            reply(PlatformUnreachable("connection refused"))
            return
        now = self._clock.now()
        if request.nonce is not None:
            if request.created < instance.started_at - self._start_slack_ms or (
                abs(now - request.created) > SIGNATURE_WINDOW_MS
            ):
                reply(SignatureExpired())
                return
            if request.nonce in instance.nonces:
                reply(Replayed())
                return
            instance.nonces.add(request.nonce)
        self._calls += 1
        cause = Cause(
            self._calls,
            request.kind,
            index,
            request.sender,
            request.session_id,
            request.entries,
        )
        # `groups.fanout`: a use case of one of the service's parts.
        method = functools.reduce(getattr, request.kind.split("."), instance.service)
        outcome = self._call(cause, lambda: method(*request.args, **request.kwargs))
        self._record(cause, outcome)
        reply(outcome)

    def _call(self, cause: Cause, work: Callable[[], Any]) -> Any:
        self._history.cause = cause
        try:
            return work()
        except IllegalTransition as error:  # 500 internal: a bug in moonrun
            self._history.internal_errors.append((self._clock.now(), cause, repr(error)))
            return PlatformUnreachable("the platform answered 500")
        except MoonrunError as error:
            return error
        except Exception as error:  # 500 internal: a bug in moonrun
            self._history.internal_errors.append((self._clock.now(), cause, repr(error)))
            return PlatformUnreachable("the platform answered 500")
        finally:
            self._history.cause = None

    def _record(self, cause: Cause, outcome: Any) -> None:
        """Record the answer, one per job where the answer is about jobs."""
        now, history = self._clock.now(), self._history
        if isinstance(outcome, Registration):
            history.sessions[outcome.session.id] = (
                outcome.session.endpoint_id,
                outcome.session.generation,
            )
        if isinstance(outcome, list) and cause.kind in ("ack_many", "result_many"):
            for job_id, value in zip(cause.entries, outcome, strict=True):
                history.answered(now, cause, job_id, value)
        elif isinstance(outcome, list):  # claims and batch creates
            for value in outcome:
                job_id = value.job_id if isinstance(value, ClaimedJob) else value.id
                history.answered(now, cause, job_id, value)
        elif isinstance(outcome, FanOut):  # a fan-out answers each of its jobs
            for job in outcome.jobs:
                history.answered(now, cause, job.id, job)
        elif isinstance(outcome, Job):
            history.answered(now, cause, outcome.id, outcome)
        elif isinstance(outcome, CancelOutcome):
            history.answered(now, cause, outcome.job.id, outcome)
        elif cause.kind in ABOUT_ONE_JOB and len(cause.entries) == 1:
            history.answered(now, cause, next(iter(cause.entries)), outcome)
        else:
            history.answered(now, cause, None, outcome)

    # -- the sweeper ---------------------------------------------------------------------------

    def _sweep(self, index: int) -> None:
        instance = self.instances[index]
        now = self._clock.now()
        if instance.up and now >= instance.sweeper_paused_until:
            self._calls += 1
            cause = Cause(self._calls, "sweep", index, f"platform:{index}")
            while True:  # at once again while full batches come back, as the app's sweeper
                swept = self._call(cause, instance.service.sweep)
                if not isinstance(swept, int) or swept < self._settings.sweep_batch:
                    break
            self._prune(instance)
        self._scheduler.after(self.sweep_interval_ms, lambda: self._sweep(index))

    def _prune(self, instance: Instance) -> None:
        """The sweeper's retention pass, after its sweep as in the app (`service/sweeper.py`):
        batches of finished jobs past `retain_finished_s` deleted, at once again while whole
        batches come back, then their space given back. No logs or artifacts here to forget."""
        self._calls += 1
        cause = Cause(self._calls, "prune", instance.index, f"platform:{instance.index}")
        whole = min(self._settings.prune_batch, PRUNE_BATCH_LIMIT)
        deleted = 0
        while True:
            pruned = self._call(cause, lambda: instance.service.prune(lambda job: None))
            deleted += len(pruned) if isinstance(pruned, list) else 0
            if not isinstance(pruned, list) or len(pruned) < whole:
                break
        if deleted:
            self._call(cause, lambda: instance.service.release_space(RELEASE_PAGES))

    def _fire(self, index: int) -> None:
        """A firing pass of the schedules, as the app's firing loop runs it."""
        instance = self.instances[index]
        if instance.up:
            self._calls += 1
            cause = Cause(self._calls, "fire_due", index, f"platform:{index}")
            self._call(cause, instance.service.schedules.fire_due)
        self._scheduler.after(FIRE_INTERVAL_MS, lambda: self._fire(index))

    def pause_sweeper(self, index: int, ms: int) -> None:
        """The sweeper of instance `index` runs late: nothing is swept there for `ms`."""
        instance = self.instances[index]
        instance.sweeper_paused_until = max(instance.sweeper_paused_until, self._clock.now() + ms)
        self._history.faults["late_sweeps"] += 1

    # -- crashes ---------------------------------------------------------------------------------

    def crash(self, index: int) -> None:
        """Instance `index` dies: connections are refused until it restarts."""
        instance = self.instances[index]
        if instance.up:
            instance.up = False
            self._history.faults["platform_crashes"] += 1
            since, _ = self._history.up[index][-1]
            self._history.up[index][-1] = (since, self._clock.now())

    def restart(self, index: int, *, final: bool = False) -> None:
        """A new process for instance `index`: the store reopened, new services over it, no
        nonces remembered. What the reopened store holds is recorded for the checker."""
        old = self.instances[index]
        raw = self._store_kind.reopen(old.raw)
        fresh = self._start(index, raw)
        fresh.sweeper_paused_until = old.sweeper_paused_until
        self.instances[index] = fresh
        if not old.up:
            self._history.up[index].append((self._clock.now(), None))
        ids = self._history.job_ids()
        found = raw.get_jobs(ids)
        jobs = {job_id: found.get(job_id) for job_id in ids}
        history = self._history
        history.snapshots.append(
            Snapshot(
                self._clock.now(),
                index,
                jobs,
                len(history.writes),
                len(history.answers),
                final,
                len(history.deletions),
            )
        )

    def close(self) -> None:
        self._store_kind.close([instance.raw for instance in self.instances])
