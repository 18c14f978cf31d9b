"""MemoryStore: the small, thread-safe reference store. Records are frozen, so sharing is safe."""

from __future__ import annotations

import bisect
import heapq
import threading
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from moonrun.errors import AlreadyExists
from moonrun.scheduling.fairness import NextOwner, Oldest, take_by_priority
from moonrun.scheduling.groups import Group, release_order
from moonrun.scheduling.jobs import Job, JobState
from moonrun.scheduling.records import Advertisement, Endpoint, Server, Session, User
from moonrun.scheduling.schedules import Schedule
from moonrun.scheduling.time import Instant
from moonrun.store.protocol import IdempotencyRecord, JobCursor, ScheduleWrite

_WaitKey = tuple[Instant, Instant, str]
"""(claimable_at, created_at, job id): the claim order."""


@dataclass
class _JobIndexes:
    """Keys that answer the claim, deadline and active queries without scanning every job.

    Waiting jobs sit in a heap per endpoint, and again in a heap per endpoint, rank and owner
    (for claims, where the most urgent rank goes first and owners take turns within it):
    claims take from the front and new jobs arrive at the back, and a heap does both in
    O(log n) where a sorted list would shift every entry. A job that stops waiting leaves
    stale heap entries behind, recognised and dropped when they surface (`waiting_key` holds
    each waiting job's one live key). `ranks` lists, per endpoint and in order, the ranks
    with waiting jobs, and `owners`, per endpoint and rank and in id order, the owners with
    waiting jobs (`waiting_count` of them each).
    """

    waiting: dict[str, list[_WaitKey]] = field(default_factory=dict)
    waiting_key: dict[str, _WaitKey] = field(default_factory=dict)
    owner_waiting: dict[tuple[str, int, str], list[_WaitKey]] = field(default_factory=dict)
    ranks: dict[str, list[int]] = field(default_factory=dict)
    owners: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    waiting_count: Counter[tuple[str, int, str]] = field(default_factory=Counter)
    deadlines: list[tuple[Instant, str]] = field(default_factory=list)
    finished: list[tuple[Instant, str]] = field(default_factory=list)
    """A heap of (terminal.at, id) of the finished jobs, for retention: pruning takes from its
    front, where a sorted list would shift every entry. A deleted job's entry is stale, and
    dropped when it surfaces (`first_finished`)."""
    active: dict[str, set[str]] = field(default_factory=dict)
    counts: Counter[JobState] = field(default_factory=Counter)
    dependency_held: set[str] = field(default_factory=set)
    """The jobs still held on their dependencies."""

    def replace(self, old: Job | None, new: Job) -> None:
        live = self.waiting_key.get(new.id)
        if new.dependency_held:
            self.dependency_held.add(new.id)
        else:
            self.dependency_held.discard(new.id)
        if old is not None:
            self._remove(old)
            self.counts[old.state] -= 1
        self.counts[new.state] += 1
        if new.claimable_at is not None:
            key = (new.claimable_at, new.created_at, new.id)
            if live != key:  # an unchanged key keeps its heap entries
                heapq.heappush(self.waiting.setdefault(new.endpoint_id, []), key)
                owner = (new.endpoint_id, _rank(new), new.owner_id)
                heapq.heappush(self.owner_waiting.setdefault(owner, []), key)
            self.waiting_key[new.id] = key
            self._count_owner(new, 1)
        if new.deadline_at is not None:
            bisect.insort(self.deadlines, (new.deadline_at, new.id))
        if new.terminal is not None and (old is None or old.terminal != new.terminal):
            heapq.heappush(self.finished, (new.terminal.at, new.id))
        if new.state.is_active:
            self.active.setdefault(new.endpoint_id, set()).add(new.id)

    def _remove(self, job: Job) -> None:
        if job.claimable_at is not None:
            self.waiting_key.pop(job.id, None)
            self._count_owner(job, -1)
        if job.deadline_at is not None:
            _discard(self.deadlines, (job.deadline_at, job.id))
        if job.state.is_active:
            self.active[job.endpoint_id].discard(job.id)

    def first_finished(self, jobs: Mapping[str, Job], ended_by: Instant, limit: int) -> list[str]:
        """Ids of up to `limit` finished jobs that ended by `ended_by`, earliest first."""
        heap = self.finished
        taken: list[tuple[Instant, str]] = []
        while heap and len(taken) < limit:
            key = heap[0]
            job = jobs.get(key[1])
            live = job is not None and job.terminal is not None and job.terminal.at == key[0]
            if not live or (taken and key == taken[-1]):
                heapq.heappop(heap)  # deleted, or a duplicate of a live key: drop it for good
                continue
            if key[0] > ended_by:
                break
            taken.append(heapq.heappop(heap))
        for key in taken:
            heapq.heappush(heap, key)
        return [key[1] for key in taken]

    def delete(self, job: Job) -> None:
        """The job leaves the store."""
        self._remove(job)
        self.counts[job.state] -= 1

    def _count_owner(self, job: Job, delta: int) -> None:
        """One more (or one fewer) waiting job of the job's owner at its rank on its endpoint."""
        rank = _rank(job)
        key = (job.endpoint_id, rank, job.owner_id)
        self.waiting_count[key] += delta
        if self.waiting_count[key] == delta:  # from none to one: the owner waits now
            owners = self.owners.setdefault((job.endpoint_id, rank), [])
            if not owners:  # and the rank with it
                bisect.insort(self.ranks.setdefault(job.endpoint_id, []), rank)
            bisect.insort(owners, job.owner_id)
        elif self.waiting_count[key] == 0:
            del self.waiting_count[key]
            owners = self.owners[(job.endpoint_id, rank)]
            del owners[bisect.bisect_left(owners, job.owner_id)]
            if not owners:
                del self.owners[(job.endpoint_id, rank)]
                ranks = self.ranks[job.endpoint_id]
                del ranks[bisect.bisect_left(ranks, rank)]

    def next_rank(self, endpoint_id: str, after: int | None) -> tuple[int, str] | None:
        """The smallest rank above `after` with waiting jobs on the endpoint, and its first
        owner."""
        ranks = self.ranks.get(endpoint_id, [])
        at = 0 if after is None else bisect.bisect_right(ranks, after)
        if at == len(ranks):
            return None
        return ranks[at], self.owners[(endpoint_id, ranks[at])][0]

    def next_owner(self, endpoint_id: str, rank: int, after: str | None) -> str | None:
        """The smallest owner id above `after` with waiting jobs of `rank` on the endpoint."""
        owners = self.owners.get((endpoint_id, rank), [])
        at = 0 if after is None else bisect.bisect_right(owners, after)
        return owners[at] if at < len(owners) else None

    def first_waiting(self, endpoint_id: str, now: Instant, limit: int) -> list[str]:
        """Ids of up to `limit` jobs waiting with `claimable_at <= now`, in claim order."""
        return self._first(self.waiting.get(endpoint_id, []), now, limit)

    def first_waiting_of(
        self, endpoint_id: str, rank: int, owner_id: str, now: Instant, limit: int
    ) -> list[str]:
        """`first_waiting` of one owner's jobs of one rank."""
        heap = self.owner_waiting.get((endpoint_id, rank, owner_id), [])
        return self._first(heap, now, limit)

    def _first(self, heap: list[_WaitKey], now: Instant, limit: int) -> list[str]:
        taken: list[_WaitKey] = []
        while heap and len(taken) < limit:
            key = heap[0]
            if self.waiting_key.get(key[2]) != key or (taken and key == taken[-1]):
                heapq.heappop(heap)  # stale, or a duplicate of a live key: drop it for good
                continue
            if key[0] > now:
                break
            taken.append(heapq.heappop(heap))
        for key in taken:
            heapq.heappush(heap, key)
        return [key[2] for key in taken]

    def next_waiting(self, endpoint_id: str) -> Instant | None:
        """The earliest claimable_at of the endpoint's waiting jobs."""
        heap = self.waiting.get(endpoint_id, [])
        while heap and self.waiting_key.get(heap[0][2]) != heap[0]:
            heapq.heappop(heap)  # stale
        return heap[0][0] if heap else None


def _rank(job: Job) -> int:
    """The rank of a waiting job's claims (`Job.claim_rank`, set while it is claimable)."""
    rank = job.claim_rank
    assert rank is not None, f"job {job.id} is not claimable"
    return rank


def _discard(keys: list[tuple[Instant, str]], key: tuple[Instant, str]) -> None:
    """Remove `key` from the sorted `keys`, if it is there."""
    index = bisect.bisect_left(keys, key)
    if index < len(keys) and keys[index] == key:
        del keys[index]


class MemoryStore:
    """Everything in dicts behind one lock; lost when the process ends."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._jobs: dict[str, Job] = {}
        self._index = _JobIndexes()
        self._endpoints: dict[str, Endpoint] = {}
        self._sessions: dict[str, Session] = {}
        self._advertisements: dict[str, Advertisement] = {}
        self._users: dict[str, User] = {}
        self._tokens: dict[str, str] = {}
        self._servers: dict[str, Server] = {}
        self._idempotency: dict[tuple[str, str], IdempotencyRecord] = {}
        self._idempotency_of: dict[str, tuple[str, str]] = {}
        """The idempotency record's key by the first job of its request (deleted with it)."""
        self._web_sessions: dict[str, tuple[str, Instant]] = {}
        self._groups: dict[str, Group] = {}
        self._group_jobs: dict[str, list[str]] = {}
        """Group id -> its jobs' ids (a group's jobs are all made with it)."""
        self._key_jobs: dict[tuple[str, str], list[str]] = {}
        """(owner id, concurrency key) -> the ids of its jobs."""
        self._key_limits: dict[tuple[str, str], int] = {}
        """(owner id, concurrency key) -> the key's limit."""
        self._waiters: dict[str, list[str]] = {}
        """Job or group id -> the ids of the jobs that named it as a dependency."""
        self._schedules: dict[str, Schedule] = {}

    # -- jobs ----------------------------------------------------------------------------
    def get_job(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def job_and_server(self, job_id: str) -> tuple[Job, Server | None] | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return None if job is None else (job, self._servers.get(job.server_id))

    def get_jobs(self, job_ids: Collection[str]) -> dict[str, Job]:
        jobs = self._jobs
        return {job_id: jobs[job_id] for job_id in job_ids if job_id in jobs}

    def insert_job(self, job: Job) -> None:
        self.insert_jobs([job])

    def insert_jobs(
        self,
        jobs: Sequence[Job],
        idempotency: IdempotencyRecord | None = None,
        group: Group | None = None,
    ) -> None:
        with self._lock:
            ids = [job.id for job in jobs]
            if len(set(ids)) != len(ids) or any(job_id in self._jobs for job_id in ids):
                raise AlreadyExists("a job with that id already exists")
            if group is not None and group.id in self._groups:
                raise AlreadyExists("a group with that id already exists")
            if idempotency is not None:
                key = (idempotency.user_id, idempotency.key)
                if key in self._idempotency:
                    raise AlreadyExists("that Idempotency-Key was already used")
                self._idempotency[key] = idempotency
                if idempotency.job_ids:
                    self._idempotency_of[idempotency.job_ids[0]] = key
            if group is not None:
                self._groups[group.id] = group
            for job in jobs:
                self._add(job)

    def _add(self, job: Job) -> None:
        """A new job, with every index that finds it (under the lock)."""
        self._jobs[job.id] = job
        self._index.replace(None, job)
        if job.group_id is not None:
            self._group_jobs.setdefault(job.group_id, []).append(job.id)
        if job.concurrency is not None:
            scope = (job.owner_id, job.concurrency.key)
            self._key_jobs.setdefault(scope, []).append(job.id)
        for on_id in job.waits_on:
            self._waiters.setdefault(on_id, []).append(job.id)

    def replace_job(self, job: Job, expected: Job) -> bool:
        with self._lock:
            stored = self._jobs.get(job.id)
            if stored is None or stored.version != expected.version:
                return False
            self._jobs[job.id] = job
            self._index.replace(stored, job)
            return True

    def update_jobs(
        self, job_ids: Sequence[str], change: Callable[[Job], Job]
    ) -> dict[str, tuple[Job, Job]]:
        with self._lock:
            done: dict[str, tuple[Job, Job]] = {}
            for job_id in job_ids:
                stored = self._jobs.get(job_id)
                if stored is None:
                    continue
                changed = change(stored)
                if changed is not stored:
                    self._jobs[job_id] = changed
                    self._index.replace(stored, changed)
                done[job_id] = (stored, changed)
            return done

    def claimable_jobs(self, endpoint_id: str, now: Instant, limit: int) -> list[Job]:
        with self._lock:
            return [self._jobs[i] for i in self._index.first_waiting(endpoint_id, now, limit)]

    def claim_jobs(
        self,
        endpoint_id: str,
        now: Instant,
        limit: int,
        grant: Callable[[Job], Job],
        after_owner: str | None = None,
    ) -> list[Job]:
        with self._lock:
            index, jobs = self._index, self._jobs

            def turns(rank: int, first: str) -> tuple[NextOwner, Oldest[Job]]:
                def oldest(wants: Mapping[str, int]) -> dict[str, list[Job]]:
                    return {
                        owner_id: [
                            jobs[i]
                            for i in index.first_waiting_of(endpoint_id, rank, owner_id, now, n)
                        ]
                        for owner_id, n in wants.items()
                    }

                return lambda after: index.next_owner(endpoint_id, rank, after), oldest

            chosen = take_by_priority(
                limit, after_owner, lambda after: index.next_rank(endpoint_id, after), turns
            )
            # Grant everything before storing anything, so a failing grant changes nothing.
            pairs = [(job, grant(job)) for job in chosen]
            for job, granted in pairs:
                self._jobs[job.id] = granted
                self._index.replace(job, granted)
            return [granted for _, granted in pairs]

    def next_claimable_at(self, endpoint_id: str) -> Instant | None:
        with self._lock:
            return self._index.next_waiting(endpoint_id)

    def due_jobs(self, now: Instant, limit: int) -> list[Job]:
        with self._lock:
            found: list[Job] = []
            for deadline_at, job_id in self._index.deadlines:
                if deadline_at > now or len(found) >= limit:
                    break
                found.append(self._jobs[job_id])
            return found

    def active_jobs(self, endpoint_id: str) -> list[Job]:
        with self._lock:
            return [self._jobs[job_id] for job_id in self._index.active.get(endpoint_id, ())]

    def active_deadlines(self, endpoint_id: str) -> list[tuple[str, Instant | None]]:
        with self._lock:
            jobs = self._jobs
            return [
                (job_id, jobs[job_id].deadline_at)
                for job_id in self._index.active.get(endpoint_id, ())
            ]

    def job_counts(self) -> dict[JobState, int]:
        with self._lock:
            return {state: n for state, n in self._index.counts.items() if n}

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
        with self._lock:
            among = (
                self._jobs.values()
                if group_id is None
                else [self._jobs[i] for i in self._group_jobs.get(group_id, ())]
            )
            jobs = [
                job
                for job in among
                if (server_ids is None or job.server_id in server_ids)
                and (state is None or job.state is state)
                and (kind is None or job.kind == kind)
                and (id_prefix is None or job.id.startswith(id_prefix))
                and (after is None or (job.created_at, job.id) < after)
            ]
        jobs.sort(key=lambda job: (job.created_at, job.id), reverse=True)
        return jobs[:limit]

    def idempotency_record(self, user_id: str, key: str) -> IdempotencyRecord | None:
        return self._idempotency.get((user_id, key))

    def finished_jobs(self, ended_by: Instant, limit: int) -> list[Job]:
        with self._lock:
            jobs = self._jobs
            return [jobs[i] for i in self._index.first_finished(jobs, ended_by, limit)]

    def delete_jobs(self, job_ids: Sequence[str], deletable: Callable[[Job], bool]) -> list[Job]:
        with self._lock:
            deleted: list[Job] = []
            for job_id in dict.fromkeys(job_ids):
                stored = self._jobs.get(job_id)
                if stored is None or not deletable(stored):
                    continue
                del self._jobs[job_id]
                self._index.delete(stored)
                if stored.group_id is not None:
                    members = self._group_jobs.get(stored.group_id)
                    if members is not None and job_id in members:
                        members.remove(job_id)
                if stored.concurrency is not None:
                    keyed = self._key_jobs.get((stored.owner_id, stored.concurrency.key))
                    if keyed is not None and job_id in keyed:
                        keyed.remove(job_id)
                self._waiters.pop(job_id, None)
                key = self._idempotency_of.pop(job_id, None)
                if key is not None:
                    self._idempotency.pop(key, None)
                deleted.append(stored)
            return deleted

    def release_space(self, pages: int) -> int:
        """Deleted records are gone at once: nothing to give back."""
        return 0

    # -- groups ----------------------------------------------------------------------------
    def get_group(self, group_id: str) -> Group | None:
        return self._groups.get(group_id)

    def groups_of(self, creator_id: str, limit: int) -> list[Group]:
        with self._lock:
            made = [group for group in self._groups.values() if group.creator_id == creator_id]
        made.sort(key=lambda group: (group.created_at, group.id), reverse=True)
        return made[:limit]

    def _jobs_of(self, group_id: str) -> list[Job]:
        return [self._jobs[job_id] for job_id in self._group_jobs.get(group_id, ())]

    def group_counts(self, group_id: str) -> dict[JobState, int]:
        with self._lock:
            return dict(Counter(job.state for job in self._jobs_of(group_id)))

    def release_held(
        self,
        group_id: str,
        how_many: Callable[[int, int], int],
        release: Callable[[Job], Job],
    ) -> dict[str, tuple[Job, Job]]:
        with self._lock:
            jobs = self._jobs_of(group_id)
            held = sorted((job for job in jobs if job.held_group_id), key=release_order)
            live = sum(1 for job in jobs if not job.held and not job.state.is_terminal)
            done: dict[str, tuple[Job, Job]] = {}
            for job in held[: how_many(live, len(held))]:
                changed = release(job)
                if changed is not job:
                    self._jobs[job.id] = changed
                    self._index.replace(job, changed)
                done[job.id] = (job, changed)
            return done

    def held_groups(self, after: str | None, limit: int) -> list[str]:
        with self._lock:
            holding = sorted(
                group_id
                for group_id, ids in self._group_jobs.items()
                if (after is None or group_id > after)
                and any(self._jobs[job_id].held_group_id for job_id in ids)
            )
            return holding[:limit]

    def release_key(
        self,
        owner_id: str,
        key: str,
        limit: int,
        declare: bool,
        how_many: Callable[[int, int, int], int],
        release: Callable[[Job], Job],
    ) -> dict[str, tuple[Job, Job]]:
        with self._lock:
            scope = (owner_id, key)
            if declare or scope not in self._key_limits:
                self._key_limits[scope] = limit
            found = (self._jobs.get(job_id) for job_id in self._key_jobs.get(scope, ()))
            jobs = [job for job in found if job is not None]
            held = sorted((job for job in jobs if job.held_key is not None), key=release_order)
            live = sum(1 for job in jobs if job.live_key is not None)
            done: dict[str, tuple[Job, Job]] = {}
            for job in held[: how_many(self._key_limits[scope], live, len(held))]:
                changed = release(job)
                if changed is not job:
                    self._jobs[job.id] = changed
                    self._index.replace(job, changed)
                done[job.id] = (job, changed)
            return done

    def held_keys(self, after: tuple[str, str] | None, limit: int) -> list[tuple[str, str]]:
        with self._lock:
            holding = sorted(
                (key, owner_id)
                for (owner_id, key), ids in self._key_jobs.items()
                if (after is None or (key, owner_id) > (after[1], after[0]))
                and any(
                    (job := self._jobs.get(job_id)) is not None and job.held_key for job_id in ids
                )
            )
            return [(owner_id, key) for key, owner_id in holding[:limit]]

    # -- dependencies ----------------------------------------------------------------------
    def waiters(self, on_ids: Collection[str]) -> list[str]:
        with self._lock:
            found: dict[str, None] = {}
            for on_id in on_ids:
                found.update(dict.fromkeys(self._waiters.get(on_id, ())))
            return list(found)

    def dependency_held_jobs(self, after: str | None, limit: int) -> list[Job]:
        with self._lock:
            ids = sorted(i for i in self._index.dependency_held if after is None or i > after)
            return [self._jobs[job_id] for job_id in ids[:limit]]

    # -- endpoints and sessions ------------------------------------------------------------
    def insert_endpoint(self, endpoint: Endpoint) -> None:
        with self._lock:
            if endpoint.id in self._endpoints:
                raise AlreadyExists(f"endpoint {endpoint.id} already exists")
            if any(other.name == endpoint.name for other in self._endpoints.values()):
                raise AlreadyExists(f"an endpoint named {endpoint.name!r} already exists")
            self._endpoints[endpoint.id] = endpoint

    def get_endpoint(self, endpoint_id: str) -> Endpoint | None:
        return self._endpoints.get(endpoint_id)

    def endpoint_by_join_token(self, token_hash: str) -> Endpoint | None:
        with self._lock:
            for endpoint in self._endpoints.values():
                if endpoint.join_token_hash == token_hash:
                    return endpoint
            return None

    def replace_endpoint(self, endpoint: Endpoint, expected_version: int) -> bool:
        with self._lock:
            stored = self._endpoints.get(endpoint.id)
            if stored is None or stored.version != expected_version:
                return False
            self._endpoints[endpoint.id] = endpoint
            return True

    def list_endpoints(self) -> list[Endpoint]:
        with self._lock:
            return sorted(self._endpoints.values(), key=lambda e: (e.created_at, e.id))

    def delete_endpoint(self, endpoint_id: str) -> int:
        with self._lock:
            using = sum(1 for s in self._servers.values() if s.endpoint_id == endpoint_id)
            if using == 0 and self._endpoints.pop(endpoint_id, None) is not None:
                self._advertisements.pop(endpoint_id, None)
                for session_id in [
                    sid for sid, s in self._sessions.items() if s.endpoint_id == endpoint_id
                ]:
                    del self._sessions[session_id]
            return using

    def set_advertisement(self, endpoint_id: str, advertisement: Advertisement | None) -> None:
        with self._lock:
            if advertisement is None:
                self._advertisements.pop(endpoint_id, None)
            else:
                self._advertisements[endpoint_id] = advertisement

    def get_advertisement(self, endpoint_id: str) -> Advertisement | None:
        return self._advertisements.get(endpoint_id)

    def insert_session(self, session: Session) -> None:
        with self._lock:
            if session.id in self._sessions:
                raise AlreadyExists(f"session {session.id} already exists")
            self._sessions[session.id] = session

    def get_session(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def session_with_endpoint(self, session_id: str) -> tuple[Session, Endpoint] | None:
        session = self._sessions.get(session_id)
        endpoint = None if session is None else self._endpoints.get(session.endpoint_id)
        return None if session is None or endpoint is None else (session, endpoint)

    def extend_session(self, session_id: str, seen_at: Instant, expires_at: Instant) -> None:
        with self._lock:
            stored = self._sessions.get(session_id)
            if stored is not None and stored.expires_at < expires_at:
                self._sessions[session_id] = replace(
                    stored, last_seen_at=seen_at, expires_at=expires_at
                )

    def extend_sessions(self, extensions: Sequence[tuple[str, Instant, Instant]]) -> None:
        with self._lock:
            for session_id, seen_at, expires_at in extensions:
                stored = self._sessions.get(session_id)
                if stored is not None and stored.expires_at < expires_at:
                    self._sessions[session_id] = replace(
                        stored, last_seen_at=seen_at, expires_at=expires_at
                    )

    def record_beats(self, beats: Mapping[str, Instant]) -> None:
        with self._lock:
            for session_id, seen_at in beats.items():
                stored = self._sessions.get(session_id)
                if stored is not None and stored.last_seen_at < seen_at:
                    self._sessions[session_id] = replace(stored, last_seen_at=seen_at)

    def latest_session(self, endpoint_id: str) -> Session | None:
        with self._lock:
            sessions = [s for s in self._sessions.values() if s.endpoint_id == endpoint_id]
        return max(sessions, key=lambda s: (s.generation, s.last_seen_at), default=None)

    def mark_session_reconciled(self, session_id: str, at: Instant) -> None:
        with self._lock:
            stored = self._sessions.get(session_id)
            if stored is not None:
                self._sessions[session_id] = replace(stored, reconciled_at=at)

    # -- users, tokens and servers ---------------------------------------------------------
    def insert_user(self, user: User) -> None:
        with self._lock:
            if user.id in self._users:
                raise AlreadyExists(f"user {user.id} already exists")
            if any(other.name == user.name for other in self._users.values()):
                raise AlreadyExists(f"a user named {user.name!r} already exists")
            self._users[user.id] = user

    def get_user(self, user_id: str) -> User | None:
        return self._users.get(user_id)

    def user_by_name(self, name: str) -> User | None:
        with self._lock:
            return next((user for user in self._users.values() if user.name == name), None)

    def list_users(self) -> list[User]:
        with self._lock:
            return sorted(self._users.values(), key=lambda u: (u.created_at, u.id))

    def insert_api_token(self, token_hash: str, user_id: str, created_at: Instant) -> None:
        with self._lock:
            if token_hash in self._tokens:
                raise AlreadyExists("that API token already exists")
            self._tokens[token_hash] = user_id

    def user_by_api_token(self, token_hash: str) -> User | None:
        user_id = self._tokens.get(token_hash)
        return None if user_id is None else self._users.get(user_id)

    def replace_api_tokens(self, user_id: str, token_hash: str, created_at: Instant) -> None:
        with self._lock:
            holder = self._tokens.get(token_hash)
            if holder is not None and holder != user_id:
                raise AlreadyExists("that API token already exists")
            for held in [key for key, owner in self._tokens.items() if owner == user_id]:
                del self._tokens[held]
            self._tokens[token_hash] = user_id

    def set_password_hash(self, user_id: str, password_hash: str | None) -> None:
        with self._lock:
            stored = self._users.get(user_id)
            if stored is not None:
                self._users[user_id] = replace(stored, password_hash=password_hash)

    def set_user_disabled(self, user_id: str, disabled: bool) -> None:
        with self._lock:
            stored = self._users.get(user_id)
            if stored is not None:
                self._users[user_id] = replace(stored, disabled=disabled)

    def insert_web_session(
        self, token_hash: str, user_id: str, created_at: Instant, expires_at: Instant
    ) -> None:
        with self._lock:
            if token_hash in self._web_sessions:
                raise AlreadyExists("that console session already exists")
            self._web_sessions[token_hash] = (user_id, expires_at)

    def web_session_user(self, token_hash: str, now: Instant) -> User | None:
        found = self._web_sessions.get(token_hash)
        if found is None or found[1] <= now:
            return None
        return self._users.get(found[0])

    def delete_web_session(self, token_hash: str) -> None:
        with self._lock:
            self._web_sessions.pop(token_hash, None)

    def insert_server(self, server: Server) -> None:
        with self._lock:
            if server.id in self._servers:
                raise AlreadyExists(f"server {server.id} already exists")
            self._servers[server.id] = server

    def get_server(self, server_id: str) -> Server | None:
        return self._servers.get(server_id)

    def replace_server(self, server: Server, expected_version: int) -> bool:
        with self._lock:
            stored = self._servers.get(server.id)
            if stored is None or stored.version != expected_version:
                return False
            self._servers[server.id] = server
            return True

    def list_servers(self) -> list[Server]:
        with self._lock:
            return sorted(self._servers.values(), key=lambda s: (s.created_at, s.id))

    def servers_of_user(self, user_id: str) -> list[Server]:
        return [s for s in self.list_servers() if s.owner_id == user_id or user_id in s.admin_ids]

    def delete_server(self, server_id: str) -> int:
        with self._lock:
            live = sum(
                1
                for job in self._jobs.values()
                if job.server_id == server_id and not job.state.is_terminal
            )
            if live == 0:
                self._servers.pop(server_id, None)
                for schedule in list(self._schedules.values()):
                    if schedule.server_id == server_id:
                        del self._schedules[schedule.id]
            return live

    # -- schedules -------------------------------------------------------------------------
    def insert_schedule(self, schedule: Schedule) -> None:
        with self._lock:
            if schedule.id in self._schedules:
                raise AlreadyExists(f"schedule {schedule.id} already exists")
            self._schedules[schedule.id] = schedule

    def get_schedule(self, schedule_id: str) -> Schedule | None:
        return self._schedules.get(schedule_id)

    def fire_schedules(self, writes: Sequence[ScheduleWrite]) -> list[bool]:
        stored = []
        with self._lock:
            for write in writes:
                schedule, job = write.schedule, write.job
                current = self._schedules.get(schedule.id)
                won = current is not None and current.version == write.expected_version
                stored.append(won)
                if not won:
                    continue
                self._schedules[schedule.id] = schedule
                if job is not None and job.id not in self._jobs:
                    self._add(job)
                group = write.group
                if group is not None and group.id not in self._groups:
                    self._groups[group.id] = group
                    for member in write.group_jobs:
                        self._add(member)
        return stored

    def delete_schedule(self, schedule_id: str) -> bool:
        with self._lock:
            return self._schedules.pop(schedule_id, None) is not None

    def list_schedules(self, server_id: str | None = None) -> list[Schedule]:
        with self._lock:
            found = [s for s in self._schedules.values() if server_id in (None, s.server_id)]
        return sorted(found, key=lambda s: (s.created_at, s.id))

    def selector_schedules(self, owner_id: str) -> list[Schedule]:
        with self._lock:
            found = [s for s in self._schedules.values() if s.owner_id == owner_id and s.fans_out]
        return sorted(found, key=lambda s: (s.created_at, s.id))

    def due_schedules(self, now: Instant, limit: int) -> list[Schedule]:
        with self._lock:
            due = [
                s
                for s in self._schedules.values()
                if not s.paused and s.next_at is not None and s.next_at <= now
            ]
        return sorted(due, key=lambda s: (s.next_at or 0, s.id))[:limit]

    def after_commit(self, action: Callable[[], None]) -> None:
        """Every write here is applied when its method returns."""
        action()

    def close(self) -> None:
        """Nothing to release."""
