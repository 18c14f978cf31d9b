"""Request and response bodies of the HTTP API (docs/protocol.md), as pydantic models.

Requests are strict: a wrong JSON type is 422 `invalid_request`, never coerced. Responses
are declared so that the served OpenAPI document describes every route, and FastAPI filters
each response through its model: a field the model does not name never leaves.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from moonrun.errors import InvalidRequest
from moonrun.scheduling.jobs import KIND_PATTERN
from moonrun.scheduling.time import parse_instant
from moonrun.service.checks import NAME_PATTERN

SEQ_MAX = 2**63 - 1
"""Sequence numbers fit a signed 64-bit integer, so every store and client can hold them."""


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- errors ------------------------------------------------------------------------------------


class FieldProblem(Answer):
    field: str
    """Where in the request's payload, e.g. `argv[0]`; "" is the whole payload."""
    message: str


class ErrorDetail(Answer):
    code: str
    message: str
    fields: list[FieldProblem] | None = None
    """With `invalid_payload`: each field that does not fit the kind's schema."""


class ErrorBody(Answer):
    error: ErrorDetail


# -- Run: control channel ------------------------------------------------------------------------


class JoinRequest(Strict):
    join_token: str
    identity_public_key: str


class JoinAnswer(Answer):
    endpoint_id: str


class RegisterRequest(Strict):
    boot_id: str
    run_version: str
    capacity: int
    kinds: dict[str, Any] | None = None
    """The kinds this Run runs, each with its payload's JSON Schema (docs/protocol.md, "Kinds")."""


class RegisterAnswer(Answer):
    session_id: str
    session_key: str
    generation: int
    expires_at: str
    heartbeat_interval_s: float
    session_ttl_s: float
    ack_timeout_s: float
    lease_ttl_s: float


class HeartbeatAnswer(Answer):
    session_expires_at: str
    server_time: str


class SessionEndAnswer(Answer):
    session_id: str
    generation: int


# -- Run: jobs channel ---------------------------------------------------------------------------


class EvidenceRequest(Strict):
    attempt: int
    lease: str


class ReconcileEntryModel(Strict):
    job_id: str
    attempt: int
    lease: str


class ReconcileRequest(Strict):
    entries: list[ReconcileEntryModel]


class ConfirmedModel(Answer):
    job_id: str
    attempt: int
    state: str
    cancel_requested: bool
    deadline: str


class DiscardModel(Answer):
    job_id: str
    attempt: int
    reason: str


class LostModel(Answer):
    job_id: str
    attempt: int
    state: str


class ReconcileAnswer(Answer):
    confirmed: list[ConfirmedModel]
    discard: list[DiscardModel]
    lost: list[LostModel]


class ClaimRequest(Strict):
    max_jobs: int
    wait_s: float | None = Field(default=None, ge=0, le=3600)
    """Long poll: wait up to this long (capped by the platform) for a claimable job."""


class ClaimedModel(Answer):
    job_id: str
    server_id: str
    owner_id: str
    kind: str
    payload: Any
    attempt: int
    lease: str
    ack_deadline: str
    lease_ttl_s: float
    max_attempts: int


class ClaimAnswer(Answer):
    jobs: list[ClaimedModel]


class AckAnswerModel(Answer):
    state: str
    lease_expires_at: str
    cancel_requested: bool


class ProgressRequest(EvidenceRequest):
    seq: int
    percent: float | None = None
    message: str | None = None


class ProgressAnswerModel(Answer):
    lease_expires_at: str
    cancel_requested: bool


class CancelPollAnswerModel(Answer):
    cancel_requested: bool
    requested_at: str | None


class ErrorInfoModel(Strict):
    code: str
    message: str


class ResultRequest(EvidenceRequest):
    outcome: str
    retryable: bool
    error: ErrorInfoModel | None = None
    output: Any = None


class ResultAnswerModel(Answer):
    state: str
    attempt: int
    fingerprint: str
    next_eligible_at: str | None
    replayed: bool


class AckItem(Strict):
    job_id: str
    attempt: int
    lease: str


class AckBatchRequest(Strict):
    acks: list[AckItem]


class ResultItem(ResultRequest):
    job_id: str


class ResultBatchRequest(Strict):
    results: list[ResultItem]


class BatchEntry(Answer):
    job_id: str
    status: int
    """What the single-message route would have answered: 200, or the error's status."""
    answer: dict[str, Any] | None = None
    error: ErrorDetail | None = None


class BatchAnswer(Answer):
    answers: list[BatchEntry]


class ChunkAnswer(Answer):
    chunk_index: int
    final: bool


# -- Run: logs channel ---------------------------------------------------------------------------


RFC3339_PROBLEM = "must be an RFC 3339 timestamp such as 2026-11-30T04:00:00.000Z"


def _rfc3339(text: str) -> str:
    # ASCII only: the parser's `\d` would also take other scripts' digits.
    if not text.isascii():
        raise ValueError(RFC3339_PROBLEM)
    try:
        parse_instant(text)
    except InvalidRequest:
        raise ValueError(RFC3339_PROBLEM) from None
    return text


class LogLineModel(Strict):
    ts: Annotated[str, AfterValidator(_rfc3339)]
    stream: str = Field(pattern="^(stdout|stderr)$")
    text: str


class LogBatchRequest(Strict):
    job_id: str
    attempt: int
    lease: str
    seq: int = Field(ge=0, le=SEQ_MAX)
    lines: list[LogLineModel]


class LogBatchAnswer(Answer):
    accepted_through_seq: int


# -- users ---------------------------------------------------------------------------------------


class UserModel(Answer):
    id: str
    name: str
    platform_admin: bool
    created_at: str
    disabled: bool
    """Its API tokens and console sessions are refused (docs/protocol.md, "Users and access")."""


NAME = Field(pattern=NAME_PATTERN.pattern)


class CreateUserRequest(Strict):
    name: str = NAME
    password: str | None = None
    platform_admin: bool = False


class CreatedUserAnswer(Answer):
    user: UserModel
    api_token: str


class RotatedTokenAnswer(Answer):
    user: UserModel
    api_token: str
    """The user's only API token from now, shown once."""


class SetPasswordRequest(Strict):
    password: str


class UsersAnswer(Answer):
    users: list[UserModel]


class ServerModel(Answer):
    id: str
    name: str
    endpoint_id: str
    owner_id: str
    admin_ids: list[str]
    created_at: str
    endpoint_online: bool


class ServersAnswer(Answer):
    servers: list[ServerModel]


class KindModel(Answer):
    kind: str
    payload_schema: Any
    """The JSON Schema the server's Run checks this kind's payloads with (docs/kinds.md)."""


class KindsAnswer(Answer):
    advertised: bool
    """Whether the server's Run advertised its kinds; when not (an older Run, or one that
    never registered), every kind is accepted at submit and checked only on the host."""
    advertised_at: str | None
    kinds: list[KindModel]


class CreateServerRequest(Strict):
    name: str = NAME
    endpoint_id: str
    owner_id: str


class AddAdminRequest(Strict):
    user_id: str


class EndpointModel(Answer):
    id: str
    name: str
    online: bool
    generation: int
    last_seen_at: str | None
    capacity: int | None
    run_version: str | None
    draining: bool
    """No new claims are granted to it (docs/protocol.md, "Endpoints")."""


class EndpointsAnswer(Answer):
    endpoints: list[EndpointModel]


class CreateEndpointRequest(Strict):
    name: str = NAME


class CreatedEndpointAnswer(Answer):
    endpoint: EndpointModel
    join_token: str
    join_token_expires_at: str


class BackoffModel(Strict):
    initial_s: float | None = None
    multiplier: float | None = None
    max_s: float | None = None


class CreateJobRequest(Strict):
    kind: str = Field(pattern=KIND_PATTERN.pattern)
    payload: dict[str, Any] | None = None
    max_attempts: int | None = None
    backoff: BackoffModel | None = None
    not_before: str | None = None


class LastFailureModel(Answer):
    reason: str
    code: str | None
    attempt: int
    at: str
    message: str | None


class RetryModel(Answer):
    next_eligible_at: str | None
    initial_s: float
    multiplier: float
    max_s: float
    last_failure: LastFailureModel | None


class ProgressModel(Answer):
    seq: int
    percent: float | None
    message: str | None
    at: str


class CancelModel(Answer):
    requested: bool
    requested_at: str | None
    result: str | None
    resolved_at: str | None


class TerminalErrorModel(Answer):
    code: str
    message: str


class TerminalModel(Answer):
    outcome: str
    attempt: int
    at: str
    error: TerminalErrorModel | None


class ReconcileModel(Answer):
    outcome: str | None
    at: str | None


class HistoryModel(Answer):
    attempt: int
    claimed_at: str | None
    ended_at: str
    outcome: str
    code: str | None


class JobViewModel(Answer):
    id: str
    server_id: str
    kind: str
    state: str
    attempt: int
    max_attempts: int
    created_at: str
    updated_at: str
    retry: RetryModel
    progress: ProgressModel | None
    cancel: CancelModel
    terminal: TerminalModel | None
    reconcile: ReconcileModel
    history: list[HistoryModel]


class CreateJobsRequest(Strict):
    jobs: list[CreateJobRequest] = Field(min_length=1, max_length=1000)


class CreatedJobsAnswer(Answer):
    jobs: list[JobViewModel]


class JobsAnswer(Answer):
    jobs: list[JobViewModel]


class CancelJobsRequest(Strict):
    job_ids: list[str] = Field(min_length=1, max_length=1000)
    """Each job at most once."""


class CancelEntry(Answer):
    job_id: str
    status: int
    """What `POST /api/v1/jobs/{job_id}/cancel` would have answered: 200, 202 (the intent waits
    on Run), or the refusal's status."""
    answer: JobViewModel | None = None
    error: ErrorDetail | None = None


class CancelJobsAnswer(Answer):
    answers: list[CancelEntry]
    next_cursor: str | None


class UserLogLine(Answer):
    attempt: int
    seq: int
    ts: str
    stream: str
    text: str


class LogsAnswer(Answer):
    attempt: int | None
    lines: list[UserLogLine]
    next_after_seq: int
    """Pass as `after_seq` for the next page (or, after a tail, for newer lines)."""
    more: bool
    """This page left lines after `next_after_seq` off."""
    dropped_lines: int
    """Lines of the attempt the platform dropped for its bounds (docs/protocol.md, "Log bounds")."""
    dropped_bytes: int


class ArtifactModel(Answer):
    attempt: int
    name: str
    size: int
    """The bytes stored so far (all of them once complete)."""
    complete: bool
    """Its final chunk has arrived: it can be downloaded."""


class ArtifactsAnswer(Answer):
    artifacts: list[ArtifactModel]
    """Every attempt's artifacts, by attempt then name."""


class HealthAnswer(Answer):
    status: str
