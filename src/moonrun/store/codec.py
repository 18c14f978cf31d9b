"""Records to SQL rows and back, field by field (the inverse of each other, and nothing else)."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from sqlalchemy import Boolean, Table

from moonrun.scheduling.groups import Group
from moonrun.scheduling.jobs import (
    AttemptSummary,
    CancelResult,
    CancelState,
    Concurrency,
    ErrorInfo,
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
)
from moonrun.scheduling.labels import NO_LABELS, Labels
from moonrun.scheduling.records import Endpoint, Server, Session, User
from moonrun.scheduling.retry import RetryPolicy
from moonrun.scheduling.schedules import Overlap, Schedule
from moonrun.store import schema

Row = Mapping[str, Any]
R = TypeVar("R")


def job_to_row(job: Job) -> dict[str, Any]:
    policy, progress, cancel = job.policy, job.progress, job.cancel
    failure, recorded, terminal, mark = job.last_failure, job.result, job.terminal, job.reconcile
    reported = recorded.result if recorded else None
    return {
        "id": job.id,
        "server_id": job.server_id,
        "endpoint_id": job.endpoint_id,
        "owner_id": job.owner_id,
        "kind": job.kind,
        "payload_json": job.payload_json,
        "state": job.state.value,
        "attempt": job.attempt,
        "max_attempts": policy.max_attempts,
        "backoff_initial_s": policy.initial_s,
        "backoff_multiplier": policy.multiplier,
        "backoff_max_s": policy.max_s,
        "backoff_jitter": policy.jitter,
        "eligible_at": job.eligible_at,
        "claimable_at": job.claimable_at,
        "claimable_owner_id": None if job.claimable_at is None else job.owner_id,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "version": job.version,
        "lease_hash": job.lease_hash,
        "session_generation": job.session_generation,
        "claimed_at": job.claimed_at,
        "ack_deadline": job.ack_deadline,
        "lease_expires_at": job.lease_expires_at,
        "deadline_at": job.deadline_at,
        "progress_seq": progress.seq if progress else None,
        "progress_percent": progress.percent if progress else None,
        "progress_message": progress.message if progress else None,
        "progress_at": progress.at if progress else None,
        "cancel_requested_at": cancel.requested_at if cancel else None,
        "cancel_requested_by": cancel.requested_by if cancel else None,
        "cancel_result": cancel.result.value if cancel and cancel.result else None,
        "cancel_resolved_at": cancel.resolved_at if cancel else None,
        "failure_reason": failure.reason.value if failure else None,
        "failure_attempt": failure.attempt if failure else None,
        "failure_at": failure.at if failure else None,
        "failure_code": failure.code if failure else None,
        "failure_message": failure.message if failure else None,
        "result_attempt": recorded.attempt if recorded else None,
        "result_outcome": reported.outcome.value if reported else None,
        "result_retryable": reported.retryable if reported else None,
        "result_error_code": reported.error.code if reported and reported.error else None,
        "result_error_message": reported.error.message if reported and reported.error else None,
        "result_output_json": reported.output_json if reported else None,
        "result_fingerprint": reported.fingerprint if reported else None,
        "result_at": recorded.at if recorded else None,
        "terminal_outcome": terminal.outcome.value if terminal else None,
        "terminal_attempt": terminal.attempt if terminal else None,
        "terminal_at": terminal.at if terminal else None,
        "terminal_error_code": terminal.error.code if terminal and terminal.error else None,
        "terminal_error_message": terminal.error.message if terminal and terminal.error else None,
        "reconcile_outcome": mark.outcome.value if mark else None,
        "reconcile_at": mark.at if mark else None,
        "reconcile_generation": mark.generation if mark else None,
        "history_json": json.dumps(
            [
                # A silent attempt's flag only where it is set: older rows have five fields.
                [past.attempt, past.claimed_at, past.ended_at, past.outcome, past.code]
                + ([1] if past.silent else [])
                for past in job.history
            ],
            separators=(",", ":"),
        ),
        "group_id": job.group_id,
        "held": job.held,
        "held_group_id": job.held_group_id,
        "schedule_id": job.schedule_id,
        "scheduled_for": job.scheduled_for,
        "concurrency_key": job.concurrency.key if job.concurrency else None,
        "concurrency_limit": job.concurrency.limit if job.concurrency else None,
        "key_held": job.key_held,
        "held_key": job.held_key,
        "live_key": job.live_key,
        "after_json": json.dumps(list(job.after), separators=(",", ":")) if job.after else None,
        "after_group_id": job.after_group,
        "dependency_held": 1 if job.dependency_held else None,
        "priority": job.priority,
        "claimable_rank": job.claim_rank,
    }


def row_to_job(row: Row) -> Job:
    return Job(
        id=row["id"],
        server_id=row["server_id"],
        endpoint_id=row["endpoint_id"],
        owner_id=row["owner_id"],
        kind=row["kind"],
        payload_json=row["payload_json"],
        policy=_policy(
            row["max_attempts"],
            row["backoff_initial_s"],
            row["backoff_multiplier"],
            row["backoff_max_s"],
            row["backoff_jitter"],
        ),
        state=JobState(row["state"]),
        attempt=row["attempt"],
        eligible_at=row["eligible_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        version=row["version"],
        lease_hash=row["lease_hash"],
        session_generation=row["session_generation"],
        claimed_at=row["claimed_at"],
        ack_deadline=row["ack_deadline"],
        lease_expires_at=row["lease_expires_at"],
        progress=None
        if row["progress_seq"] is None
        else Progress(
            seq=row["progress_seq"],
            percent=row["progress_percent"],
            message=row["progress_message"],
            at=row["progress_at"],
        ),
        cancel=None
        if row["cancel_requested_at"] is None
        else CancelState(
            requested_at=row["cancel_requested_at"],
            requested_by=row["cancel_requested_by"],
            result=None if row["cancel_result"] is None else CancelResult(row["cancel_result"]),
            resolved_at=row["cancel_resolved_at"],
        ),
        last_failure=None
        if row["failure_reason"] is None
        else Failure(
            reason=FailureReason(row["failure_reason"]),
            attempt=row["failure_attempt"],
            at=row["failure_at"],
            code=row["failure_code"],
            message=row["failure_message"],
        ),
        result=None
        if row["result_attempt"] is None
        else RecordedResult(
            attempt=row["result_attempt"],
            result=RunResult(
                outcome=Outcome(row["result_outcome"]),
                retryable=bool(row["result_retryable"]),
                error=_error(row["result_error_code"], row["result_error_message"]),
                output_json=row["result_output_json"],
                fingerprint=row["result_fingerprint"],
            ),
            at=row["result_at"],
        ),
        terminal=None
        if row["terminal_outcome"] is None
        else Terminal(
            outcome=Outcome(row["terminal_outcome"]),
            attempt=row["terminal_attempt"],
            at=row["terminal_at"],
            error=_error(row["terminal_error_code"], row["terminal_error_message"]),
        ),
        reconcile=None
        if row["reconcile_outcome"] is None
        else ReconcileMark(
            outcome=ReconcileOutcome(row["reconcile_outcome"]),
            at=row["reconcile_at"],
            generation=row["reconcile_generation"],
        ),
        history=tuple(
            AttemptSummary(attempt, claimed_at, ended_at, outcome, code, silent=silent == [1])
            for attempt, claimed_at, ended_at, outcome, code, *silent in json.loads(
                row["history_json"]
            )
        ),
        group_id=row["group_id"],
        held=bool(row["held"]),
        schedule_id=row["schedule_id"],
        scheduled_for=row["scheduled_for"],
        concurrency=None
        if row["concurrency_key"] is None
        else Concurrency(row["concurrency_key"], row["concurrency_limit"]),
        key_held=bool(row["key_held"]),
        after=() if row["after_json"] is None else tuple(json.loads(row["after_json"])),
        after_group=row["after_group_id"],
        priority=row["priority"],
    )


_policy = functools.lru_cache(maxsize=1024)(RetryPolicy)
"""Stored policies are few and were checked when their jobs were made: build each once."""


def _error(code: str | None, message: str | None) -> ErrorInfo | None:
    return None if code is None else ErrorInfo(code, message or "")


class FlatCodec(Generic[R]):
    """A record whose fields are its table's columns one to one (but for `extra` fields kept
    elsewhere): both directions are built from the table's definition in schema.py, and a
    field without a column or a column without a field is an error at import."""

    def __init__(self, record: Callable[..., R], table: Table, *, extra: tuple[str, ...] = ()):
        self.columns = tuple(column.name for column in table.columns)
        # A `labels` field is its `labels_json` column: the map as a JSON object (NULL: none).
        self.labelled = "labels_json" in self.columns
        self.plain = tuple(name for name in self.columns if name != "labels_json")
        named = {*self.plain, "labels"} if self.labelled else set(self.columns)
        fields = {field.name for field in dataclasses.fields(record)}  # type: ignore[arg-type]
        if fields - set(extra) != named:
            raise TypeError(f"{table.name} columns {self.columns} do not match {sorted(fields)}")
        # The SQL drivers answer booleans as 0/1.
        self.booleans = frozenset(c.name for c in table.columns if isinstance(c.type, Boolean))
        self.record = record

    def to_row(self, value: R) -> dict[str, Any]:
        row = {name: getattr(value, name) for name in self.plain}
        if self.labelled:
            row["labels_json"] = labels_to_json(value.labels)  # type: ignore[attr-defined]
        return row

    def from_row(self, row: Row, **extra: Any) -> R:
        booleans = self.booleans
        fields = {name: bool(row[name]) if name in booleans else row[name] for name in self.plain}
        if self.labelled:
            fields["labels"] = labels_from_json(row["labels_json"])
        return self.record(**fields, **extra)


def labels_to_json(labels: Labels) -> str | None:
    return None if not labels else json.dumps(dict(labels), separators=(",", ":"))


def labels_from_json(text: str | None) -> Labels:
    # Stored labels were checked when they were set: only their order is restored.
    return NO_LABELS if not text else tuple(sorted(json.loads(text).items()))


_endpoints = FlatCodec(Endpoint, schema.endpoints)
_sessions = FlatCodec(Session, schema.sessions)
_users = FlatCodec(User, schema.users)
_servers = FlatCodec(Server, schema.servers, extra=("admin_ids",))

endpoint_to_row = _endpoints.to_row
row_to_endpoint = _endpoints.from_row
session_to_row = _sessions.to_row
row_to_session = _sessions.from_row
user_to_row = _users.to_row
row_to_user = _users.from_row
server_to_row = _servers.to_row
"""The `servers` row; administrators live in `server_admins`."""


def row_to_server(row: Row, admin_ids: tuple[str, ...]) -> Server:
    return _servers.from_row(row, admin_ids=admin_ids)


_groups = FlatCodec(Group, schema.job_groups)
group_to_row = _groups.to_row
row_to_group = _groups.from_row
_schedules = FlatCodec(Schedule, schema.schedules)
schedule_to_row = _schedules.to_row


def row_to_schedule(row: Row) -> Schedule:
    schedule = _schedules.from_row(row)
    return dataclasses.replace(schedule, overlap=Overlap(schedule.overlap))
