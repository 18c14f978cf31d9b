"""The Run API's answers (docs/protocol.md): what the platform sends Run, and what Run reads.

Instants are RFC 3339 strings (`2026-11-30T04:00:00.123Z`), states the job state machine's
names. A field an older platform did not send is `NotRequired`: Run copes with its absence,
and this platform always sends it.
"""

from __future__ import annotations

from typing import Any, NotRequired

from typing_extensions import TypedDict

from moonrun.wire.error_body import ErrorDetail

# -- control channel -----------------------------------------------------------------------------


class JoinAnswer(TypedDict):
    endpoint_id: str


class RegisterAnswer(TypedDict):
    """A new session: its id and key (HMAC-SHA256, base64url), its generation, and the
    platform's timings."""

    session_id: str
    session_key: str
    generation: int
    expires_at: str
    heartbeat_interval_s: float
    session_ttl_s: float
    ack_timeout_s: float
    lease_ttl_s: float
    claims_with_results: NotRequired[bool]
    """The platform grants jobs in a results batch's answer (docs/protocol.md, "Claims with
    results"); a platform older than that says nothing, and Run then claims apart."""
    silent_results: NotRequired[bool]
    """The platform takes a result's `silent` (docs/protocol.md, "Silent attempts"); a
    platform older than that says nothing, and Run then sends each attempt's last log batch."""
    log_batches: NotRequired[bool]
    """The platform takes several attempts' log batches in one request (docs/protocol.md,
    "Log batches together"); to one older than that Run sends them one by one."""


class HeartbeatAnswer(TypedDict):
    session_expires_at: str
    server_time: str
    heartbeat_interval_s: NotRequired[float]
    """The interval to heartbeat at from now on: the platform stretches it as its fleet grows
    (and the session TTL with it)."""


class SessionEndAnswer(TypedDict):
    session_id: str
    generation: int


# -- jobs channel --------------------------------------------------------------------------------


class ConfirmedAttempt(TypedDict):
    """A journal entry the platform agrees Run holds: resume it."""

    job_id: str
    attempt: int
    state: str
    cancel_requested: bool
    deadline: str
    """Its ack deadline (accepted) or its renewed execution lease (running)."""


class DiscardedAttempt(TypedDict):
    """A journal entry Run must drop, and why (`reason`)."""

    job_id: str
    attempt: int
    reason: str


class LostAttempt(TypedDict):
    """An attempt active on this endpoint that Run's journal did not list: the platform ended
    it (`state` is the job's state now)."""

    job_id: str
    attempt: int
    state: str


class ReconcileAnswer(TypedDict):
    confirmed: list[ConfirmedAttempt]
    discard: list[DiscardedAttempt]
    lost: list[LostAttempt]


class Grant(TypedDict):
    """One job a claim granted: a new attempt under a new lease (the raw token, shown once)."""

    job_id: str
    server_id: str
    owner_id: NotRequired[str]
    """Whose job it is (docs/protocol.md, "Claims"); a platform older than that sends none."""
    kind: str
    payload: Any
    attempt: int
    lease: str
    ack_deadline: str
    lease_ttl_s: float
    max_attempts: int


class ClaimAnswer(TypedDict):
    jobs: list[Grant]


class AckAnswer(TypedDict):
    state: str
    lease_expires_at: str
    cancel_requested: NotRequired[bool]
    """Whether a cancel intent exists (docs/protocol.md, "Cancellation"); a platform older than
    that sends none, and Run then polls once."""


class ProgressAnswer(TypedDict):
    lease_expires_at: str
    cancel_requested: bool


class CancelledAttempt(TypedDict):
    job_id: str
    attempt: int


class CancelWatchAnswer(TypedDict):
    cancels: list[CancelledAttempt]
    """The endpoint's active attempts a user asked to cancel (but those Run said it knows)."""


class CancelPollAnswer(TypedDict):
    cancel_requested: bool
    requested_at: str | None


class ResultAnswer(TypedDict):
    state: str
    attempt: int
    fingerprint: str
    next_eligible_at: str | None
    replayed: bool
    """The recorded result was sent again: this is its stored answer."""


class BatchEntry(TypedDict):
    """One message of a batch: what its single-message route would have answered."""

    job_id: str
    status: int
    """200, or the error's status."""
    error: NotRequired[ErrorDetail]
    """When `status` is not 200."""


class AckEntry(BatchEntry):
    answer: NotRequired[AckAnswer]
    """When `status` is 200."""


class ResultEntry(BatchEntry):
    answer: NotRequired[ResultAnswer]
    """When `status` is 200."""


class AckBatchAnswer(TypedDict):
    answers: list[AckEntry]
    """One per ack, in the request's order."""


class ResultBatchAnswer(TypedDict):
    answers: list[ResultEntry]
    """One per result, in the request's order."""
    jobs: NotRequired[list[Grant]]
    """What the batch's `claim` granted (absent when it asked none)."""


# -- logs and artifacts channels -----------------------------------------------------------------


class LogBatchAnswer(TypedDict):
    accepted_through_seq: int


class LogEntry(BatchEntry):
    attempt: int
    answer: NotRequired[LogBatchAnswer]
    """When `status` is 200."""


class LogBatchesAnswer(TypedDict):
    answers: list[LogEntry]
    """One per batch, in the request's order."""


class ChunkAnswer(TypedDict):
    chunk_index: int
    final: bool
