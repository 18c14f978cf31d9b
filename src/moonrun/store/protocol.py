"""The narrow seam every store implements: records and compare-and-swap, no scheduling logic.

Writes that may race use optimistic concurrency: `replace_*` stores the new record only when
the stored `version` still equals the expected one, and returns False otherwise. Inserts of
a duplicate id or unique name raise `AlreadyExists`. A method returns only once its write is
committed (durable, for the file and MySQL stores), except inside a call FileStore's loop
flusher applies (`FileStore.run_in_group`): there it returns once its write is applied, and
the call is answered once the group holding it is committed (`after_commit` waits with it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from moonrun.scheduling.groups import Group
from moonrun.scheduling.jobs import Job, JobState
from moonrun.scheduling.records import Advertisement, Endpoint, Server, Session, User
from moonrun.scheduling.schedules import Schedule
from moonrun.scheduling.time import Instant

JobCursor = tuple[Instant, str]
"""(created_at, id) of the last job of a page; listings continue strictly after it."""


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """A user's Idempotency-Key, the fingerprint of the request that took it, and the jobs that
    request made (one, or a batch in order)."""

    user_id: str
    key: str
    fingerprint: str
    job_ids: tuple[str, ...]
    created_at: Instant


@dataclass(frozen=True, slots=True)
class ScheduleWrite:
    """One schedule's new record, the version it was read at, and the job its firing made (or,
    for a selector schedule, the group and the group's jobs)."""

    schedule: Schedule
    expected_version: int
    job: Job | None = None
    group: Group | None = None
    group_jobs: tuple[Job, ...] = ()


class Store(Protocol):
    # -- jobs ----------------------------------------------------------------------------
    def get_job(self, job_id: str) -> Job | None: ...

    def job_and_server(self, job_id: str) -> tuple[Job, Server | None] | None:
        """The job and the server it runs on (None if that is gone), read together: every
        job a user reads is checked against its server's owner and admins."""

    def get_jobs(self, job_ids: Collection[str]) -> dict[str, Job]:
        """The jobs of those ids that exist, by id."""
        ...

    def insert_job(self, job: Job) -> None: ...

    def insert_jobs(
        self,
        jobs: Sequence[Job],
        idempotency: IdempotencyRecord | None = None,
        group: Group | None = None,
    ) -> None:
        """Insert every job, and the idempotency record and the group when given, atomically:
        when an id or the key is taken, `AlreadyExists` and nothing is stored. What each job
        waits on (`Job.waits_on`) is recorded with it, for `waiters`."""
        ...

    def replace_job(self, job: Job, expected: Job) -> bool:
        """Store `job` if the stored record is still `expected` (same version); False on
        conflict. Only what differs from `expected` needs writing."""
        ...

    def update_jobs(
        self, job_ids: Sequence[str], change: Callable[[Job], Job]
    ) -> dict[str, tuple[Job, Job]]:
        """Read each job and store `change(job)` in its place, atomically per job, committed
        together: no other write to the job comes between the read and the write. `change` must
        return the job itself (nothing to store) or a record with a higher `version`, and may
        be called again with the job as another write left it (a store that writes one job
        optimistically does, PostgresStore): only its last answer is stored.
        Answers (before, after) per job id found; unknown ids are left out."""
        ...

    def claimable_jobs(self, endpoint_id: str, now: Instant, limit: int) -> list[Job]:
        """Queued/retrying jobs of the endpoint with `eligible_at <= now` and no cancel intent,
        oldest `eligible_at` first (then `created_at`, then id)."""
        ...

    def claim_jobs(
        self,
        endpoint_id: str,
        now: Instant,
        limit: int,
        grant: Callable[[Job], Job],
        after_owner: str | None = None,
    ) -> list[Job]:
        """Atomically claim up to `limit` of the endpoint's claimable jobs, chosen and ordered
        as `scheduling.fairness.take_by_priority` says: the most urgent rank first
        (`Job.claim_rank`), and within a rank owners take turns from the first owner after
        `after_owner`, each owner's oldest first (`claimable_jobs` order). Store what `grant`
        returns for each (its `version` one above) and return those records in that order. A
        job that another caller is claiming at the same moment is skipped, so no job version
        is ever granted twice. The cost grows with `limit`, the number of ranks and the number of
        owners with waiting jobs, not with the number of jobs waiting."""
        ...

    def due_jobs(self, now: Instant, limit: int) -> list[Job]:
        """Accepted/running jobs whose live deadline is `<= now`, earliest first."""
        ...

    def active_jobs(self, endpoint_id: str) -> list[Job]:
        """The endpoint's accepted/running jobs."""
        ...

    def active_deadlines(self, endpoint_id: str) -> list[tuple[str, Instant | None]]:
        """(id, live deadline) of the endpoint's accepted/running jobs: what a claim's capacity
        check needs, without reading whole records."""
        ...

    def next_claimable_at(self, endpoint_id: str) -> Instant | None:
        """The earliest `claimable_at` among the endpoint's waiting jobs, if any."""
        ...

    def job_counts(self) -> dict[JobState, int]:
        """How many jobs are in each state (states with none may be missing); its cost does not
        grow with the number of jobs."""
        ...

    def list_jobs(
        self,
        *,
        server_ids: Collection[str] | None,
        state: JobState | None,
        limit: int,
        after: JobCursor | None = None,
        kind: str | None = None,
        id_prefix: str | None = None,
        group_id: str | None = None,
    ) -> list[Job]:
        """Jobs newest first (`created_at`, then id, descending), optionally filtered;
        `server_ids=None` means every server. `id_prefix` keeps the jobs whose id starts with
        it (the caller keeps it long enough to be selective); `group_id` the group's jobs
        (then `server_ids` must be None)."""
        ...

    def finished_jobs(self, ended_by: Instant, limit: int) -> list[Job]:
        """Up to `limit` finished jobs that ended at or before `ended_by` (`terminal.at`),
        earliest first (then by id); its cost grows with `limit`, not with the jobs stored."""
        ...

    def delete_jobs(self, job_ids: Sequence[str], deletable: Callable[[Job], bool]) -> list[Job]:
        """Delete, in one write, each job of `job_ids` for which `deletable(job)` holds of the
        record as stored at that moment, with the idempotency record of the request that made
        it (a record goes with the first job of its request). Answers the deleted jobs; unknown
        ids and jobs `deletable` refuses are left as they are."""
        ...

    def release_space(self, pages: int) -> int:
        """Give back to the file system up to `pages` of the space deleted rows left free, in
        one short write; answers how many were given back (0 for stores that keep none)."""
        ...

    def idempotency_record(self, user_id: str, key: str) -> IdempotencyRecord | None:
        """What the user's Idempotency-Key was taken for, if it was."""
        ...

    # -- groups ----------------------------------------------------------------------------
    def get_group(self, group_id: str) -> Group | None: ...

    def groups_of(self, creator_id: str, limit: int) -> list[Group]:
        """The newest `limit` groups `creator_id` made, newest first (by `created_at`, then
        id). Read for a person's list page: it walks the groups table (no index by creator)."""
        ...

    def group_counts(self, group_id: str) -> dict[JobState, int]:
        """How many of the group's jobs are in each state (states with none may be missing)."""
        ...

    def release_held(
        self,
        group_id: str,
        how_many: Callable[[int, int], int],
        release: Callable[[Job], Job],
    ) -> dict[str, tuple[Job, Job]]:
        """In one write, serialised with every other release of the group: count the group's
        live jobs (neither held nor terminal) and its held ones, ask `how_many(live, held)` to
        release, and store what `release` returns for that many held jobs, oldest first
        (created_at, then id). Answers (before, after) per job released."""
        ...

    def held_groups(self, after: str | None, limit: int) -> list[str]:
        """Up to `limit` ids of groups with held jobs, in id order after `after` (the sweeper
        walks them all, a few at a time, to release what a lost write left held)."""
        ...

    # -- concurrency keys ------------------------------------------------------------------
    def release_key(
        self,
        owner_id: str,
        key: str,
        limit: int,
        declare: bool,
        how_many: Callable[[int, int, int], int],
        release: Callable[[Job], Job],
    ) -> dict[str, tuple[Job, Job]]:
        """In one write, serialised with every other release of the owner's key (on MySQL
        and PostgreSQL by its row in `concurrency_keys`): set the key's limit to `limit` when
        `declare` (or when the key has none yet), count its live jobs (`Job.live_key`) and its
        held ones (`Job.held_key`), ask `how_many(key's limit, live, held)` to release, and
        store what `release` returns for that many held jobs, oldest first (created_at, then
        id). Answers (before, after) per job released."""
        ...

    def held_keys(self, after: tuple[str, str] | None, limit: int) -> list[tuple[str, str]]:
        """Up to `limit` (owner id, key) with held jobs, in (key, owner id) order after
        `after` (the sweeper walks them all, a few at a time)."""
        ...

    # -- dependencies ----------------------------------------------------------------------
    def waiters(self, on_ids: Collection[str]) -> list[str]:
        """The ids of the jobs that named any of `on_ids` (job or group ids) as a dependency,
        each once, whether they still wait or not (`insert_jobs` records what each job names)."""
        ...

    def dependency_held_jobs(self, after: str | None, limit: int) -> list[Job]:
        """Up to `limit` jobs still held on their dependencies (`Job.dependency_held`), in id
        order after `after` (the sweeper walks them all, a few at a time, to settle what a
        lost write left waiting)."""
        ...

    # -- endpoints and sessions ------------------------------------------------------------
    def insert_endpoint(self, endpoint: Endpoint) -> None: ...

    def get_endpoint(self, endpoint_id: str) -> Endpoint | None: ...

    def endpoint_by_join_token(self, token_hash: str) -> Endpoint | None: ...

    def replace_endpoint(self, endpoint: Endpoint, expected_version: int) -> bool: ...

    def list_endpoints(self) -> list[Endpoint]: ...

    def delete_endpoint(self, endpoint_id: str) -> int:
        """Delete the endpoint, its sessions and its advertisement, unless servers still point
        at it: answers how many do (0: it was deleted, or never existed)."""
        ...

    def set_advertisement(self, endpoint_id: str, advertisement: Advertisement | None) -> None:
        """Store what the endpoint's Run advertised, in place of what it advertised before
        (`None`: it advertised nothing)."""
        ...

    def get_advertisement(self, endpoint_id: str) -> Advertisement | None: ...

    def insert_session(self, session: Session) -> None: ...

    def get_session(self, session_id: str) -> Session | None: ...

    def session_with_endpoint(self, session_id: str) -> tuple[Session, Endpoint] | None:
        """The session and its endpoint, read together (every signed request needs both)."""
        ...

    def extend_session(self, session_id: str, seen_at: Instant, expires_at: Instant) -> None:
        """Record a request: set `last_seen_at` and `expires_at` only when `expires_at` is later
        than the stored expiry (so concurrent extensions never shorten a session)."""
        ...

    def extend_sessions(self, extensions: Sequence[tuple[str, Instant, Instant]]) -> None:
        """`extend_session` for each (session id, seen at, expires at), in one write: the
        heartbeats that arrive together share one commit."""

    def record_beats(self, beats: Mapping[str, Instant]) -> None:
        """Record heartbeats (session id -> when it beat), all in one write: each session's
        `last_seen_at` becomes the later of the stored and the given (a beat older than the
        stored one never moves it back); unknown sessions are skipped; nothing else changes
        (a session's expiry is `extend_session`'s)."""
        ...

    def latest_session(self, endpoint_id: str) -> Session | None:
        """The endpoint's session of the highest generation (the last seen first among
        equals): the one that was current last, once none is (its Run stopped cleanly)."""
        ...

    def mark_session_reconciled(self, session_id: str, at: Instant) -> None: ...

    # -- users, tokens and servers ---------------------------------------------------------
    def insert_user(self, user: User) -> None: ...

    def get_user(self, user_id: str) -> User | None: ...

    def user_by_name(self, name: str) -> User | None: ...

    def list_users(self) -> list[User]: ...

    def insert_api_token(self, token_hash: str, user_id: str, created_at: Instant) -> None: ...

    def user_by_api_token(self, token_hash: str) -> User | None: ...

    def replace_api_tokens(self, user_id: str, token_hash: str, created_at: Instant) -> None:
        """In one write, the user's API tokens are revoked and this one is their only token."""
        ...

    def set_password_hash(self, user_id: str, password_hash: str | None) -> None: ...

    def set_user_disabled(self, user_id: str, disabled: bool) -> None:
        """Mark the user disabled (or enabled again); an unknown id changes nothing."""
        ...

    def insert_web_session(
        self, token_hash: str, user_id: str, created_at: Instant, expires_at: Instant
    ) -> None: ...

    def web_session_user(self, token_hash: str, now: Instant) -> User | None:
        """The user of an unexpired console session."""
        ...

    def delete_web_session(self, token_hash: str) -> None: ...

    def insert_server(self, server: Server) -> None: ...

    def get_server(self, server_id: str) -> Server | None: ...

    def replace_server(self, server: Server, expected_version: int) -> bool: ...

    def list_servers(self) -> list[Server]: ...

    def servers_of_user(self, user_id: str) -> list[Server]:
        """Servers the user owns or administers."""
        ...

    def delete_server(self, server_id: str) -> int:
        """Delete the server, its administrators and its schedules, unless any of its jobs is
        not terminal: answers how many are not (0: it was deleted, or never existed). Its jobs
        stay."""
        ...

    # -- schedules -------------------------------------------------------------------------
    def insert_schedule(self, schedule: Schedule) -> None: ...

    def get_schedule(self, schedule_id: str) -> Schedule | None: ...

    def fire_schedules(self, writes: Sequence[ScheduleWrite]) -> list[bool]:
        """For each write, in one commit: store its schedule if the stored one still has
        `expected_version`, and then insert its job unless a job with that id exists already
        (a firing's id is derived from its schedule and time: this is what makes each firing
        happen at most once), and its group with the group's jobs unless a group with that id
        exists already (likewise derived). Answers, per write, whether it was stored (False: a
        conflict, and nothing of that write stored)."""
        ...

    def delete_schedule(self, schedule_id: str) -> bool:
        """Delete it; False when there was none."""
        ...

    def list_schedules(self, server_id: str | None = None) -> list[Schedule]:
        """Every schedule, or one server's, oldest first."""
        ...

    def selector_schedules(self, owner_id: str) -> list[Schedule]:
        """The selector schedules `owner_id` made, oldest first."""
        ...

    def due_schedules(self, now: Instant, limit: int) -> list[Schedule]:
        """Schedules not paused whose cursor `next_at` is `<= now`, earliest first."""
        ...

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run `action` once everything this thread wrote so far is committed: at once,
        unless this thread is applying a group of FileStore's loop flusher (then after that
        group's COMMIT returned, and never when it failed)."""
        ...

    def close(self) -> None: ...
