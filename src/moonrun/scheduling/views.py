"""What of a record leaves the platform toward users (docs/protocol.md, "User API").

Each view is built field by field from an allowlist; nothing here copies a record wholesale,
so a field added to a record never leaks by accident. The views' shapes are declared in
`moonrun.wire.user`, with the answers that carry them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from moonrun.scheduling.fingerprint import JsonValue
from moonrun.scheduling.groups import Group, is_done
from moonrun.scheduling.jobs import DEFAULT_PRIORITY, Job, JobState
from moonrun.scheduling.records import Endpoint, Server, Session, User
from moonrun.scheduling.redaction import redacted
from moonrun.scheduling.schedules import Schedule
from moonrun.scheduling.time import Instant, format_instant, format_optional
from moonrun.wire.user import (
    EndpointView,
    GroupView,
    JobView,
    ScheduleView,
    ServerView,
    UserView,
)

__all__ = [
    "EndpointView",
    "GroupView",
    "JobView",
    "ScheduleView",
    "ServerView",
    "UserView",
    "endpoint_online",
    "endpoint_view",
    "group_view",
    "job_view",
    "logs_complete",
    "schedule_view",
    "server_view",
    "session_live",
    "user_view",
]


def logs_complete(job: Job, attempt: int, marked: bool, now: Instant, grace_ms: int) -> bool:
    """Whether all of an attempt's log lines are in (docs/protocol.md, "Sending logs"): it has
    ended, and its Run said its last batch went (`marked`) or, with its result, that it printed
    none (`silent`), or the transfer grace after its end has passed (a Run older than the
    marker says nothing; nothing is taken after it). A job never claimed (attempt 0) has no
    logs to wait for once it is not waiting any more."""
    if attempt < 1:
        return not job.state.is_waiting and not job.state.is_active
    if attempt == job.attempt and job.state.is_active:
        return False
    if marked:
        return True
    past = next((past for past in job.history if past.attempt == attempt), None)
    return past is not None and (past.silent or now > past.ended_at + grace_ms)


def job_view(job: Job, *, logs_complete: bool = False, payload: bool = False) -> JobView:
    """The user projection of a job: scheduling status, never the platform's credentials.
    `logs_complete`: whether its latest attempt's logs are all in (the log store knows);
    `payload`: whether to show what its submitter gave, credential-looking parts redacted
    (asked for: `?include=payload`; docs/protocol.md, "Payload")."""
    failure = job.last_failure
    policy = job.policy
    view: JobView = {
        "id": job.id,
        "server_id": job.server_id,
        "kind": job.kind,
        "state": job.state.value,
        "attempt": job.attempt,
        "max_attempts": policy.max_attempts,
        "created_at": format_instant(job.created_at),
        "updated_at": format_instant(job.updated_at),
        "retry": {
            "next_eligible_at": format_instant(job.eligible_at) if job.state.is_waiting else None,
            "initial_s": float(policy.initial_s),
            "multiplier": float(policy.multiplier),
            "max_s": float(policy.max_s),
            "last_failure": None
            if failure is None
            else {
                "reason": failure.reason.value,
                "code": failure.code,
                "attempt": failure.attempt,
                "at": format_instant(failure.at),
                "message": failure.message,
            },
        },
        "progress": None
        if job.progress is None
        else {
            "seq": job.progress.seq,
            "percent": job.progress.percent,
            "message": job.progress.message,
            "at": format_instant(job.progress.at),
        },
        "cancel": {
            "requested": job.cancel is not None,
            "requested_at": format_optional(job.cancel.requested_at if job.cancel else None),
            "result": job.cancel.result.value if job.cancel and job.cancel.result else None,
            "resolved_at": format_optional(job.cancel.resolved_at if job.cancel else None),
        },
        "terminal": None
        if job.terminal is None
        else {
            "outcome": job.terminal.outcome.value,
            "attempt": job.terminal.attempt,
            "at": format_instant(job.terminal.at),
            "error": None
            if job.terminal.error is None
            else {"code": job.terminal.error.code, "message": job.terminal.error.message},
            "result": _terminal_result(job),
        },
        "reconcile": {
            "outcome": job.reconcile.outcome.value if job.reconcile else None,
            "at": format_optional(job.reconcile.at if job.reconcile else None),
        },
        "history": [
            {
                "attempt": past.attempt,
                "claimed_at": format_optional(past.claimed_at),
                "ended_at": format_instant(past.ended_at),
                "outcome": past.outcome,
                "code": past.code,
            }
            for past in job.history
        ],
        "group": None
        if job.group_id is None
        else {"id": job.group_id, "held": job.held_group_id is not None},
        "logs_complete": logs_complete,
        "schedule": None
        if job.schedule_id is None or job.scheduled_for is None
        else {"id": job.schedule_id, "scheduled_for": format_instant(job.scheduled_for)},
        "concurrency": None
        if job.concurrency is None
        else {
            "key": job.concurrency.key,
            "limit": job.concurrency.limit,
            "held": job.key_held and job.state is JobState.QUEUED,
        },
        "waiting_for": {"jobs": list(job.after), "group": job.after_group}
        if job.dependency_held
        else None,
        "priority": job.priority,
    }
    if payload:
        view["payload"] = redacted(job.payload())
    return view


def group_view(group: Group, counts: Mapping[JobState, int]) -> GroupView:
    """A group as its creator sees it: its selector and options, and its jobs' counts."""
    return {
        "id": group.id,
        "creator_id": group.creator_id,
        "selector": group.selector,
        "kind": group.kind,
        "created_at": format_instant(group.created_at),
        "job_count": group.job_count,
        "max_parallel": group.max_parallel,
        "stop_on_failure": group.stop_on_failure,
        "counts": {
            "queued": counts.get(JobState.QUEUED, 0),
            "accepted": counts.get(JobState.ACCEPTED, 0),
            "running": counts.get(JobState.RUNNING, 0),
            "retrying": counts.get(JobState.RETRYING, 0),
            "succeeded": counts.get(JobState.SUCCEEDED, 0),
            "failed": counts.get(JobState.FAILED, 0),
            "cancelled": counts.get(JobState.CANCELLED, 0),
        },
        "done": is_done(counts),
    }


def schedule_view(
    schedule: Schedule,
    last_job: Job | None,
    *,
    owner_disabled: bool,
    next_times: Sequence[Instant],
    last_group_done: bool | None = None,
) -> ScheduleView:
    """A schedule as its server's owner and admins (a selector schedule's creator) see it: its
    job's kind and options, never its payload."""
    template = json.loads(schedule.job_json)
    last = schedule.last_job_id
    fired = schedule.last_scheduled_for is not None and (last is not None or schedule.fans_out)
    return {
        "id": schedule.id,
        "server_id": schedule.server_id,
        "selector": schedule.selector,
        "max_parallel": schedule.max_parallel,
        "stop_on_failure": schedule.stop_on_failure,
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "job": {
            "kind": template["kind"],
            "max_attempts": template.get("max_attempts"),
            "backoff": template.get("backoff"),
            "priority": template.get("priority", DEFAULT_PRIORITY),
            "concurrency": template.get("concurrency"),
        },
        "overlap": schedule.overlap.value,
        "catchup_window_s": schedule.catchup_window_s,
        "paused": schedule.paused,
        "owner_disabled": owner_disabled,
        "next_times": [format_instant(t) for t in next_times],
        "last_firing": None
        if not fired or schedule.last_scheduled_for is None
        else {
            "scheduled_for": format_instant(schedule.last_scheduled_for),
            "job_id": last,
            "job_state": None if last_job is None else last_job.state.value,
            "group_id": schedule.last_group_id,
            "group_done": None if schedule.last_group_id is None else last_group_done,
        },
        "skipped": schedule.skipped,
        "missed": schedule.missed,
        "unmatched": schedule.unmatched,
        "created_at": format_instant(schedule.created_at),
    }


def _terminal_result(job: Job) -> JsonValue:
    """The output the ending attempt reported, if the job ended on Run's result."""
    ended, reported = job.terminal, job.result
    if ended is None or reported is None or reported.attempt != ended.attempt:
        return None
    output = reported.result.output_json
    return None if output is None else json.loads(output)


def session_live(session: Session, now: Instant, liveness_bound_ms: int) -> bool:
    """Whether a current session's Run counts as online at `now`: the session has not expired
    (fencing) and its last heartbeat is at most `liveness_bound_ms` old (liveness: a Run
    killed shows offline within the bound, not when its session would expire)."""
    return now < session.expires_at and now - session.last_seen_at <= liveness_bound_ms


def endpoint_online(
    endpoint: Endpoint, session: Session | None, now: Instant, *, liveness_bound_ms: int
) -> bool:
    """Whether an endpoint is online: `session` is its current one, and live."""
    return (
        session is not None
        and session.id == endpoint.current_session_id
        and session_live(session, now, liveness_bound_ms)
    )


def endpoint_view(
    endpoint: Endpoint, session: Session | None, now: Instant, *, liveness_bound_ms: int
) -> EndpointView:
    """An endpoint as platform admins see it. `session` is its latest: the current one, else
    the one that was current last (None before its Run first registered). Online only while
    that is current and live (`endpoint_online`); when it was last seen and what it offered
    (`last_seen_at`, `capacity`, `run_version`) are shown online or not."""
    online = endpoint_online(endpoint, session, now, liveness_bound_ms=liveness_bound_ms)
    return {
        "id": endpoint.id,
        "name": endpoint.name,
        "online": online,
        "generation": endpoint.generation,
        "last_seen_at": format_optional(session.last_seen_at if session else None),
        "capacity": session.capacity if session else None,
        "run_version": session.run_version if session else None,
        "draining": endpoint.draining,
        "labels": dict(endpoint.labels),
    }


def server_view(server: Server, endpoint_online: bool) -> ServerView:
    return {
        "id": server.id,
        "name": server.name,
        "endpoint_id": server.endpoint_id,
        "owner_id": server.owner_id,
        "admin_ids": list(server.admin_ids),
        "created_at": format_instant(server.created_at),
        "endpoint_online": endpoint_online,
        "labels": dict(server.labels),
    }


def user_view(user: User) -> UserView:
    return {
        "id": user.id,
        "name": user.name,
        "platform_admin": user.platform_admin,
        "created_at": format_instant(user.created_at),
        "disabled": user.disabled,
    }
