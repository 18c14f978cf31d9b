"""The checker: reads a simulation's history and names every promise it breaks.

It trusts nothing the platform says about itself beyond what it committed and answered. From
the store's committed writes (each with the request that caused it) it rebuilds every job's
version chain; from the platform's answers it knows what was granted, promised and
acknowledged; from each Run it knows what was worked on and when. The rules:

- `lease_overlap`: an attempt is granted while an earlier attempt's lease is still live (its
  latest deadline not passed, and it was not ended by its holder's result or a
  reconciliation of its endpoint).
- `belief_exceeds_lease`: a Run comes to believe it may work on an attempt (its renewal time
  plus the lease, less the self-fencing margin, on its own clock) beyond the latest deadline the
  platform had recorded for it by then.
- `work_outside_lease`, `work_overlap`: a Run works on an attempt outside that attempt's live
  lease as the platform recorded it; two handlers work on one job at once.
- `claim_*`: a claim of a job that is not waiting, eligible and free of a cancel intent, or by
  a session that is not its endpoint's current one.
- `lease_renewed_by_stranger`, `expired_lease_renewed`: a deadline moved by a message that does
  not carry the attempt's evidence from its endpoint, or after it had passed.
- `terminal_changed`, `terminal_cause`, `stale_result`, `outcome`: a terminal record is written
  again; a job ends other than by the result of the attempt that held it or by the platform's
  own policy (cancel before claim, exhausted retries, reconcile loss, deadlines), or not as
  that result and the policy say.
- `max_attempts`, `backoff`, `policy_changed`: attempts beyond `max_attempts`; a retry whose
  eligibility lies outside the policy's backoff bounds (jitter included).
- `lost_commit`, `answer_lost`: after a platform restart the reopened store does not hold what
  was committed, or contradicts an answer the platform gave (create, claim, ack, progress,
  result, cancel); a write built on a record other than the last committed one.
- `cancel_lost`, `claim_after_cancel`: a cancel intent disappears; an attempt starts after it
  was recorded (or answered).
- `idempotency`: a create sent again with its Idempotency-Key answers other jobs than the first.
- `liveness`: once faults stop and Runs stay up, a job has not ended within the stated bound.
- `schedule_twice`, `schedule_off_calendar`, `schedule_not_fired`: a (schedule, time) with two
  jobs; a firing for a time its calendar does not have; a time with no job although a
  platform was up from it through the firing's slack (schedules with `overlap: allow`).
- `dependency_order`, `dependency_cancel`: a job waiting on others is claimed or released
  before each of them succeeded; one ends `dependency_failed` while none of them had failed
  or been cancelled.
- `pruned_needed`, `pruned_early`: a job deleted (by retention or a user's delete) that had
  not ended, or that something still needed: a finished job of a group some of whose jobs had
  not ended, or a job (or a job of a group) that a job still held on its dependencies waited
  on; retention deleting a job before its window (`retain_finished_s`) had passed since it
  ended. A deleted job written again is an `illegal_write`; the durability and idempotency
  rules read a deleted job as gone, not lost.
- `internal_error`: the platform failed with a 500 (an `IllegalTransition` or an exception).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from moonrun.scheduling.dependencies import DEPENDENCY_FAILED
from moonrun.scheduling.fingerprint import token_hash
from moonrun.scheduling.jobs import FailureReason, Job, JobState
from moonrun.scheduling.messages import AckAnswer, Evidence, ProgressAnswer, ResultAnswer
from moonrun.scheduling.reconcile import ReconcileEntry
from moonrun.scheduling.time import seconds_to_ms
from moonrun.service.answers import CancelOutcome, ClaimedJob, ReconcileReport, Registration
from tests.sim.history import Cause, Deletion, History, Work, Write

MINUTE_MS = 60_000
ON_TIME_SLACK_MS = 2_000
"""A platform up this long past a calendar time has run several firing passes (every 500 ms)."""

WAITING = (JobState.QUEUED, JobState.RETRYING)


@dataclass(frozen=True)
class Violation:
    rule: str
    at: int | None
    job_id: str | None
    message: str
    started_at: int = 0

    def __str__(self) -> str:
        when = "" if self.at is None else f" at +{self.at - self.started_at} ms"
        job = "" if self.job_id is None else f" {self.job_id}"
        return f"[{self.rule}]{when}{job}: {self.message}"


def check(history: History) -> list[Violation]:
    """Every violation of a promised property in the history (empty: all hold)."""
    return Checker(history).run()


def describe(job: Job | None) -> str:
    if job is None:
        return "no record"
    return f"v{job.version} {job.state} attempt {job.attempt}"


class Checker:
    def __init__(self, history: History) -> None:
        self.h = history
        self.violations: list[Violation] = []
        self._seen: set[tuple[str, str | None, str]] = set()
        self.writes: dict[str, list[Write]] = defaultdict(list)
        for write in history.writes:
            self.writes[write.after.id].append(write)
        self.sessions = dict(history.sessions)
        # When each endpoint's generations became current: (call number, generation).
        self.registrations: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for answer in history.answers:
            if isinstance(answer.value, Registration):
                session = answer.value.session
                self.registrations[session.endpoint_id].append(
                    (answer.cause.call, session.generation)
                )
        # The live intervals of each (job, attempt), from the committed version chains.
        self.live: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
        self.ends: dict[tuple[str, int], tuple[int, bool]] = {}
        """(job, attempt) -> when it stopped being active, and whether legitimately."""
        self.deadlines: dict[tuple[str, int], int] = defaultdict(int)

    def flag(self, rule: str, at: int | None, job_id: str | None, message: str) -> None:
        """Report a violation (once per rule and job: the first tells the story)."""
        key = (rule, job_id, message if job_id is None else "")
        if key in self._seen:
            return
        self._seen.add(key)
        self.violations.append(Violation(rule, at, job_id, message, self.h.started_at))

    def run(self) -> list[Violation]:
        for job_id, writes in self.writes.items():
            self._chain(job_id, writes)
        self._promises()
        self._grants()
        self._beliefs()
        self._work()
        self._durability()
        self._cancels()
        self._idempotency()
        self._liveness()
        self._schedules()
        self._groups()
        self._keys()
        self._priorities()
        self._dependencies()
        self._pruning()
        for at, cause, error in self.h.internal_errors:
            self.flag("internal_error", at, None, f"{cause.kind} from {cause.sender}: {error}")
        return self.violations

    # -- sessions --------------------------------------------------------------------------------

    def _session(self, cause: Cause | None) -> tuple[str, int] | None:
        if cause is None or cause.session_id is None:
            return None
        return self.sessions.get(cause.session_id)

    def _current_generation(self, endpoint_id: str, call: int) -> int:
        """The endpoint's current generation when call number `call` was handled."""
        generations = [g for c, g in self.registrations.get(endpoint_id, []) if c < call]
        return max(generations, default=0)

    # -- the version chain of each job --------------------------------------------------------

    def _chain(self, job_id: str, writes: list[Write]) -> None:
        previous: Job | None = None
        first = writes[0].after
        opened: tuple[int, int] | None = None  # (since, deadline) of the live version
        for write in writes:
            before, after, at = write.before, write.after, write.at
            if previous is not None and previous.state.is_terminal:
                self.flag(
                    "terminal_changed",
                    at,
                    job_id,
                    f"{describe(previous)} was written again as {describe(after)} "
                    f"({write.cause.kind if write.cause else 'no call'})",
                )
            if previous is not None and before is not None and before != previous:
                self.flag(
                    "lost_commit",
                    at,
                    job_id,
                    f"a write started from {describe(before)} although {describe(previous)} had "
                    "been committed: a committed write was lost (or answered but not made)",
                )
            if before is not None and after.version <= before.version:
                self.flag(
                    "illegal_write", at, job_id, f"version {before.version} -> {after.version}"
                )
            if after.attempt > after.policy.max_attempts:
                self.flag(
                    "max_attempts",
                    at,
                    job_id,
                    f"attempt {after.attempt} of at most {after.policy.max_attempts}",
                )
            if after.policy != first.policy:
                self.flag("policy_changed", at, job_id, f"{first.policy} became {after.policy}")
            intent = previous.cancel if previous is not None else None
            if intent is not None and (
                after.cancel is None or after.cancel.requested_at != intent.requested_at
            ):
                self.flag(
                    "cancel_lost", at, job_id, f"the cancel intent of {describe(previous)} is gone"
                )
            # Judged against what had been committed (what the platform promised), which is
            # what the store handed the service unless a commit was lost (flagged above).
            self._transition(write, previous if previous is not None else before)
            if opened is not None and previous is not None:
                self._add_live((job_id, previous.attempt), opened[0], min(at, opened[1]))
            opened = None
            if after.state.is_active and after.deadline_at is not None:
                key = (job_id, after.attempt)
                self.deadlines[key] = max(self.deadlines[key], after.deadline_at)
                opened = (at, after.deadline_at)
            previous = after
        if opened is not None and previous is not None:
            self._add_live((job_id, previous.attempt), opened[0], opened[1])

    def _add_live(self, key: tuple[str, int], start: int, end: int) -> None:
        """Attempt `key` held a live lease from `start` to `end` (merged with what precedes)."""
        if end <= start:
            return
        intervals = self.live[key]
        if intervals and intervals[-1][1] >= start:
            intervals[-1] = (intervals[-1][0], max(intervals[-1][1], end))
        else:
            intervals.append((start, end))

    def _transition(self, write: Write, b: Job | None) -> None:
        """Is this write (from `b`) something the protocol allows, for the reason it was made?"""
        a, at, cause = write.after, write.at, write.cause
        job_id = a.id
        if b is None:
            made_by = ("create_job", "create_jobs", "fire_due", "groups.fanout")
            if cause is None or cause.kind not in made_by:
                self.flag("illegal_write", at, job_id, "a job was inserted outside a create")
            return
        if b.state.is_terminal:
            return  # terminal_changed already
        if a.attempt == b.attempt + 1:
            self._claim(write, b)
            return
        if a.attempt != b.attempt:
            self.flag("illegal_write", at, job_id, f"{describe(b)} -> {describe(a)}")
            return
        if b.state.is_active and not a.state.is_active:
            self._attempt_end(write, b)
        elif b.state.is_active:
            self._active_change(write, b)
        elif b.held and not a.held and a.state is b.state is JobState.QUEUED:
            pass  # its group released it, after a write that ended one of its jobs
        elif b.key_held and not a.key_held and a.state is b.state is JobState.QUEUED:
            pass  # its key released it, after a write that made or ended one of its jobs
        elif a.state is JobState.CANCELLED and a.cancel is not None and a.group_id is not None:
            # Its group stopped (after a failure, by whatever call ended that job).
            if a.cancel.requested_by != a.group_id and (
                cause is None or cause.kind not in ("cancel_job", "fire_due")
            ):
                self.flag(
                    "terminal_cause",
                    at,
                    job_id,
                    f"waiting job cancelled by {cause.kind if cause else 'no call'}, "
                    "not by a user or its group",
                )
        elif _dependency_failed(a):
            pass  # one of the jobs it waited on did not succeed (`_dependencies` checks which)
        elif a.state is JobState.CANCELLED:
            # A user's cancel, or a schedule's `cancel_previous` before its next firing.
            if cause is None or cause.kind not in ("cancel_job", "fire_due") or a.cancel is None:
                self.flag(
                    "terminal_cause",
                    at,
                    job_id,
                    f"waiting job cancelled by {cause.kind if cause else 'no call'}, not by a user",
                )
        else:
            self.flag("illegal_write", at, job_id, f"{describe(b)} -> {describe(a)}")

    def _claim(self, write: Write, b: Job) -> None:
        a, at, cause = write.after, write.at, write.cause
        job_id = a.id
        what = f"attempt {a.attempt} claimed"
        if b.state.is_active:
            self.flag(
                "claim_ignored_lease",
                at,
                job_id,
                f"{what} while attempt {b.attempt} was {b.state} (deadline "
                f"+{(b.deadline_at or 0) - at} ms from then)",
            )
        elif b.state not in WAITING:
            self.flag("illegal_write", at, job_id, f"{what} from {b.state}")
        if b.cancel is not None:
            self.flag("claim_after_cancel", at, job_id, f"{what} after its cancel intent")
        if b.state in WAITING and b.eligible_at > at:
            self.flag(
                "claim_before_eligible",
                at,
                job_id,
                f"{what} {b.eligible_at - at} ms before it was eligible",
            )
        session = self._session(cause)
        if cause is None or cause.kind != "claim" or session is None:
            self.flag("illegal_write", at, job_id, f"{what} outside a claim")
            return
        endpoint_id, generation = session
        if endpoint_id != b.endpoint_id:
            self.flag("claim_by_stranger", at, job_id, f"{what} by another endpoint's session")
        elif generation != self._current_generation(endpoint_id, cause.call):
            self.flag("claim_by_stranger", at, job_id, f"{what} by rotated generation {generation}")
        if a.state is not JobState.ACCEPTED or a.session_generation != generation:
            self.flag("illegal_write", at, job_id, f"{what} as {describe(a)}")
        if a.ack_deadline != at + self.h.settings.ack_timeout_ms:
            self.flag("illegal_write", at, job_id, f"{what} with a wrong ack deadline")

    def _holder_evidence(self, cause: Cause | None, b: Job) -> Any:
        """The entry of `cause` about `b`'s job when it carries `b`'s attempt evidence and comes
        from a session of `b`'s endpoint (None otherwise)."""
        session = self._session(cause)
        if cause is None or session is None or session[0] != b.endpoint_id:
            return None
        entry = cause.entries.get(b.id)
        evidence = entry[0] if isinstance(entry, tuple) else entry
        if not isinstance(evidence, Evidence | ReconcileEntry):
            return None
        if evidence.attempt != b.attempt or token_hash(evidence.lease) != b.lease_hash:
            return None
        return entry

    def _attempt_end(self, write: Write, b: Job) -> None:
        a, at, cause = write.after, write.at, write.cause
        job_id, kind = a.id, cause.kind if cause else "no call"
        deadline = b.deadline_at
        reported: dict[str, Any] | None = None
        legit = True
        if deadline is not None and deadline <= at:
            how = "deadline"
            reason = (
                FailureReason.ACK_TIMEOUT
                if b.state is JobState.ACCEPTED
                else FailureReason.LEASE_EXPIRED
            )
            if a.last_failure is None or a.last_failure.reason is not reason:
                self.flag("outcome", at, job_id, f"deadline applied as {a.last_failure}")
        elif cause is not None and cause.kind == "result_many" and job_id in cause.entries:
            how = "result"
            entry = self._holder_evidence(cause, b)
            session = self._session(cause)
            if (
                entry is None
                or session is None
                or session[1] != b.session_generation
                or b.state is not JobState.RUNNING
            ):
                legit = False
                evidence = cause.entries[job_id][0]
                self.flag(
                    "stale_result",
                    at,
                    job_id,
                    f"attempt {b.attempt} ({b.state}) ended by a result sent for attempt "
                    f"{evidence.attempt} by {cause.sender}, not by the attempt that held it",
                )
            else:
                reported = entry[1]
        elif cause is not None and cause.kind == "reconcile":
            how = "reconcile"
            session = self._session(cause)
            if session is None or session[0] != b.endpoint_id:
                legit = False
                self.flag("terminal_cause", at, job_id, "lost by another endpoint's reconciliation")
            elif self._holder_evidence(cause, b) is not None:
                legit = False
                self.flag(
                    "terminal_cause", at, job_id, "lost although its reconciliation confirmed it"
                )
        else:
            legit, how = False, kind
            self.flag(
                "terminal_cause",
                at,
                job_id,
                f"attempt {b.attempt} ended by {kind} before its deadline, neither by its "
                "holder's result nor by a reconciliation",
            )
        self.ends[(job_id, b.attempt)] = (at, legit)
        if not legit:
            return
        # A user's cancel may arrive with the passed deadline it applies (one write).
        cancelled = b.cancel is not None or (
            a.cancel is not None and cause is not None and cause.kind == "cancel_job"
        )
        expected = self._expected_end(b, how, reported, cancelled)
        if expected is not None and a.state is not expected:
            self.flag(
                "outcome",
                at,
                job_id,
                f"attempt {b.attempt} ended by {how}"
                f"{'' if reported is None else ' ' + str(reported.get('outcome'))} as {a.state}, "
                f"expected {expected}",
            )
        if a.state.is_terminal and (a.terminal is None or a.terminal.attempt != b.attempt):
            self.flag(
                "terminal_cause",
                at,
                job_id,
                f"terminal record {a.terminal} for attempt {b.attempt}",
            )
        if a.state is JobState.RETRYING:
            self._backoff(b, a, at)

    def _expected_end(
        self, b: Job, how: str, reported: dict[str, Any] | None, cancelled: bool
    ) -> JobState | None:
        more = b.attempt < b.policy.max_attempts
        if how in ("deadline", "reconcile"):
            if cancelled:
                return JobState.CANCELLED
            return JobState.RETRYING if more else JobState.FAILED
        assert reported is not None
        outcome = reported.get("outcome")
        if outcome == "succeeded":
            return JobState.SUCCEEDED
        if outcome == "cancelled":
            if b.cancel is None:
                self.flag("outcome", None, b.id, "a cancelled result accepted without an intent")
            return JobState.CANCELLED
        if b.cancel is not None:
            return JobState.CANCELLED
        return JobState.RETRYING if reported.get("retryable") and more else JobState.FAILED

    def _backoff(self, b: Job, a: Job, at: int) -> None:
        policy = b.policy
        delay = a.eligible_at - at
        high = policy.backoff_ms(b.attempt, 0.0)
        low = seconds_to_ms(policy.backoff_s(b.attempt) * (1.0 - policy.jitter))
        if not low - 1 <= delay <= high + 1:
            self.flag(
                "backoff",
                at,
                a.id,
                f"after attempt {b.attempt} eligible in {delay} ms, outside [{low}, {high}] ms",
            )

    def _active_change(self, write: Write, b: Job) -> None:
        a, at, cause = write.after, write.at, write.cause
        job_id = a.id
        if a.lease_hash != b.lease_hash:
            self.flag("illegal_write", at, job_id, "the lease changed within an attempt")
        if b.deadline_at is not None and b.deadline_at <= at:
            self.flag(
                "expired_lease_renewed",
                at,
                job_id,
                f"attempt {b.attempt}'s deadline passed {at - b.deadline_at} ms before, yet it "
                f"stayed {a.state} ({cause.kind if cause else 'no call'})",
            )
        renewed = (a.deadline_at or 0) > (b.deadline_at or 0) or (
            a.state is not b.state and a.state is JobState.RUNNING
        )
        if renewed and (
            cause is None
            or cause.kind not in ("ack_many", "progress", "reconcile")
            or self._holder_evidence(cause, b) is None
        ):
            self.flag(
                "lease_renewed_by_stranger",
                at,
                job_id,
                f"attempt {b.attempt}'s lease renewed by {cause.kind if cause else 'no call'} "
                f"from {cause.sender if cause else '?'} without its evidence",
            )

    # -- leases and work ---------------------------------------------------------------------

    def _promises(self) -> None:
        """Deadlines the platform promised in its answers (a claim's ack deadline, an ack's or a
        progress's lease expiry, a reconciliation's confirmed deadline)."""
        for answer in self.h.answers:
            value, cause, job_id = answer.value, answer.cause, answer.job_id
            if isinstance(value, ClaimedJob):
                key = (value.job_id, value.attempt)
                self.deadlines[key] = max(self.deadlines[key], value.ack_deadline)
            elif isinstance(value, AckAnswer | ProgressAnswer) and job_id is not None:
                entry = cause.entries.get(job_id)
                evidence = entry[0] if isinstance(entry, tuple) else entry
                if isinstance(evidence, Evidence):
                    key = (job_id, evidence.attempt)
                    self.deadlines[key] = max(self.deadlines[key], value.lease_expires_at)
            elif isinstance(value, ReconcileReport):
                for confirmed in value.confirmed:
                    key = (confirmed.job_id, confirmed.attempt)
                    self.deadlines[key] = max(self.deadlines[key], confirmed.deadline)

    def _grants(self) -> None:
        """No attempt is granted while an earlier one's lease is live."""
        granted: dict[str, list[int]] = defaultdict(list)
        for answer in self.h.answers:
            if not isinstance(answer.value, ClaimedJob):
                continue
            grant = answer.value
            job_id, at = grant.job_id, answer.at
            for earlier in granted[job_id]:
                live_until = self.deadlines.get((job_id, earlier), 0)
                ended = self.ends.get((job_id, earlier))
                if ended is not None and ended[1]:
                    live_until = min(live_until, ended[0])
                if at < live_until:
                    self.flag(
                        "lease_overlap",
                        at,
                        job_id,
                        f"attempt {grant.attempt} granted while attempt {earlier}'s lease was live "
                        f"for {live_until - at} ms more",
                    )
            granted[job_id].append(grant.attempt)

    def _beliefs(self) -> None:
        """What a Run believes it holds never outlasts what the platform had recorded: each
        belief (renewed_until less the margin, on the Run's clock) ends by the latest deadline
        the platform had committed or answered for that attempt when the Run formed it."""
        recorded: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
        for write in self.h.writes:
            after = write.after
            if after.state.is_active and after.deadline_at is not None:
                recorded[(after.id, after.attempt)].append((write.at, after.deadline_at))
        peaks: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
        for key, events in recorded.items():
            times, highs, high = [], [], 0
            for at, deadline in events:
                high = max(high, deadline)
                times.append(at)
                highs.append(high)
            peaks[key] = (times, highs)
        for belief in self.h.beliefs:
            times, highs = peaks.get((belief.job_id, belief.attempt), ([], []))
            index = bisect.bisect_right(times, belief.at) - 1
            deadline = highs[index] if index >= 0 else 0
            if belief.until > deadline:
                start = self.h.started_at
                self.flag(
                    "belief_exceeds_lease",
                    belief.at,
                    belief.job_id,
                    f"Run {belief.run} ({belief.boot}) came to believe it may work on attempt "
                    f"{belief.attempt} until +{belief.until - start} ms, but the platform's lease "
                    f"ran only until +{deadline - start} ms",
                )

    def _work(self) -> None:
        """Every Run works on an attempt only inside its live lease; one job, one handler."""
        end_of_run = self.h.ended_at or 0
        by_job: dict[str, list[Work]] = defaultdict(list)
        for work in self.h.work:
            by_job[work.job_id].append(work)
            end = work.end if work.end is not None else end_of_run
            if end <= work.start:
                continue
            intervals = self.live.get((work.job_id, work.attempt), [])
            if not _covered(intervals, work.start, end):
                self.flag(
                    "work_outside_lease",
                    work.start,
                    work.job_id,
                    f"Run {work.run} ({work.boot}) worked on attempt {work.attempt} from "
                    f"+{work.start - self.h.started_at} to +{end - self.h.started_at} ms "
                    f"({work.why}), outside its live lease {self._intervals(intervals)}",
                )
        for job_id, works in by_job.items():
            works.sort(key=lambda w: w.start)
            busy_until, holder = 0, None
            for work in works:
                end = work.end if work.end is not None else end_of_run
                if work.start < busy_until and holder is not None:
                    self.flag(
                        "work_overlap",
                        work.start,
                        job_id,
                        f"attempt {work.attempt} on Run {work.run} started while attempt "
                        f"{holder.attempt} on Run {holder.run} still worked",
                    )
                if end > busy_until:
                    busy_until, holder = end, work

    def _intervals(self, intervals: Iterable[tuple[int, int]]) -> str:
        start = self.h.started_at
        return "[" + ", ".join(f"+{a - start}..+{b - start}" for a, b in intervals) + "]"

    # -- durability ------------------------------------------------------------------------------

    def _durability(self) -> None:
        """After each platform restart the reopened store holds what was committed before, and
        every answer given before it still holds."""
        for snapshot in self.h.snapshots:
            committed: dict[str, Job | None] = {}
            for write in self.h.writes[: snapshot.writes]:
                committed[write.after.id] = write.after
            deleted = {d.job.id for d in self.h.deletions[: snapshot.deletions]}
            for job_id in deleted:
                committed[job_id] = None  # gone, and it must stay gone
            when = (
                "the final restart"
                if snapshot.final
                else f"restart of instance {snapshot.instance}"
            )
            for job_id, stored in snapshot.jobs.items():
                expected = committed.get(job_id)
                if (expected is not None or job_id in deleted) and stored != expected:
                    self.flag(
                        "lost_commit",
                        snapshot.at,
                        job_id,
                        f"after {when} the store holds {describe(stored)}, but "
                        f"{describe(expected)} had been committed",
                    )
            for answer in self.h.answers[: snapshot.answers]:
                if answer.job_id is None or answer.job_id in deleted:
                    continue
                problem = _contradiction(answer, snapshot.jobs.get(answer.job_id))
                if problem is not None:
                    self.flag(
                        "answer_lost",
                        snapshot.at,
                        answer.job_id,
                        f"after {when}: {problem} (answered to {answer.cause.kind} from "
                        f"{answer.cause.sender} at +{answer.at - self.h.started_at} ms)",
                    )

    # -- cancellation ----------------------------------------------------------------------------

    def _cancels(self) -> None:
        """No attempt is granted after the platform answered a cancel of the job."""
        cancelled_at: dict[str, int] = {}
        for answer in self.h.answers:
            value = answer.value
            if isinstance(value, CancelOutcome) and value.job.cancel is not None:
                cancelled_at.setdefault(value.job.id, answer.at)
            elif isinstance(value, ClaimedJob):
                since = cancelled_at.get(value.job_id)
                if since is not None and answer.at > since:
                    self.flag(
                        "claim_after_cancel",
                        answer.at,
                        value.job_id,
                        f"attempt {value.attempt} granted {answer.at - since} ms after the "
                        "platform answered its cancel",
                    )

    # -- idempotency -----------------------------------------------------------------------------

    def _idempotency(self) -> None:
        """A create sent again with its Idempotency-Key answers the job(s) of the first."""
        answered: dict[int, list[str]] = defaultdict(list)
        causes: dict[int, Cause] = {}
        for answer in self.h.answers:
            key = answer.cause.entries.get("idempotency_key")
            if key is not None and isinstance(answer.value, Job):
                answered[answer.cause.call].append(answer.value.id)
                causes[answer.cause.call] = answer.cause
        # When each deleted job went, as a count of the answers given before.
        gone_at = {d.job.id: d.answers for d in self.h.deletions}
        at = {answer.cause.call: index for index, answer in enumerate(self.h.answers)}
        first: dict[str, tuple[list[str], int]] = {}
        for call, job_ids in answered.items():
            key = causes[call].entries["idempotency_key"]
            if key not in first:
                first[key] = (job_ids, call)
                continue
            made, _ = first[key]
            gone = {i for i in made if gone_at.get(i, len(self.h.answers) + 1) <= at[call]}
            # A replay answers the jobs that remain, in order; a key goes with the first job
            # its request made (docs/protocol.md, "Jobs": what a key promises once its job is
            # gone), after which the same request makes new jobs (a fan-out's key stays).
            remaining = [i for i in made if i not in gone]
            if made[0] in gone and not set(made) & set(job_ids):
                first[key] = (job_ids, call)
            elif remaining != job_ids:
                self.flag(
                    "idempotency",
                    None,
                    job_ids[0],
                    f"key {key} answered {job_ids}, its first request {made}"
                    + (f" ({sorted(gone)} deleted since)" if gone else ""),
                )

    # -- liveness --------------------------------------------------------------------------------

    def _liveness(self) -> None:
        h = self.h
        if h.calm_at is None or h.liveness_bound_ms is None:
            return
        if h.hit_step_cap:
            self.flag("liveness", h.ended_at, None, "the simulation hit its step cap (a livelock?)")
        for job_id, writes in self.writes.items():
            last = writes[-1].after
            start = max(h.calm_at, writes[0].at)
            if not last.state.is_terminal and job_id in h.gone:
                continue  # deleted before it ended: `pruned_needed`
            if not last.state.is_terminal:
                self.flag(
                    "liveness",
                    h.ended_at,
                    job_id,
                    f"still {last.state} (attempt {last.attempt}) "
                    f"{(h.ended_at or 0) - start} ms after faults stopped "
                    f"(bound {h.liveness_bound_ms} ms)",
                )
                continue
            ended = next(w.at for w in writes if w.after.state.is_terminal)
            if ended - start > h.liveness_bound_ms:
                self.flag(
                    "liveness",
                    ended,
                    job_id,
                    f"ended {ended - start} ms after faults stopped, over the bound of "
                    f"{h.liveness_bound_ms} ms",
                )

    def _schedules(self) -> None:
        """At most one job per (schedule, time), only at the calendar's times (every minute),
        and, for `overlap: allow`, one for every minute while an instance was up through the
        firing's on-time slack."""
        h = self.h
        # A selector schedule's firing makes a job per server, all of one group: the key is
        # (schedule, time, server), and one (schedule, time) has one group.
        made: dict[tuple[str, int, str], str] = {}
        fired: set[tuple[str, int]] = set()
        groups: dict[tuple[str, int], str | None] = {}
        for job_id, writes in self.writes.items():
            job = writes[0].after
            if job.schedule_id is None or job.scheduled_for is None:
                continue
            key = (job.schedule_id, job.scheduled_for, job.server_id)
            if key in made:
                self.flag("schedule_twice", writes[0].at, job_id, f"{key} also made {made[key]}")
            made[key] = job_id
            time_key = key[:2]
            fired.add(time_key)
            if groups.setdefault(time_key, job.group_id) != job.group_id:
                self.flag(
                    "schedule_twice",
                    writes[0].at,
                    job_id,
                    f"{time_key} made groups {groups[time_key]} and {job.group_id}",
                )
            if job.scheduled_for % MINUTE_MS:
                self.flag("schedule_off_calendar", writes[0].at, job_id, f"{key} is no minute")
        end = h.ended_at or h.started_at
        first = (h.started_at // MINUTE_MS + 1) * MINUTE_MS
        for schedule_id, overlap in h.schedules.items():
            if overlap != "allow":
                continue
            for t in range(first, end - ON_TIME_SLACK_MS + 1, MINUTE_MS):
                up = any(
                    since <= t and (until is None or t + ON_TIME_SLACK_MS <= until)
                    for spans in h.up.values()
                    for since, until in spans
                )
                if up and (schedule_id, t) not in fired:
                    self.flag(
                        "schedule_not_fired",
                        t,
                        None,
                        f"{schedule_id} made no job for {t - h.started_at} ms although a "
                        "platform was up",
                    )

    def _keys(self) -> None:
        """Never more than a key's limit of an owner's jobs with the key claimed or running at
        once (in the order the store committed their writes)."""
        active: dict[tuple[str, str], set[str]] = defaultdict(set)
        for write in self.h.writes:
            job = write.after
            if job.concurrency is None:
                continue
            under_way = active[job.owner_id, job.concurrency.key]
            if job.state.is_active:
                under_way.add(job.id)
            else:
                under_way.discard(job.id)
            if len(under_way) > job.concurrency.limit:
                self.flag(
                    "key_limit",
                    write.at,
                    job.id,
                    f"{len(under_way)} jobs of key {job.concurrency.key!r} claimed or running "
                    f"at once, over its limit of {job.concurrency.limit}",
                )

    def _priorities(self) -> None:
        """No claim grants a job while a job of a higher priority of the same endpoint was
        claimable (waiting and eligible, held by no group, key or dependency, not asked to
        cancel), in the order the store committed their writes."""
        claimable: dict[str, dict[str, Job]] = defaultdict(dict)
        for write in self.h.writes:
            job, before = write.after, write.before
            waiting = claimable[job.endpoint_id]
            if before is not None and before.claimable_at is not None and job.state.is_active:
                passed = sorted(
                    other.id
                    for other in waiting.values()
                    if other.id != job.id
                    and other.priority > job.priority
                    and other.claimable_at is not None
                    and other.claimable_at <= write.at
                )
                if passed:
                    self.flag(
                        "priority_order",
                        write.at,
                        job.id,
                        f"granted at priority {job.priority} while {passed[0]} of priority "
                        f"{waiting[passed[0]].priority} was claimable on its endpoint",
                    )
            if job.claimable_at is not None:
                waiting[job.id] = job
            else:
                waiting.pop(job.id, None)

    def _groups(self) -> None:
        """Never more than a group's `max_parallel` of its jobs claimed or running at once (in
        the order the store committed their writes), and each group's counts and `done` at the
        end are its jobs' states."""
        h = self.h
        active: dict[str, set[str]] = defaultdict(set)
        for write in h.writes:
            job = write.after
            if job.group_id is None or job.group_id not in h.groups:
                continue
            limit = h.groups[job.group_id][0]
            under_way = active[job.group_id]
            if job.state.is_active:
                under_way.add(job.id)
            else:
                under_way.discard(job.id)
            if limit is not None and len(under_way) > limit:
                self.flag(
                    "group_parallel",
                    write.at,
                    job.id,
                    f"{len(under_way)} jobs of group {job.group_id} claimed or running at once, "
                    f"over its max_parallel of {limit}",
                )
        states: dict[str, Counter[str]] = defaultdict(Counter)
        deleted = {d.job.id for d in h.deletions}
        for job in h.latest.values():
            if job.group_id is not None and job.id not in deleted:
                states[job.group_id][job.state.value] += 1
        for group_id, (_, counts, done) in h.groups.items():
            expected = dict(states[group_id])
            ended = all(JobState(state).is_terminal for state in expected)
            if counts != expected or done != ended:
                self.flag(
                    "group_counts",
                    h.ended_at,
                    None,
                    f"group {group_id} counts {counts} (done {done}), its jobs {expected}",
                )

    def _dependencies(self) -> None:
        """No job starts (nor is released) before every job it waits on succeeded, and none
        ends `dependency_failed` unless one of them had ended failed or cancelled, in the order
        the store committed their writes."""
        state: dict[str, JobState] = {}
        for write in self.h.writes:
            a, b = write.after, write.before
            if a.after and b is not None:
                started = a.attempt > b.attempt
                released = b.held and not a.held
                if started or released:
                    pending = [i for i in a.after if state.get(i) is not JobState.SUCCEEDED]
                    if pending:
                        self.flag(
                            "dependency_order",
                            write.at,
                            a.id,
                            f"{'claimed' if started else 'released'} while {pending[0]} is "
                            f"{state.get(pending[0], 'not stored')}",
                        )
                if _dependency_failed(a) and not b.state.is_terminal:
                    failed = [i for i in a.after if state.get(i) in DID_NOT_SUCCEED]
                    if not failed:
                        self.flag(
                            "dependency_cancel",
                            write.at,
                            a.id,
                            "cancelled dependency_failed while every job it waits on is "
                            "succeeded or not ended",
                        )
            state[a.id] = a.state

    def _pruning(self) -> None:
        """Nothing deleted (by retention's prune or a user's delete) had not ended, nor was
        still needed, as the committed writes before the delete say: no job of its group still
        unfinished, no job still held on its dependencies naming it (or its group); retention
        deletes only once its window passed since the job ended; a deleted job stays gone."""
        h = self.h
        if not h.deletions:
            return
        latest: dict[str, Job] = {}
        members: dict[str, set[str]] = defaultdict(set)
        ended_at: dict[str, int] = {}
        deleted: dict[str, int] = {}
        deletions = iter(h.deletions)
        pending = next(deletions, None)
        for index in range(len(h.writes) + 1):
            while pending is not None and pending.writes == index:
                self._judge_deletion(pending, latest, members, ended_at)
                job_id = pending.job.id
                deleted[job_id] = pending.at
                latest.pop(job_id, None)
                if pending.job.group_id is not None:
                    members[pending.job.group_id].discard(job_id)
                pending = next(deletions, None)
            if index == len(h.writes):
                break
            write = h.writes[index]
            job = write.after
            if job.id in deleted:
                self.flag(
                    "illegal_write",
                    write.at,
                    job.id,
                    f"written as {describe(job)} after it was deleted "
                    f"({write.cause.kind if write.cause else 'no call'})",
                )
            latest[job.id] = job
            if job.group_id is not None:
                members[job.group_id].add(job.id)
            if job.state.is_terminal:
                ended_at.setdefault(job.id, write.at)

    def _judge_deletion(
        self,
        deletion: Deletion,
        latest: dict[str, Job],
        members: dict[str, set[str]],
        ended_at: dict[str, int],
    ) -> None:
        job, at = deletion.job, deletion.at
        how = deletion.cause.kind if deletion.cause is not None else "no call"
        committed = latest.get(job.id)
        if committed is None:
            self.flag("illegal_write", at, job.id, f"deleted by {how}, never made or gone")
            return
        if not committed.state.is_terminal:
            self.flag("pruned_needed", at, job.id, f"deleted by {how} while {describe(committed)}")
            return
        group = committed.group_id
        if group is not None:
            unfinished = sorted(
                i for i in members[group] if i in latest and not latest[i].state.is_terminal
            )
            if unfinished:
                self.flag(
                    "pruned_needed",
                    at,
                    job.id,
                    f"deleted by {how} while {unfinished[0]} of its group {group} is "
                    f"{latest[unfinished[0]].state}",
                )
        waiting = sorted(
            other.id
            for other in latest.values()
            if other.held
            and other.state is JobState.QUEUED
            and (job.id in other.after or (group is not None and other.after_group == group))
        )
        if waiting:
            self.flag(
                "pruned_needed",
                at,
                job.id,
                f"deleted by {how} while {waiting[0]}, held on its dependencies, waits on it",
            )
        retain = self.h.settings.retain_finished_ms
        end = ended_at.get(job.id, at)
        if how == "prune" and at - end < retain:
            self.flag(
                "pruned_early",
                at,
                job.id,
                f"pruned {at - end} ms after it ended, within its retention of {retain} ms",
            )


DID_NOT_SUCCEED = (JobState.FAILED, JobState.CANCELLED)


def _dependency_failed(job: Job) -> bool:
    """The job ended cancelled because one of the jobs it waited on did not succeed."""
    error = None if job.terminal is None else job.terminal.error
    return job.state is JobState.CANCELLED and error is not None and error.code == DEPENDENCY_FAILED


def _covered(intervals: list[tuple[int, int]], start: int, end: int) -> bool:
    return any(low <= start and end <= high for low, high in intervals)


def _contradiction(answer: Any, stored: Job | None) -> str | None:
    """Why the stored record contradicts an answer the platform gave (None: it does not)."""
    value, cause, job_id = answer.value, answer.cause, answer.job_id
    if isinstance(value, Job) and cause.kind in ("create_job", "create_jobs"):
        return "a created job is missing" if stored is None else None
    if stored is None:
        return None
    if isinstance(value, ClaimedJob):
        if stored.attempt < value.attempt or (
            stored.attempt == value.attempt and stored.lease_hash != token_hash(value.lease)
        ):
            return f"attempt {value.attempt} was granted, the store holds {describe(stored)}"
        return None
    if isinstance(value, CancelOutcome):
        if value.job.cancel is not None and stored.cancel is None:
            return "a cancel intent the platform answered is missing"
        return None
    entry = cause.entries.get(job_id)
    evidence = entry[0] if isinstance(entry, tuple) else entry
    if not isinstance(evidence, Evidence):
        return None
    attempt = evidence.attempt
    if stored.attempt > attempt:
        return None
    if isinstance(value, AckAnswer) and stored.state is JobState.ACCEPTED:
        return f"attempt {attempt}'s ack was accepted, the store holds {describe(stored)}"
    if isinstance(value, ProgressAnswer) and isinstance(entry, tuple):
        seq = entry[1]
        if stored.progress is None or stored.progress.seq < seq:
            return (
                f"progress {seq} of attempt {attempt} was accepted, the store has {stored.progress}"
            )
    if isinstance(value, ResultAnswer) and not value.replayed:
        if value.state.is_terminal and stored.state is not value.state:
            return (
                f"attempt {attempt}'s result ended it {value.state}; the store: {describe(stored)}"
            )
        if value.state is JobState.RETRYING and stored.state not in (
            JobState.RETRYING,
            JobState.CANCELLED,
        ):
            return f"attempt {attempt}'s result made it retry, the store holds {describe(stored)}"
    return None
