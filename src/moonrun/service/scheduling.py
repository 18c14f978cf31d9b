"""SchedulingService: Run's and users' scheduling use cases, applied durably through the store.

Every use case is load -> pure transition (`moonrun.scheduling`) -> compare-and-swap write,
retried on conflict. The service keeps no jobs, sessions or deadlines of its own: a second
instance over the same store answers every call as this one would, but for which owner's turn
it is at an endpoint's next claim (fairness, not correctness: `scheduling/fairness.py`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from moonrun.clock import Clock
from moonrun.errors import (
    AckDeadlineExpired,
    AlreadyExists,
    Contention,
    EndpointInUse,
    Forbidden,
    IdempotencyConflict,
    InvalidPayload,
    InvalidRequest,
    JobNotEnded,
    JobNotFinished,
    JobNotFound,
    JoinTokenInvalid,
    LeaseExpired,
    MoonrunError,
    NotActive,
    NotFound,
    ReconcileRequired,
    RegistrationSuperseded,
    SessionExpired,
    SessionRotated,
    SignatureInvalid,
    TooManyWaiting,
    UnknownKind,
)
from moonrun.scheduling import concurrency as concurrency_domain
from moonrun.scheduling import groups as groups_domain
from moonrun.scheduling import jobs as jobs_domain
from moonrun.scheduling import kinds as kinds_domain
from moonrun.scheduling import messages, retention
from moonrun.scheduling import reconcile as reconcile_domain
from moonrun.scheduling.fingerprint import JsonValue, canonical_json, token_hash
from moonrun.scheduling.jobs import Job, JobState, RunResult
from moonrun.scheduling.labels import NO_LABELS, check_labels, merge_proposed
from moonrun.scheduling.messages import (
    AckAnswer,
    Caller,
    CancelPollAnswer,
    Decision,
    Evidence,
    ProgressAnswer,
    ResultAnswer,
)
from moonrun.scheduling.reconcile import ReconcileEntry
from moonrun.scheduling.records import Advertisement, Endpoint, Server, Session, User
from moonrun.scheduling.retry import RetryPolicy, check_int
from moonrun.scheduling.time import Instant, seconds_to_ms
from moonrun.scheduling.views import EndpointView, endpoint_online, endpoint_view
from moonrun.scheduling.views import logs_complete as logs_complete_rule
from moonrun.security.access import can_manage_jobs, require, require_platform_admin
from moonrun.security.tokens import JOIN_PREFIX, LEASE_PREFIX, TokenSource, b64url_decode
from moonrun.service import checks
from moonrun.service.answers import (
    CancelOutcome,
    ClaimedJob,
    EnrolledEndpoint,
    Heartbeat,
    JobPage,
    ReconcileReport,
    Registration,
    ReportBuilder,
)
from moonrun.service.config import SchedulingSettings, WaitLimits
from moonrun.service.dependencies import Dependencies
from moonrun.service.extensions import SessionExtensions
from moonrun.service.groups import Groups
from moonrun.service.keys import ConcurrencyKeys
from moonrun.service.liveness import Beats, Cadence
from moonrun.service.schedules import Schedules
from moonrun.service.specs import JobSpec
from moonrun.service.waiting import CANCELS, ENDPOINT, JOB, Peers, Place, Runner, Waiting, Watch
from moonrun.store.protocol import IdempotencyRecord, Store

T = TypeVar("T")

MAX_PAGE = 200
MAX_BATCH = 1000
"""Most jobs one batch request may create, ack or finish."""


class JobEvents(Protocol):
    """Told about every job write this service made, once it is committed (so that waiting
    claims and blocking reads can be answered at once)."""

    def job_changed(self, job: Job, before: Job | None) -> None: ...


class _Both:
    def __init__(self, first: JobEvents, second: JobEvents) -> None:
        self._first, self._second = first, second

    def job_changed(self, job: Job, before: Job | None) -> None:
        self._first.job_changed(job, before)
        self._second.job_changed(job, before)


class _Committed:
    """Tells `listener` of a job write once the store has committed it (FileStore's loop
    flusher commits after the whole call: a woken request must find the change)."""

    def __init__(self, store: Store, listener: JobEvents) -> None:
        self._store, self.listener = store, listener

    def job_changed(self, job: Job, before: Job | None) -> None:
        self._store.after_commit(functools.partial(self.listener.job_changed, job, before))


@dataclass(frozen=True, slots=True)
class Claim:
    """What a claim granted, and what a waiting claim needs to know to wait well."""

    jobs: list[ClaimedJob]
    endpoint_id: str
    next_claimable_at: Instant | None
    """When nothing was granted with capacity free: when the endpoint's next waiting job
    becomes claimable (None when it has none, or capacity is full)."""


# -- the service -----------------------------------------------------------------------------


class SchedulingService:
    """Applies Run's and users' scheduling messages through the store seam."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        tokens: TokenSource,
        settings: SchedulingSettings | None = None,
        waiting: WaitLimits | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._tokens = tokens
        self._settings = settings or SchedulingSettings()
        self._default_policy = self._settings.default_policy()
        self.waiters = Watch(waiting)
        """Who waits for which job or endpoint (told of every committed job write)."""
        self.extensions = SessionExtensions(store)
        """Heartbeats' session extensions, written together."""
        self.beats = Beats()
        """The heartbeats this process answered: `connected_runs`, the endpoints' views, and
        the liveness flusher's writes (`service/liveness.py`)."""
        self.cadence = Cadence(self._settings, self.beats.connected)
        """The heartbeat interval and session TTL told to Runs, stretched with the fleet."""
        self._events = _Committed(store, self.waiters)
        self._touch_peers: Peers | None = None
        self._served_last: dict[str, str] = {}
        """Per endpoint, the owner its last claim served last: the next claim's turns start
        after it. Kept here only; a restart starts the turns afresh."""
        self.groups = Groups(store, clock, tokens, self)
        """Fan-out groups (`service/groups.py`), whose jobs are made and ended through here."""
        self.keys = ConcurrencyKeys(store, clock, self.job_written)
        """Concurrency keys' releases (`service/keys.py`)."""
        self.dependencies = Dependencies(
            store, clock, self._refused_jobs, self.groups.accessible, self.job_written
        )
        """Jobs waiting on others (`service/dependencies.py`), settled after every job's end."""
        self.schedules = Schedules(store, clock, tokens, self)
        """Recurring jobs (`service/schedules.py`), which make their jobs through this service."""

    def listen(self, events: JobEvents) -> None:
        """Tell `events` too about every committed job write from now on."""
        self._events = _Committed(self._store, _Both(self._events.listener, events))

    def share_touches(self, peers: Peers) -> None:
        """Tell `peers` (the other platform processes) too when something beside a job's
        record that its readers wait for changes (`logs_completed`)."""
        self._touch_peers = peers

    def logs_completed(self, job_id: str) -> None:
        """The job's attempt's final log batch is stored: wake the job's readers here, and on
        the other platform processes (with a shared log directory, theirs read it too)."""
        self.waiters.job_touched(job_id)
        if self._touch_peers is not None:
            self._touch_peers.announce(job_id, None)

    @property
    def settings(self) -> SchedulingSettings:
        return self._settings

    # -- enrollment and sessions (control channel) -----------------------------------------

    def create_endpoint(self, actor: User, name: str) -> EnrolledEndpoint:
        """A platform admin creates an endpoint and gets its one-time join token."""
        require_platform_admin(actor)
        checks.check_name("name", name)
        now = self._clock.now()
        join_token = self._tokens.token(JOIN_PREFIX)
        expires_at = now + self._settings.join_token_ttl_ms
        endpoint = Endpoint(
            id=self._tokens.identifier("ep_"),
            name=name,
            created_at=now,
            join_token_hash=token_hash(join_token),
            join_token_expires_at=expires_at,
        )
        self._store.insert_endpoint(endpoint)
        return EnrolledEndpoint(endpoint, join_token, expires_at)

    def join_endpoint(
        self, join_token: str, identity_public_key: str, labels: object = None
    ) -> Endpoint:
        """Run burns its join token and records its Ed25519 public key, and the labels it
        proposes under those an admin already set (`merge_proposed`).

        The same token with the same key again, within `join_replay_s` of the join, is the
        same join (its answer may have been lost): the same endpoint, nothing changed. Any
        other key is refused, as is everything once that window has passed.
        """
        key = checks.decode_public_key(identity_public_key)
        proposed = NO_LABELS if labels is None else check_labels(labels)
        if not isinstance(join_token, str) or not join_token:
            raise JoinTokenInvalid()
        for _ in range(self._settings.cas_retries):
            now = self._clock.now()
            endpoint = self._store.endpoint_by_join_token(token_hash(join_token))
            if endpoint is not None and endpoint.joined_at is not None:
                if (
                    endpoint.identity_public_key == key
                    and now < endpoint.joined_at + self._settings.join_replay_ms
                ):
                    return endpoint
                raise JoinTokenInvalid()
            if endpoint is None or now >= endpoint.join_token_expires_at:
                raise JoinTokenInvalid()
            joined = replace(
                endpoint,
                identity_public_key=key,
                joined_at=now,
                version=endpoint.version + 1,
                labels=merge_proposed(endpoint.labels, proposed),
            )
            if self._store.replace_endpoint(joined, endpoint.version):
                return joined
        raise Contention()

    def register_session(
        self,
        endpoint_id: str,
        *,
        boot_id: str,
        run_version: str,
        capacity: int,
        kinds: JsonValue | None = None,
        asked_at: Instant | None = None,
    ) -> Registration:
        """A new session at generation + 1; every earlier session of the endpoint is rotated.

        `kinds` is what the Run advertises it runs (`{kind: payload schema}`); it replaces
        what the endpoint advertised before, and `None` (an older Run) clears it.

        `asked_at` is when the registration reached the platform (now when not given). One
        asked before the endpoint's current session was made is refused (`_refuse_superseded`).
        """
        checks.check_pattern("boot_id", boot_id, checks.BOOT_ID_PATTERN)
        checks.check_pattern("run_version", run_version, checks.RUN_VERSION_PATTERN)
        check_int("capacity", capacity, 1, self._settings.max_capacity)
        kinds_json = None
        if kinds is not None:
            kinds_json = kinds_domain.advertisement_json(kinds_domain.check_advertisement(kinds))
        advertised = False
        asked = self._clock.now() if asked_at is None else asked_at
        for _ in range(self._settings.cas_retries):
            endpoint = self._store.get_endpoint(endpoint_id)
            if endpoint is None or endpoint.joined_at is None:
                raise SignatureInvalid("unknown endpoint")
            self._refuse_superseded(endpoint, asked)
            now = self._clock.now()
            told = self.cadence.settings(now)
            if not advertised:
                # Before the session becomes current, so that no job is checked against the
                # kinds of the Run this one replaces once it may claim.
                advertisement = (
                    None if kinds_json is None else Advertisement(endpoint.id, kinds_json, now)
                )
                self._store.set_advertisement(endpoint.id, advertisement)
                advertised = True
            session = Session(
                id=self._tokens.identifier("ses_"),
                endpoint_id=endpoint.id,
                generation=endpoint.generation + 1,
                boot_id=boot_id,
                capacity=capacity,
                run_version=run_version,
                created_at=now,
                last_seen_at=now,
                expires_at=now + told.session_ttl_ms,
            )
            # The session row goes first: if the endpoint write loses a race, the orphan row is
            # harmless, because only the endpoint's current_session_id makes a session valid.
            self._store.insert_session(session)
            rotated = replace(
                endpoint,
                generation=session.generation,
                current_session_id=session.id,
                version=endpoint.version + 1,
            )
            if self._store.replace_endpoint(rotated, endpoint.version):
                if endpoint.current_session_id is not None:
                    self.beats.forget(endpoint.current_session_id)
                s = told
                return Registration(
                    session, s.heartbeat_interval_s, s.session_ttl_s, s.ack_timeout_s, s.lease_ttl_s
                )
        raise Contention()

    def _refuse_superseded(self, endpoint: Endpoint, asked_at: Instant) -> None:
        """Refuse a registration asked before the endpoint's current session was made.

        Why: a Run whose registration is slow to answer gives up and registers again. When
        the first one is applied after the second (it lost the endpoint's compare-and-swap to
        it and tried again, or waited longer for a thread), it would rotate away the session
        the Run was answered with, and every request of that Run would then be refused
        `session_rotated` until it noticed and registered a third time. The later-asked
        registration wins; the earlier one's answer goes to nobody. A Run that is refused
        this way registers again (it is a retryable answer).
        """
        if endpoint.current_session_id is None:
            return
        current = self._store.get_session(endpoint.current_session_id)
        if current is not None and current.created_at > asked_at:
            raise RegistrationSuperseded()

    def authenticate_session(self, session_id: str) -> Session:
        """The caller's current, unexpired session; each call counts as activity."""
        return self._session_and_endpoint(session_id)[0]

    def _session_and_endpoint(
        self, session_id: str, *, extend: bool = True
    ) -> tuple[Session, Endpoint]:
        """`authenticate_session`, and the session's endpoint as read with it (`extend=False`:
        read only, the call does not count as activity)."""
        now = self._clock.now()
        session, endpoint = self._current_session(session_id, now)
        expires_at = self._extension_due(session, now) if extend else None
        if expires_at is not None:
            self._store.extend_session(session.id, now, expires_at)
            session = replace(session, last_seen_at=now, expires_at=expires_at)
        return session, endpoint

    def _current_session(self, session_id: str, now: Instant) -> tuple[Session, Endpoint]:
        """The session and its endpoint; refused when unknown, rotated or expired."""
        found = self._store.session_with_endpoint(session_id)
        if found is None:
            raise SignatureInvalid("unknown session")
        session, endpoint = found
        if endpoint.current_session_id != session.id:
            raise SessionRotated()
        if now >= session.expires_at:
            raise SessionExpired()
        return session, endpoint

    def _extension_due(self, session: Session, now: Instant) -> Instant | None:
        """The session's new expiry when a request at `now` should write it: only once it would
        move by the slack (half the TTL with the defaults), so that most requests write
        nothing. The TTL is the one told to Runs now (stretched with the fleet)."""
        told = self.cadence.settings(now)
        expires_at = now + told.session_ttl_ms
        if expires_at - session.expires_at >= told.session_extend_slack_ms:
            return expires_at
        return None

    def identity_key(self, endpoint_id: str) -> bytes:
        """The Ed25519 public key a joined endpoint signs its registrations with."""
        endpoint = self._store.get_endpoint(endpoint_id)
        if endpoint is None or endpoint.identity_public_key is None:
            raise SignatureInvalid("unknown endpoint")
        return b64url_decode(endpoint.identity_public_key)

    def check_transfer(self, session_id: str, job_id: str, evidence: Evidence) -> Job:
        """May the caller send logs or artifacts for this attempt? (docs/protocol.md, "Logs")

        The evidence is checked as for job messages, but nothing is written: transfers never
        touch the job record. The attempt must be active or have ended at most
        `transfer_grace_s` ago.
        """
        caller = self._caller(session_id)
        job = self._store.get_job(job_id)
        if job is None:
            raise JobNotFound()
        error = messages.fence(job, caller, evidence)
        if error is not None and not isinstance(error, AckDeadlineExpired | LeaseExpired):
            raise error
        now = self._clock.now()
        if job.state.is_active:
            if job.deadline_at is None or now < job.deadline_at:
                return job
            ended: Instant | None = job.deadline_at  # passed, not applied yet
        else:
            ended = next(
                (past.ended_at for past in job.history if past.attempt == job.attempt), None
            )
        if ended is not None and now <= ended + round(self._settings.transfer_grace_s * 1000):
            return job
        if error is not None:
            raise error
        raise NotActive("the attempt ended; its logs and artifacts are closed")

    def check_transfers(
        self, session_id: str, transfers: Sequence[tuple[str, Evidence]]
    ) -> list[Job | MoonrunError]:
        """`check_transfer` of each (job id, evidence), in one call: the job, or why not."""
        checked: list[Job | MoonrunError] = []
        for job_id, evidence in transfers:
            try:
                checked.append(self.check_transfer(session_id, job_id, evidence))
            except MoonrunError as error:
                checked.append(error)
        return checked

    def logs_complete(
        self, job: Job, attempt: int | None, marked: Callable[[str, int], bool]
    ) -> bool:
        """Whether the job's `attempt` (its latest when None) has all its log lines in;
        `marked(job_id, attempt)` says whether the log store holds its final batch."""
        attempt = job.attempt if attempt is None else attempt
        return logs_complete_rule(
            job,
            attempt,
            attempt >= 1 and marked(job.id, attempt),
            self._clock.now(),
            round(self._settings.transfer_grace_s * 1000),
        )

    def heartbeat(self, session_id: str) -> Heartbeat:
        now = self._clock.now()
        session = self.authenticate_session(session_id)
        self.beats.beat(session.id, now, written=session.last_seen_at >= now)
        return Heartbeat(session.expires_at, now, self.cadence.settings(now).heartbeat_interval_s)

    async def heartbeat_shared(
        self,
        session_id: str,
        run: Runner,
        *,
        flush: Runner | None = None,
        place: Place | None = None,
    ) -> Heartbeat:
        """`heartbeat`, its session read through `run`, and its extension (when one is due)
        written through `flush` (`run` by default) together with those of the heartbeats that
        arrive with it, in one commit; answered once that commit is done. While it waits for
        the commit it gives up its `place` on its channel (it has nothing more to do there)."""
        now = self._clock.now()
        session, _ = await run(self._current_session, session_id, now)
        expires_at = self._extension_due(session, now)
        if expires_at is not None:
            if place is not None:
                place.leave()
            await self.extensions.extend(session.id, now, expires_at, flush or run)
            session = replace(session, last_seen_at=now, expires_at=expires_at)
        # Written by the liveness flusher's next pass, with every other beat of that pass
        # (unless the extension just wrote it): no write of its own.
        self.beats.beat(session.id, now, written=expires_at is not None)
        return Heartbeat(session.expires_at, now, self.cadence.settings(now).heartbeat_interval_s)

    def connected_runs(self) -> int:
        """Runs whose sessions heartbeat to this platform process within the session TTL."""
        now = self._clock.now()
        return self.beats.connected(now - self.cadence.settings(now).session_ttl_ms)

    def told_heartbeat_interval_s(self) -> float:
        """The heartbeat interval this process tells its Runs now (`Cadence`)."""
        return self.cadence.settings(self._clock.now()).heartbeat_interval_s

    def record_beats(self, beats: Mapping[str, Instant]) -> None:
        """Store the heartbeats the liveness flusher took (`service/liveness.py`), in one write:
        each session's `last_seen_at` moves forward only."""
        self._store.record_beats(beats)

    def end_session(self, session_id: str) -> Session:
        """Run is shutting down cleanly: the session is no longer current, so its endpoint
        shows offline at once (not when the session would have expired). Its held attempts
        keep their leases; the next registration reconciles them. It is seen at its end: its
        endpoint's view shows when its Run stopped, and what it offered."""
        now = self._clock.now()
        session = self.authenticate_session(session_id)
        if session.last_seen_at < now:
            self._store.record_beats({session.id: now})
            session = replace(session, last_seen_at=now)
        for _ in range(self._settings.cas_retries):
            found = self._store.session_with_endpoint(session_id)
            endpoint = found[1] if found is not None else None
            if endpoint is None or endpoint.current_session_id != session_id:
                raise SessionRotated()
            ended = replace(endpoint, current_session_id=None, version=endpoint.version + 1)
            if self._store.replace_endpoint(ended, endpoint.version):
                self.beats.forget(session_id)
                return session
        raise Contention()

    def endpoints_online(self, endpoint_ids: Iterable[str]) -> dict[str, bool]:
        """Whether each endpoint's Run holds a current, unexpired session that heartbeat within
        the liveness bound (as EndpointView's `online`)."""
        now, online = self._clock.now(), {}
        bound = self.cadence.liveness_bound_ms(now)
        for endpoint_id in set(endpoint_ids):
            endpoint = self._store.get_endpoint(endpoint_id)
            if endpoint is None or endpoint.current_session_id is None:
                online[endpoint_id] = False  # no need to read the session it had last
                continue
            session = self._shown_session(endpoint)
            online[endpoint_id] = endpoint_online(endpoint, session, now, liveness_bound_ms=bound)
        return online

    def endpoint_views(self, actor: User) -> list[EndpointView]:
        """Every endpoint, as a platform admin sees it."""
        require_platform_admin(actor)
        return [
            self._endpoint_view(endpoint, self._shown_session(endpoint))
            for endpoint in self._store.list_endpoints()
        ]

    def _shown_session(self, endpoint: Endpoint) -> Session | None:
        """The session an endpoint's view shows: its current one, else the one that was current
        last (its Run stopped cleanly); seen at the later of its stored `last_seen_at` and the
        last beat this process answered (the flusher may not have written it yet)."""
        sid = endpoint.current_session_id
        session = self._store.get_session(sid) if sid else self._store.latest_session(endpoint.id)
        if session is None:
            return None
        noted = self.beats.last(session.id)
        if noted is not None and noted > session.last_seen_at:
            session = replace(session, last_seen_at=noted)
        return session

    def _endpoint_view(self, endpoint: Endpoint, session: Session | None) -> EndpointView:
        now = self._clock.now()
        return endpoint_view(
            endpoint, session, now, liveness_bound_ms=self.cadence.liveness_bound_ms(now)
        )

    def set_draining(self, actor: User, endpoint_id: str, draining: bool) -> EndpointView:
        """A platform admin drains an endpoint (no new claims are granted to it; its running
        attempts finish) or undrains it."""
        require_platform_admin(actor)
        return self._change_endpoint(endpoint_id, draining=draining)

    def set_endpoint_labels(self, actor: User, endpoint_id: str, labels: object) -> EndpointView:
        """A platform admin replaces an endpoint's labels (whatever its Run proposed)."""
        require_platform_admin(actor)
        return self._change_endpoint(endpoint_id, labels=check_labels(labels))

    def _change_endpoint(self, endpoint_id: str, **fields: Any) -> EndpointView:
        """Set `fields` of the endpoint by compare-and-swap (no write when they are already
        so); its view after."""
        for _ in range(self._settings.cas_retries):
            endpoint = self._store.get_endpoint(endpoint_id)
            if endpoint is None:
                raise NotFound("no such endpoint")
            updated = endpoint
            if any(getattr(endpoint, name) != value for name, value in fields.items()):
                updated = replace(endpoint, **fields, version=endpoint.version + 1)
                if not self._store.replace_endpoint(updated, endpoint.version):
                    continue
            return self._endpoint_view(updated, self._shown_session(updated))
        raise Contention()

    def remove_endpoint(self, actor: User, endpoint_id: str) -> EndpointView:
        """A platform admin removes an endpoint no server points at; its sessions go with it,
        so its Run's signed requests are refused from then on."""
        require_platform_admin(actor)
        endpoint = self._store.get_endpoint(endpoint_id) if isinstance(endpoint_id, str) else None
        if endpoint is None:
            raise NotFound("no such endpoint")
        session = self._shown_session(endpoint)
        using = self._store.delete_endpoint(endpoint.id)
        if using:
            servers = "1 server points" if using == 1 else f"{using} servers point"
            raise EndpointInUse(f"{servers} at endpoint {endpoint.id}; remove them first")
        return self._endpoint_view(replace(endpoint, current_session_id=None), session)

    # -- jobs channel ------------------------------------------------------------------------

    def reconcile(self, session_id: str, entries: Sequence[ReconcileEntry]) -> ReconcileReport:
        """Confirm and rebind Run's live attempts, discard stale entries, and apply cancel or
        retry policy to the endpoint's active jobs the report does not confirm; every job's
        part is decided under the store's write and all of it committed at once."""
        session = self.authenticate_session(session_id)
        caller = Caller(session.endpoint_id, session.generation)
        self._check_entries(entries)
        now = self._clock.now()
        s = self._settings
        entry_of = {entry.job_id: entry for entry in entries}
        job_ids = list(entry_of) + [
            job.id for job in self._store.active_jobs(caller.endpoint_id) if job.id not in entry_of
        ]
        planned: dict[str, tuple[reconcile_domain.ReconcilePlan, Job]] = {}

        def change(stored: Job) -> Job:
            fresh = jobs_domain.apply_due_deadline(stored, now=now, draw=self._tokens.draw())
            reported = [entry_of[stored.id]] if stored.id in entry_of else []
            mine = fresh.state.is_active and fresh.endpoint_id == caller.endpoint_id
            plan = reconcile_domain.plan(
                reported,
                {stored.id: fresh},
                [fresh] if mine else [],
                caller.endpoint_id,
                generation=caller.generation,
            )
            updated = fresh
            if plan.confirm:
                updated = reconcile_domain.confirm(
                    fresh,
                    caller,
                    now=now,
                    ack_timeout_ms=s.ack_timeout_ms,
                    lease_ttl_ms=s.lease_ttl_ms,
                )
            elif plan.lost:
                updated = reconcile_domain.lose(fresh, caller, now=now, draw=self._tokens.draw())
            planned[stored.id] = (plan, updated)
            return updated

        done = self._store.update_jobs(job_ids, change)
        report = ReportBuilder()
        for job_id in job_ids:
            if job_id not in done:  # unknown: there is no such job
                unknown = reconcile_domain.plan(
                    [entry_of[job_id]], {}, [], caller.endpoint_id, generation=caller.generation
                )
                report.add(unknown, None)
                continue
            before, after = done[job_id]
            if after is not before:
                self._events.job_changed(after, before)
            plan, updated = planned[job_id]
            report.add(plan, updated)
        self._follow_ends(done.values())
        self._store.mark_session_reconciled(session.id, now)
        return report.build()

    def _check_entries(self, entries: Sequence[ReconcileEntry]) -> None:
        if len(entries) > self._settings.max_reconcile_entries:
            raise InvalidRequest(
                f"at most {self._settings.max_reconcile_entries} entries per reconciliation"
            )
        seen: set[str] = set()
        for entry in entries:
            if not isinstance(entry.job_id, str) or not isinstance(entry.lease, str):
                raise InvalidRequest("each entry needs string job_id and lease")
            check_int("attempt", entry.attempt, 0, 2**31)
            if entry.job_id in seen:
                raise InvalidRequest(f"job {entry.job_id} is listed twice")
            seen.add(entry.job_id)

    def claim(self, session_id: str, max_jobs: int) -> list[ClaimedJob]:
        """Grant up to `max_jobs` eligible jobs (and no more than free capacity): owners take
        turns, each owner's oldest first."""
        return self.claim_now(session_id, max_jobs).jobs

    async def wait_for_claim(
        self, session_id: str, max_jobs: int, *, wait_s: float, waiting: Waiting
    ) -> Claim:
        """`claim_now`; when it grants nothing, again whenever the endpoint may have claimable
        work, until something is granted or `wait_s` passes.

        A Run that went away (killed, or stopping) is granted nothing more: its attempts could
        only come back through reconciliation, as lost. Over the claims' bounds the claim is
        answered at once, as if its wait had run out (Run claims again a moment later).
        """
        deadline = time.monotonic() + wait_s
        claim = await waiting.run(self._first_look, session_id, max_jobs)
        if claim.jobs or wait_s <= 0:
            return claim
        endpoint_id = claim.endpoint_id
        try:
            return await self.waiters.wait_until(
                lambda: self._claim_if_due(session_id, max_jobs, endpoint_id),
                lambda claim: bool(claim.jobs),
                on=(ENDPOINT, endpoint_id),
                rooms=self.waiters.claim_rooms(endpoint_id),
                deadline=deadline,
                waiting=waiting,
                due_s=self._due_s,
            )
        except TooManyWaiting:
            return claim

    async def wait_for_cancels(
        self,
        session_id: str,
        known: Collection[tuple[str, int]],
        *,
        wait_s: float,
        waiting: Waiting,
    ) -> list[tuple[str, int]]:
        """The session's endpoint's accepted and running attempts that a user asked to cancel,
        but those in `known`; when there are none, waits up to `wait_s` for one (woken by the
        cancel's commit), so that Run learns a cancel at once rather than at its next renewal
        (docs/protocol.md, "Cancellation")."""
        known = set(known)
        endpoint_id = await waiting.run(self._endpoint_of_reconciled, session_id)

        def read() -> list[tuple[str, int]]:
            return [
                (job.id, job.attempt)
                for job in self._store.active_jobs(endpoint_id)
                if job.cancel is not None and (job.id, job.attempt) not in known
            ]

        try:
            return await self.waiters.wait_until(
                read,
                bool,
                on=(CANCELS, endpoint_id),
                rooms=self.waiters.claim_rooms(endpoint_id),
                deadline=time.monotonic() + max(0.0, wait_s),
                waiting=waiting,
            )
        except TooManyWaiting:
            return await waiting.run(read)

    def _endpoint_of_reconciled(self, session_id: str) -> str:
        session, _ = self._session_and_endpoint(session_id, extend=False)
        if session.reconciled_at is None:
            raise ReconcileRequired("reconcile after registering, before watching for cancels")
        return session.endpoint_id

    def _first_look(self, session_id: str, max_jobs: int) -> Claim:
        """A claim request's first look: its session checked (reads), and the claim (a write,
        even when it grants nothing) only when something of the endpoint is claimable."""
        check_int("max_jobs", max_jobs, 1, 2**31)
        session, endpoint = self._session_and_endpoint(session_id, extend=False)
        if session.reconciled_at is None:
            raise ReconcileRequired("reconcile after registering, before claiming")
        if endpoint.draining:
            return Claim([], session.endpoint_id, None)
        return self._claim_if_due(session_id, max_jobs, session.endpoint_id)

    def _claim_if_due(self, session_id: str, max_jobs: int, endpoint_id: str) -> Claim:
        """A waiting claim looks again: one read of when the endpoint's next job becomes
        claimable, and the claim (a write) only once one is. An idle fleet's waiting claims
        thus write nothing, and do not count as activity of their sessions (heartbeats keep
        those alive)."""
        due = self._store.next_claimable_at(endpoint_id)
        if due is None or due > self._clock.now():
            return Claim([], endpoint_id, due)
        return self.claim_now(session_id, max_jobs)

    def _due_s(self, claim: Claim) -> float | None:
        """Seconds until the endpoint's next waiting job becomes claimable, if one will."""
        due = claim.next_claimable_at
        return None if due is None else (due - self._clock.now()) / 1000

    def claim_now(self, session_id: str, max_jobs: int) -> Claim:
        """`claim`, and when nothing is granted, when to look again (it never waits). A claim
        is not what keeps its session alive (heartbeats are): an idle Run's claim, its only
        request besides heartbeats, thus writes nothing."""
        session, endpoint = self._session_and_endpoint(session_id, extend=False)
        check_int("max_jobs", max_jobs, 1, 2**31)
        if session.reconciled_at is None:
            raise ReconcileRequired("reconcile after registering, before claiming")
        if endpoint.draining:
            return Claim([], session.endpoint_id, None)
        now = self._clock.now()
        active = self._store.active_deadlines(session.endpoint_id)
        passed = [job_id for job_id, deadline in active if deadline is not None and now >= deadline]
        # An attempt whose deadline has passed holds no place: ended now, as the sweeper would.
        self._apply_passed_deadlines(passed, now)
        busy = len(active) - len(passed)
        wanted = min(max_jobs, session.capacity - busy, self._settings.max_claim_batch)
        if wanted <= 0:
            return Claim([], session.endpoint_id, None)
        leases: dict[str, str] = {}
        before: dict[str, Job] = {}

        def grant(job: Job) -> Job:
            leases[job.id] = self._tokens.token(LEASE_PREFIX)
            before[job.id] = job
            return jobs_domain.claim(
                job,
                now=now,
                lease_hash=token_hash(leases[job.id]),
                generation=session.generation,
                ack_timeout_ms=self._settings.ack_timeout_ms,
            )

        turn = self._served_last.get(session.endpoint_id)
        claimed = self._store.claim_jobs(session.endpoint_id, now, wanted, grant, after_owner=turn)
        if claimed:
            self._served_last[session.endpoint_id] = claimed[-1].owner_id
        for job in claimed:
            self._events.job_changed(job, before[job.id])
        if claimed:
            granted = [self._claimed(job, leases[job.id]) for job in claimed]
            return Claim(granted, session.endpoint_id, None)
        return Claim([], session.endpoint_id, self._store.next_claimable_at(session.endpoint_id))

    def _apply_passed_deadlines(self, job_ids: list[str], now: Instant) -> None:
        """End the attempts of `job_ids`, whose deadlines have passed, one write each."""
        for job_id in job_ids:
            self._apply_deadline(job_id, now)

    def _claimed(self, job: Job, lease: str) -> ClaimedJob:
        assert job.ack_deadline is not None
        return ClaimedJob(
            job_id=job.id,
            server_id=job.server_id,
            owner_id=job.owner_id,
            kind=job.kind,
            payload_json=job.payload_json,
            attempt=job.attempt,
            lease=lease,
            ack_deadline=job.ack_deadline,
            lease_ttl_s=self._settings.lease_ttl_s,
            max_attempts=job.max_attempts,
        )

    def ack(self, session_id: str, job_id: str, evidence: Evidence) -> AckAnswer:
        caller = self._caller(session_id)
        ttl = self._settings.lease_ttl_ms
        return self._apply(
            job_id,
            lambda job, now, draw: messages.ack(
                job, caller, evidence, now=now, lease_ttl_ms=ttl, draw=draw
            ),
        )

    def ack_many(
        self, session_id: str, acks: Sequence[tuple[str, Evidence]]
    ) -> list[AckAnswer | MoonrunError]:
        """Several acks in one request and one commit; each answered as `ack` would."""
        caller = self._caller(session_id)
        self._check_messages(acks)
        ttl = self._settings.lease_ttl_ms
        evidence = dict(acks)
        return self._apply_many(
            [job_id for job_id, _ in acks],
            lambda job, now, draw: messages.ack(
                job, caller, evidence[job.id], now=now, lease_ttl_ms=ttl, draw=draw
            ),
        )

    def progress(
        self,
        session_id: str,
        job_id: str,
        evidence: Evidence,
        *,
        seq: int,
        percent: float | None = None,
        message: str | None = None,
    ) -> ProgressAnswer:
        caller = self._caller(session_id)
        ttl = self._settings.lease_ttl_ms
        return self._apply(
            job_id,
            lambda job, now, draw: messages.progress(
                job,
                caller,
                evidence,
                seq=seq,
                percent=percent,
                message=message,
                now=now,
                lease_ttl_ms=ttl,
                draw=draw,
            ),
        )

    def cancel_poll(self, session_id: str, job_id: str, evidence: Evidence) -> CancelPollAnswer:
        caller = self._caller(session_id)
        job = self._store.get_job(job_id)  # a poll seldom changes anything: read first
        if job is None:
            raise JobNotFound()
        return self._apply(
            job_id,
            lambda job, now, draw: messages.cancel_poll(job, caller, evidence, now=now, draw=draw),
            job,
        )

    def result(
        self,
        session_id: str,
        job_id: str,
        evidence: Evidence,
        *,
        outcome: str,
        retryable: bool,
        error: Mapping[str, Any] | None = None,
        output: JsonValue | None = None,
        silent: bool = False,
    ) -> ResultAnswer:
        caller = self._caller(session_id)
        reported = RunResult.of(outcome, retryable, error, output)
        return self._apply(
            job_id,
            lambda job, now, draw: messages.result(
                job, caller, evidence, reported, now=now, draw=draw, silent=silent
            ),
        )

    def result_many(
        self, session_id: str, results: Sequence[tuple[str, Evidence, Mapping[str, Any]]]
    ) -> list[ResultAnswer | MoonrunError]:
        """Several results in one request and one commit; each answered as `result` would.

        Each result mapping holds `outcome`, `retryable` and optionally `error`, `output` and
        `silent` (the attempt printed no log line); one that does not validate is refused alone
        (`invalid_request`).
        """
        caller = self._caller(session_id)
        self._check_messages(results)
        reported: dict[str, tuple[Evidence, RunResult]] = {}
        refused: dict[str, MoonrunError] = {}
        for job_id, evidence, fields in results:
            try:
                reported[job_id] = (
                    evidence,
                    RunResult.of(
                        fields.get("outcome"),  # type: ignore[arg-type]
                        fields.get("retryable"),  # type: ignore[arg-type]
                        fields.get("error"),
                        fields.get("output"),
                    ),
                )
            except MoonrunError as error:
                refused[job_id] = error

        silent = {job_id for job_id, _, fields in results if fields.get("silent") is True}

        def decide(job: Job, now: Instant, draw: float) -> Decision[ResultAnswer]:
            evidence, result = reported[job.id]
            return messages.result(
                job, caller, evidence, result, now=now, draw=draw, silent=job.id in silent
            )

        decided = self._apply_many(list(reported), decide)
        answered = iter(decided)
        return [
            refused[job_id] if job_id in refused else next(answered) for job_id, _, _ in results
        ]

    def result_many_then_claim(
        self,
        session_id: str,
        results: Sequence[tuple[str, Evidence, Mapping[str, Any]]],
        max_jobs: int,
    ) -> tuple[list[ResultAnswer | MoonrunError], Claim | None]:
        """`result_many`, then a claim of up to `max_jobs` in the same step (one commit): the
        places the results freed are granted in their answer, not to a claim Run sends once
        it has read that answer (docs/protocol.md, "Claims with results"). A claim that cannot
        be made now (the session must reconcile first, or went away since its results) is
        None: the results' answers still go back. One that finds nothing claimable grants
        nothing and writes nothing."""
        answers = self.result_many(session_id, results)
        try:
            claim = self._first_look(session_id, max_jobs)
        except MoonrunError:
            claim = None
        return answers, claim

    def _check_batch(self, items: Sequence[Any]) -> None:
        if not 1 <= len(items) <= MAX_BATCH:
            raise InvalidRequest(f"a batch holds 1 to {MAX_BATCH} entries")

    def _check_messages(self, messages: Sequence[tuple[str, Any, *tuple[Any, ...]]]) -> None:
        """A batch of messages: 1 to MAX_BATCH, each about another job (the first item)."""
        self._check_batch(messages)
        if len({job_id for job_id, *_ in messages}) != len(messages):
            raise InvalidRequest("each job may appear only once in a batch")

    def _caller(self, session_id: str) -> Caller:
        session = self.authenticate_session(session_id)
        return Caller(session.endpoint_id, session.generation)

    def _apply(
        self,
        job_id: str,
        decide: Callable[[Job, Instant, float], Decision[T]],
        job: Job | None = None,
    ) -> T:
        """Decide on the stored job and store the decision, atomically.

        When `job` (just read) needs no change, its decision is answered without a write; a
        decision that changes it is taken again under the store's write (`update_jobs`).
        """
        if job is not None:
            decision = decide(job, self._clock.now(), self._tokens.draw())
            if decision.job is job:
                return _answer(decision)
        answer = self._apply_many([job_id], decide)[0]
        if isinstance(answer, MoonrunError):
            raise answer
        return answer

    def _apply_many(
        self, job_ids: Sequence[str], decide: Callable[[Job, Instant, float], Decision[T]]
    ) -> list[T | MoonrunError]:
        """Each job read, decided on and written in one atomic step of the store, all of them
        committed together; each answered (or refused) exactly as alone."""
        if len(set(job_ids)) != len(job_ids):
            raise InvalidRequest("each job may appear only once in a batch")
        decisions: dict[str, Decision[T]] = {}

        def change(job: Job) -> Job:
            decision = decide(job, self._clock.now(), self._tokens.draw())
            decisions[job.id] = decision
            return decision.job

        done = self._store.update_jobs(job_ids, change)
        answers: list[T | MoonrunError] = []
        for job_id in job_ids:
            if job_id not in done:
                answers.append(JobNotFound())
                continue
            before, after = done[job_id]
            if after is not before:
                self._events.job_changed(after, before)
            decision = decisions[job_id]
            answers.append(decision.error if decision.error is not None else decision.answer)  # type: ignore[arg-type]
        self._follow_ends(done.values())
        return answers

    def _follow_ends(self, done: Iterable[tuple[Job, Job]]) -> None:
        """What a write that ended jobs brings about: their groups' releases and stops
        (`Groups.jobs_ended`), the jobs waiting on them settled (`Dependencies.jobs_ended`),
        whose own ends are followed in turn, and their keys' releases (`ConcurrencyKeys.follow`)
        for every write of these, the settled waiters' too (a cancelled waiter frees nothing
        but is harmless; a released one may now be its key's to release)."""
        done = list(done)
        grouped = [after for before, after in done if groups_domain.ended(before, after)]
        if grouped:
            self.groups.jobs_ended(grouped)
        followed = list(done)
        ended = [after for before, after in done if _ended(before, after)]
        while ended:
            settled = self.dependencies.jobs_ended(ended)
            followed.extend(settled)
            ended = [after for before, after in settled if _ended(before, after)]
        self.keys.follow(followed)

    def job_written(self, job: Job, before: Job | None) -> None:
        """Tell waiting claims and reads of a job write another use case made (a fan-out, a
        group's release), once it is committed."""
        self._events.job_changed(job, before)

    def stop_jobs(self, job_ids: Sequence[str], group_id: str) -> None:
        """Cancel those of the jobs still queued, on their stopping group's behalf."""
        now = self._clock.now()

        def decide(job: Job, _: Instant, __: float) -> Decision[bool]:
            stopped = groups_domain.stop(job, group_id, now)
            return Decision(stopped, stopped is not job)

        for start in range(0, len(job_ids), MAX_BATCH):
            self._apply_many(job_ids[start : start + MAX_BATCH], decide)

    def _apply_deadline(self, job_id: str, now: Instant) -> bool:
        """Apply a passed deadline to one job; True when this call changed it."""
        return self._apply(job_id, _deadline_decision(now))

    def job_counts(self) -> dict[JobState, int]:
        """How many jobs are in each state (for the metrics), read from the store at once."""
        return self._store.job_counts()

    def sweep(self, limit: int | None = None) -> int:
        """Apply passed ack deadlines and execution leases, one bounded batch in one commit;
        returns how many jobs it changed."""
        now = self._clock.now()
        due = self._store.due_jobs(now, limit or self._settings.sweep_batch)
        # Releases a lost write left undone (a crash between a job's end and its group's
        # release, or its waiters' settling); not counted, so that they never make the
        # sweeper hurry.
        self.groups.repair()
        self.keys.repair()
        self._follow_ends(self.dependencies.repair())
        if not due:
            return 0
        answers = self._apply_many([job.id for job in due], _deadline_decision(now))
        return sum(1 for changed in answers if changed is True)

    def prune(self, forget: Callable[[Job], None], limit: int | None = None) -> list[Job]:
        """Delete one bounded batch of finished jobs that ended `retain_finished_s` ago or
        more, oldest first, in one commit: `forget` first deletes what each keeps beside the
        store (its logs and artifacts), then the store its record, attempts and idempotency
        record. Answers the deleted jobs (none while retention is off)."""
        now = self._clock.now()
        retain_ms = self._settings.retain_finished_ms
        if retain_ms > 0:
            # Never while Run may still send the job's logs and artifacts: a file written after
            # its job was deleted would be reached by nothing.
            retain_ms = max(retain_ms, seconds_to_ms(self._settings.transfer_grace_s) + 1)
        ended_by = retention.prune_before(now, retain_ms)
        if ended_by is None:
            return []
        batch = min(limit or self._settings.prune_batch, retention.PRUNE_BATCH_LIMIT)
        candidates = self._store.finished_jobs(ended_by, batch)
        # A group only ever goes from unfinished to finished (its jobs are all made at once),
        # so what is read here can only keep a job one pass longer than needed.
        busy = self._unfinished_groups(candidates)
        awaited = self.dependencies.awaited(candidates)
        found = [
            job for job in candidates if retention.prunable(job, now, retain_ms, busy, awaited)
        ]
        # Their data beside the store goes first: a crash between the two leaves a job
        # without logs (deleted again at the next pass), never files nobody can reach.
        for job in found:
            forget(job)
        return self._store.delete_jobs(
            [job.id for job in found],
            lambda job: retention.prunable(job, now, retain_ms, busy, awaited),
        )

    def _unfinished_groups(self, jobs: Iterable[Job]) -> frozenset[str]:
        """Of the groups these jobs belong to, those with a job that has not ended."""
        group_ids = {job.group_id for job in jobs if job.group_id is not None}
        return frozenset(
            group_id
            for group_id in group_ids
            if not groups_domain.is_done(self._store.group_counts(group_id))
        )

    def release_space(self, pages: int) -> int:
        """Give up to `pages` of the space deleted jobs left back to the file system."""
        return self._store.release_space(pages)

    # -- users ----------------------------------------------------------------------------------

    def create_job(
        self,
        actor: User,
        server_id: str,
        *,
        kind: str,
        payload: JsonValue | None = None,
        max_attempts: int | None = None,
        backoff: Mapping[str, float] | None = None,
        not_before: Instant | None = None,
        idempotency_key: str | None = None,
        concurrency: object = None,
        after: Sequence[str] = (),
        after_group: str | None = None,
        priority: int | None = None,
    ) -> Job:
        """Queue a job for a server the actor may manage; with a concurrency key, held by it
        until its key's limit allows it (`service/keys.py`); with `after` (job ids) or
        `after_group`, held until each of them succeeded (docs/protocol.md, "Dependencies").

        With an `idempotency_key`, the same key and the same request give the same job again;
        the same key with a different request is `IdempotencyConflict`.
        """
        spec = JobSpec(
            kind=kind,
            payload=payload,
            max_attempts=max_attempts,
            backoff=backoff,
            not_before=not_before,
            concurrency=concurrency,
            after=tuple(after or ()),
            after_group=after_group,
            priority=priority,
        )
        return self._create(actor, server_id, [spec], idempotency_key, batch=False)[0]

    def create_jobs(
        self,
        actor: User,
        server_id: str,
        specs: Sequence[JobSpec],
        *,
        idempotency_key: str | None = None,
    ) -> list[Job]:
        """Queue several jobs for one server, all or none, in one commit.

        With an `idempotency_key`, the same key and the same batch give the same jobs again.
        """
        self._check_batch(specs)
        return self._create(actor, server_id, specs, idempotency_key, batch=True)

    def _create(
        self,
        actor: User,
        server_id: str,
        specs: Sequence[JobSpec],
        idempotency_key: str | None,
        *,
        batch: bool,
    ) -> list[Job]:
        server = self._server_for(actor, server_id)
        self._check_kinds(server, specs)
        specs = [
            self._check_dependencies(actor, spec, index, batch) for index, spec in enumerate(specs)
        ]
        now = self._clock.now()

        def build(spec: JobSpec, job_id: str) -> Job:
            return jobs_domain.create_job(
                job_id=job_id,
                server_id=server.id,
                endpoint_id=server.endpoint_id,
                owner_id=server.owner_id,
                kind=spec.kind,
                payload=spec.payload,
                policy=self._policy(spec.max_attempts, spec.backoff),
                now=now,
                not_before=spec.not_before,
                concurrency=concurrency_domain.check(spec.concurrency),
                after=spec.after,
                after_group=spec.after_group,
                priority=spec.priority,
            )

        jobs = [build(spec, self._tokens.identifier("job_")) for spec in specs]
        record = None
        if idempotency_key is not None:
            checks.check_pattern("Idempotency-Key", idempotency_key, checks.IDEMPOTENCY_KEY_PATTERN)
            requests: Any = [spec.request(server.id) for spec in specs]
            fingerprint = hashlib.sha256(
                canonical_json(
                    {"batch": requests} if batch else requests[0],
                    field="request",
                    limit=MAX_BATCH << 16,
                )
            ).hexdigest()
            ids = tuple(job.id for job in jobs)
            record = IdempotencyRecord(actor.id, idempotency_key, fingerprint, ids, now)
        try:
            self._store.insert_jobs(jobs, record)
        except AlreadyExists:
            if record is None:
                raise
            taken = self._store.idempotency_record(actor.id, record.key)
            if taken is None:
                raise
            if taken.fingerprint != record.fingerprint:
                raise IdempotencyConflict() from None
            found = self._store.get_jobs(taken.job_ids)
            if not found:  # a key taken by an older moonrun that stopped before its insert
                # (a key whose first job was deleted went with it: this is never a deletion)
                with contextlib.suppress(AlreadyExists):
                    self._store.insert_jobs(
                        [build(s, i) for s, i in zip(specs, taken.job_ids, strict=True)]
                    )
                found = self._store.get_jobs(taken.job_ids)
            # A batch some of whose later jobs were deleted answers the jobs that remain: a
            # deleted job is never made again.
            return [found[job_id] for job_id in taken.job_ids if job_id in found]
        for job in jobs:
            self._events.job_changed(job, None)
        waiting = [job.id for job in jobs if job.held]
        if waiting:
            # What they name may have ended already: released (or cancelled) at once.
            settled = self.dependencies.settle(waiting)
            self._follow_ends(settled)
            now_are = {after.id: after for _, after in settled}
            jobs = [now_are.get(job.id, job) for job in jobs]
        # Then their keys (a job a settle released is its key's now), read back after.
        return self.keys_declared(jobs)

    def keys_declared(self, jobs: Sequence[Job]) -> list[Job]:
        """New jobs (committed) as they are once their keys released what they allow (their
        keys' limits made theirs)."""
        if not any(job.concurrency is not None for job in jobs):
            return list(jobs)
        self.keys.follow(((None, job) for job in jobs), declare=True)
        found = self._store.get_jobs([job.id for job in jobs])
        return [found.get(job.id, job) for job in jobs]

    def _check_dependencies(self, actor: User, spec: JobSpec, index: int, batch: bool) -> JobSpec:
        """The spec with what it waits on checked (`Dependencies.check`); in a batch, a
        refusal names the job by its index."""
        if not spec.after and spec.after_group is None:
            return spec
        try:
            after, group = self.dependencies.check(actor, spec.after, spec.after_group)
        except InvalidRequest as error:
            if not batch:
                raise
            where = f"jobs[{index}]"
            raise InvalidRequest(
                f"{where}.{error.message}",
                fields=tuple((f"{where}.{f}", m) for f, m in error.fields),
            ) from None
        return replace(spec, after=after, after_group=group)

    def _check_kinds(self, server: Server, specs: Sequence[JobSpec]) -> None:
        """Refuse jobs that the server's Run said it cannot run (nothing advertised: all
        pass). In a batch, the refusal names the job by its index."""
        advertisement = self._store.get_advertisement(server.endpoint_id)
        if advertisement is None:
            return
        kinds = _advertised(advertisement.kinds_json)
        for index, spec in enumerate(specs):
            payload = {} if spec.payload is None else spec.payload
            try:
                kinds.check(spec.kind, payload)
            except (UnknownKind, InvalidPayload) as error:
                if len(specs) == 1:
                    raise
                where = f"jobs[{index}]"
                if isinstance(error, UnknownKind):
                    raise UnknownKind(f"{where}: {error.message}") from None
                raise InvalidPayload(
                    f"{where}: {error.message}",
                    fields=tuple((f"{where}.{f}" if f else where, m) for f, m in error.fields),
                ) from None

    def group_jobs(
        self,
        servers: Sequence[Server],
        spec: JobSpec,
        group_id: str,
        job_ids: Sequence[str],
        max_parallel: int | None,
        now: Instant,
        *,
        schedule_id: str | None = None,
        scheduled_for: Instant | None = None,
    ) -> list[Job]:
        """A fan-out's jobs, one per server with the id of the same place (ids in release
        order), checked as a create checks them (each endpoint's kinds read once); those past
        `max_parallel` held; a selector schedule's firing's carry its schedule and time. Not
        stored."""
        checked: set[str] = set()
        policy = self._policy(spec.max_attempts, spec.backoff)
        jobs = []
        for position, (server, job_id) in enumerate(zip(servers, job_ids, strict=True)):
            if server.endpoint_id not in checked:
                try:
                    self._check_kinds(server, [spec])
                except (UnknownKind, InvalidPayload) as error:
                    raise type(error)(
                        f"server {server.name}: {error.message}", fields=error.fields
                    ) from None
                checked.add(server.endpoint_id)
            jobs.append(
                jobs_domain.create_job(
                    job_id=job_id,
                    server_id=server.id,
                    endpoint_id=server.endpoint_id,
                    owner_id=server.owner_id,
                    kind=spec.kind,
                    payload=spec.payload,
                    policy=policy,
                    now=now,
                    not_before=spec.not_before,
                    group_id=group_id,
                    held=groups_domain.starts_held(position, max_parallel),
                    concurrency=concurrency_domain.check(spec.concurrency),
                    priority=spec.priority,
                    schedule_id=schedule_id,
                    scheduled_for=scheduled_for,
                )
            )
        return jobs

    def manageable_server(self, actor: User, server_id: str) -> Server:
        """A server whose jobs the actor may manage (404 `not_found`, 403 `forbidden`)."""
        return self._server_for(actor, server_id)

    def scheduled_job(
        self,
        server: Server,
        spec: JobSpec,
        *,
        job_id: str,
        schedule_id: str,
        scheduled_for: Instant,
    ) -> Job:
        """The job a schedule's firing makes, checked as a create checks it; not stored."""
        self._check_kinds(server, [spec])
        return jobs_domain.create_job(
            job_id=job_id,
            server_id=server.id,
            endpoint_id=server.endpoint_id,
            owner_id=server.owner_id,
            kind=spec.kind,
            payload=spec.payload,
            policy=self._policy(spec.max_attempts, spec.backoff),
            now=self._clock.now(),
            schedule_id=schedule_id,
            scheduled_for=scheduled_for,
            priority=spec.priority,
            concurrency=concurrency_domain.check(spec.concurrency),
        )

    def job_stored(self, job: Job) -> None:
        """Tell waiting claims and reads of a new job stored by another use case (a schedule's
        firing), once it is committed."""
        self._events.job_changed(job, None)

    def server_kinds(self, actor: User, server_id: str) -> Advertisement | None:
        """What the Run of a server the actor may manage advertised it runs, if anything."""
        server = self._server_for(actor, server_id)
        return self._store.get_advertisement(server.endpoint_id)

    def rerun_job(self, actor: User, job_id: str, *, idempotency_key: str | None = None) -> Job:
        """Queue a new job like a finished one: same server, kind, payload, retry policy,
        concurrency key and priority."""
        old = self._accessible_job(actor, job_id)
        if not old.state.is_terminal:
            raise JobNotFinished()
        server = self._store.get_server(old.server_id)
        if server is None:
            raise NotFound("the job's server was removed")
        policy = old.policy
        backoff = {"initial_s": policy.initial_s, "multiplier": policy.multiplier}
        spec = JobSpec(
            kind=old.kind,
            payload=old.payload(),
            max_attempts=policy.max_attempts,
            backoff={**backoff, "max_s": policy.max_s},
            concurrency=old.concurrency,
            priority=old.priority,
        )
        return self._create(actor, server.id, [spec], idempotency_key, batch=False)[0]

    def _policy(self, max_attempts: int | None, backoff: Mapping[str, float] | None) -> RetryPolicy:
        default = self._default_policy
        if max_attempts is None and backoff is None:
            return default
        if backoff is not None and not isinstance(backoff, Mapping):
            raise InvalidRequest("backoff must be an object")
        extra = set(backoff or {}) - {"initial_s", "multiplier", "max_s"}
        if extra:
            raise InvalidRequest(f"unknown backoff fields: {', '.join(sorted(extra))}")
        policy = replace(
            default,
            max_attempts=default.max_attempts if max_attempts is None else max_attempts,
            **dict(backoff or {}),
        )
        # Checked here, for what a user asks, rather than in RetryPolicy: policies stored
        # before this check must still read back.
        if policy.max_s < policy.initial_s:
            raise InvalidRequest(
                f"backoff max_s ({policy.max_s:g}) must be at least "
                f"initial_s ({policy.initial_s:g})"
            )
        return policy

    def get_job(self, actor: User, job_id: str) -> Job:
        """An accessible job, with any deadline that has passed applied first."""
        job = self._accessible_job(actor, job_id)
        now = self._clock.now()

        def decide(job: Job, _: Instant, draw: float) -> Decision[Job]:
            updated = jobs_domain.apply_due_deadline(job, now=now, draw=draw)
            return Decision(updated, updated)

        return self._apply(job_id, decide, job)

    async def wait_for_job(
        self,
        actor: Callable[[], User],
        job_id: str,
        until: Callable[[Job], bool],
        *,
        wait_s: float,
        waiting: Waiting,
    ) -> Job:
        """`get_job` as `actor()` (who is asked again at every read, so that a revoked
        credential or a lost right ends the wait), once `until` holds of the job, or the job as
        it is when `wait_s` passes or the client leaves.

        Bounded per user, per client address and in all: TooManyWaiting beyond.
        """
        deadline = time.monotonic() + wait_s

        def read() -> tuple[User, Job]:
            user = actor()
            return user, self.get_job(user, job_id)

        user, job = await waiting.run(read)
        if until(job) or wait_s <= 0:
            return job
        _, job = await self.waiters.wait_until(
            read,
            lambda read: until(read[1]),
            on=(JOB, job_id),
            rooms=self.waiters.read_rooms(user.id, waiting.address),
            deadline=deadline,
            waiting=waiting,
            wanted=until,
        )
        return job

    def cancel_job(self, actor: User, job_id: str) -> CancelOutcome:
        """Persist a cancel intent (idempotent); waiting jobs end `cancelled` at once."""
        stored = self._accessible_job(actor, job_id)
        return self._apply(job_id, _cancel_decision(actor), stored)

    def cancel_jobs(
        self, actor: User, job_ids: Sequence[str]
    ) -> list[CancelOutcome | MoonrunError]:
        """Cancel several jobs in one commit, each as `cancel_job` would: its outcome, or the
        refusal a cancel of it alone gets (404 `not_found`, 403 `forbidden`), in order.

        1 to MAX_BATCH jobs, each at most once, else `InvalidRequest` for the whole request.
        """
        self._check_batch(job_ids)
        if len(set(job_ids)) != len(job_ids):
            raise InvalidRequest("each job may appear only once in a batch")
        refused = self._refused_jobs(actor, job_ids)
        allowed = [job_id for job_id in job_ids if job_id not in refused]
        outcomes = iter(self._apply_many(allowed, _cancel_decision(actor)) if allowed else ())
        return [refused[job_id] if job_id in refused else next(outcomes) for job_id in job_ids]

    def delete_job(self, actor: User, job_id: str, forget: Callable[[Job], None]) -> Job:
        """Delete a finished job the actor may manage, now: `forget` first deletes what it
        keeps beside the store (its logs and artifacts), then the store its record, attempts
        and idempotency record. Answers the job as it was.

        A job the actor may not manage is 404 as if it did not exist (its id reveals
        nothing); one that has not ended (or that something still needs) is `JobNotEnded`.
        """
        job = self._store.get_job(job_id)
        if job is None:
            raise NotFound("no such job")
        try:
            _require_job_access(actor, self._store.get_server(job.server_id))
        except Forbidden:
            raise NotFound("no such job") from None
        now = self._clock.now()
        busy = self._unfinished_groups([job])
        awaited = self.dependencies.awaited([job])
        if not retention.deletable(job, now, busy, awaited):
            if job.state.is_terminal and job.id in awaited:
                raise JobNotEnded(
                    "A job waiting on that one has not been released yet; it can be deleted "
                    "once it has."
                )
            if job.state.is_terminal:
                raise JobNotEnded(
                    "That job's group has not ended yet; its jobs can be deleted once all have."
                )
            raise JobNotEnded()
        # A log batch or artifact chunk whose evidence was checked just before this (within
        # the transfer grace of the job's end) may still land after it: a race of milliseconds,
        # left to the user who deletes a job at the moment it ends.
        forget(job)
        deleted = self._store.delete_jobs(
            [job_id], lambda stored: retention.deletable(stored, now, busy, awaited)
        )
        if not deleted:  # another request deleted it meanwhile
            raise NotFound("no such job")
        return job

    def list_jobs(
        self,
        actor: User,
        *,
        server_id: str | None = None,
        state: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        kind: str | None = None,
        id_prefix: str | None = None,
        group_id: str | None = None,
    ) -> JobPage:
        """The jobs the actor may see, newest first, a page at a time; by server, state,
        kind, id prefix and group (a group the actor may see; not with a server)."""
        check_int("limit", limit, 1, MAX_PAGE)
        if state is not None and state not in JobState.__members__.values():
            raise InvalidRequest(f"state must be one of {', '.join(JobState)}")
        if kind is not None:
            checks.check_pattern("kind", kind, jobs_domain.KIND_PATTERN)
        if id_prefix is not None and not checks.ID_PREFIX_PATTERN.match(id_prefix):
            raise InvalidRequest(
                "id_prefix must be 7 to 64 letters, digits, _ or - "
                "(the start of a job id: job_ and at least 3 more)"
            )
        server_ids: list[str] | None
        if group_id is not None:
            if server_id is not None:
                raise InvalidRequest("group and server_id cannot be given together")
            self.groups.accessible(actor, group_id)
            server_ids = None
        elif server_id is not None:
            server_ids = [self._server_for(actor, server_id).id]
        elif actor.platform_admin:
            server_ids = None
        else:
            server_ids = [server.id for server in self._store.servers_of_user(actor.id)]
        jobs = self._store.list_jobs(
            server_ids=server_ids,
            state=None if state is None else JobState(state),
            limit=limit + 1,
            after=checks.decode_cursor(cursor),
            kind=kind,
            id_prefix=id_prefix,
            group_id=group_id,
        )
        page = tuple(jobs[:limit])
        next_cursor = checks.encode_cursor(page[-1]) if len(jobs) > limit else None
        return JobPage(page, next_cursor)

    def _accessible_job(self, actor: User, job_id: str) -> Job:
        found = self._store.job_and_server(job_id)
        if found is None:
            raise NotFound("no such job")
        job, server = found
        _require_job_access(actor, server)
        return job

    def _refused_jobs(self, actor: User, job_ids: Sequence[str]) -> dict[str, MoonrunError]:
        """Of `job_ids`, those `_accessible_job` refuses, with its refusal (read in one query,
        each server once)."""
        jobs = self._store.get_jobs(job_ids)
        servers: dict[str, Server | None] = {}
        refused: dict[str, MoonrunError] = {}
        for job_id in job_ids:
            job = jobs.get(job_id)
            if job is None:
                refused[job_id] = NotFound("no such job")
                continue
            if job.server_id not in servers:
                servers[job.server_id] = self._store.get_server(job.server_id)
            try:
                _require_job_access(actor, servers[job.server_id])
            except Forbidden as error:
                refused[job_id] = error
        return refused

    def _server_for(self, actor: User, server_id: str) -> Server:
        server = self._store.get_server(server_id)
        if server is None:
            raise NotFound("no such server")
        require(can_manage_jobs(actor, server))
        return server


@functools.lru_cache(maxsize=64)
def _advertised(kinds_json: str) -> kinds_domain.Kinds:
    """An advertisement, parsed and compiled once (a few distinct ones are in use at once)."""
    return kinds_domain.Kinds(kinds_domain.load_advertisement(kinds_json))


def _require_job_access(actor: User, server: Server | None) -> None:
    """`Forbidden` unless the actor may manage the jobs of `server` (None: removed). The jobs of
    a removed server stay, for platform admins only (docs/protocol.md, "Servers")."""
    require(actor.platform_admin or (server is not None and can_manage_jobs(actor, server)))


def _cancel_decision(actor: User) -> Callable[[Job, Instant, float], Decision[CancelOutcome]]:
    """A cancel by `actor`, as the job stands: any passed deadline first, then the intent."""

    def decide(job: Job, now: Instant, draw: float) -> Decision[CancelOutcome]:
        current = jobs_domain.apply_due_deadline(job, now=now, draw=draw)
        updated = jobs_domain.request_cancel(current, user_id=actor.id, now=now)
        waits = jobs_domain.cancel_waits_on_run(updated)
        return Decision(updated, CancelOutcome(updated, waits, current.state.is_terminal))

    return decide


def _answer(decision: Decision[T]) -> T:
    """The decision's answer, or its rejection raised."""
    if decision.error is not None:
        raise decision.error
    assert decision.answer is not None
    return decision.answer


def _ended(before: Job | None, after: Job) -> bool:
    """The write ended the job (it became terminal)."""
    return after.state.is_terminal and (before is None or not before.state.is_terminal)


def _deadline_decision(now: Instant) -> Callable[[Job, Instant, float], Decision[bool]]:
    """Apply a deadline passed by `now`; the answer says whether the job changed."""

    def decide(job: Job, _: Instant, draw: float) -> Decision[bool]:
        updated = jobs_domain.apply_due_deadline(job, now=now, draw=draw)
        return Decision(updated, updated is not job)

    return decide
