"""The HTTP APIs' request bodies and queries (docs/protocol.md), as pydantic models.

Requests are strict: a wrong JSON type is 422 `invalid_request`, never coerced. The answers
are declared once, in `moonrun.wire` (Run reads them too); the OpenAPI document is generated
from both.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from moonrun.errors import InvalidRequest
from moonrun.scheduling.concurrency import MAX_KEY_LENGTH
from moonrun.scheduling.concurrency import MAX_LIMIT as MAX_CONCURRENCY_LIMIT
from moonrun.scheduling.dependencies import MAX_AFTER
from moonrun.scheduling.groups import MAX_PARALLEL_LIMIT
from moonrun.scheduling.jobs import KIND_PATTERN, MAX_PRIORITY, MIN_PRIORITY
from moonrun.scheduling.labels import KEY_PATTERN, MAX_LABELS, MAX_VALUE_LENGTH
from moonrun.scheduling.schedules import DEFAULT_CATCHUP_WINDOW_S
from moonrun.scheduling.time import parse_instant
from moonrun.service.checks import NAME_PATTERN

SEQ_MAX = 2**63 - 1
"""Sequence numbers fit a signed 64-bit integer, so every store and client can hold them."""


class Strict(BaseModel):
    """A Run protocol body: strict types; fields this platform does not know are ignored, so
    that a newer Run can talk to an older platform (docs/protocol.md, "Conventions")."""

    model_config = ConfigDict(strict=True, extra="ignore")


class UserRequest(BaseModel):
    """A user API body: strict types, and a field the route does not know is refused (422
    naming it): a typo such as `max_attempt` must not quietly fall back to a default."""

    model_config = ConfigDict(strict=True, extra="forbid")


# -- Run: control channel ------------------------------------------------------------------------


class JoinRequest(Strict):
    join_token: str
    identity_public_key: str
    labels: dict[str, str] | None = None
    """Labels Run proposes for its endpoint (`moonrun run join --label`); an admin's win."""


class RegisterRequest(Strict):
    boot_id: str
    run_version: str
    capacity: int
    kinds: dict[str, Any] | None = None
    """The kinds this Run runs, each with its payload's JSON Schema (docs/protocol.md, "Kinds")."""


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


class ClaimRequest(Strict):
    max_jobs: int
    wait_s: float | None = Field(default=None, ge=0, le=3600)
    """Long poll: wait up to this long (capped by the platform) for a claimable job."""


class CancelWatchRequest(Strict):
    known: list[tuple[str, int]] = Field(default_factory=list, max_length=1000)
    """Attempts (job id, attempt) whose cancel Run already knows: not answered again."""
    wait_s: float | None = Field(default=None, ge=0, le=3600)
    """Long poll: wait up to this long (capped by the platform) for a cancel intent."""


class ProgressRequest(EvidenceRequest):
    seq: int
    percent: float | None = None
    message: str | None = None


class ErrorInfoModel(Strict):
    code: str
    message: str


class ResultRequest(EvidenceRequest):
    outcome: str
    retryable: bool
    error: ErrorInfoModel | None = None
    output: Any = None
    silent: bool = False
    """The attempt printed no log line: its logs are complete with this result, and its Run
    sends no batch of them (docs/protocol.md, "Silent attempts")."""


class AckItem(Strict):
    job_id: str
    attempt: int
    lease: str


class AckBatchRequest(Strict):
    acks: list[AckItem]


class ResultItem(ResultRequest):
    job_id: str


class ResultsClaim(Strict):
    max_jobs: int = Field(ge=1, le=2**31)


class ResultBatchRequest(Strict):
    results: list[ResultItem]
    claim: ResultsClaim | None = None
    """Claim up to `max_jobs` more once the results are applied (docs/protocol.md, "Claims
    with results"): the places the results free, granted in the same answer."""


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
    final: bool = False
    """The attempt's last batch: it has ended and Run has nothing more of it to send."""


MAX_LOG_BATCHES = 500


class LogBatchesRequest(Strict):
    """Several attempts' batches in one request (docs/protocol.md, "Log batches together")."""

    batches: list[LogBatchRequest] = Field(min_length=1, max_length=MAX_LOG_BATCHES)


# -- users ---------------------------------------------------------------------------------------


NAME = Field(pattern=NAME_PATTERN.pattern)


class CreateUserRequest(UserRequest):
    name: str = NAME
    password: str | None = None
    platform_admin: bool = False


class SetPasswordRequest(UserRequest):
    password: str


LABELS_DESCRIPTION = (
    "At most 32 labels; each key matches [a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?, each value is "
    "at most 128 characters without control characters (else 422 invalid_labels)"
)
"""The checks themselves are the domain's (`scheduling/labels.py`), so every door keeps them;
the document states them too (`LABELS_SCHEMA`)."""
LABELS_SCHEMA: dict[str, Any] = {
    "maxProperties": MAX_LABELS,
    "propertyNames": {"pattern": f"^{KEY_PATTERN.pattern}$"},
    "additionalProperties": {"type": "string", "maxLength": MAX_VALUE_LENGTH},
}


class CreateServerRequest(UserRequest):
    name: str = NAME
    endpoint_id: str
    owner_id: str
    labels: dict[str, str] | None = Field(
        default=None, description=LABELS_DESCRIPTION, json_schema_extra=LABELS_SCHEMA
    )


class SetLabelsRequest(UserRequest):
    labels: dict[str, str] = Field(description=LABELS_DESCRIPTION, json_schema_extra=LABELS_SCHEMA)
    """The whole new map: it replaces the old one."""


class AddAdminRequest(UserRequest):
    user_id: str


class CreateEndpointRequest(UserRequest):
    name: str = NAME


class BackoffModel(UserRequest):
    initial_s: float | None = None
    multiplier: float | None = None
    max_s: float | None = None


class ConcurrencyModel(UserRequest):
    key: str = Field(
        min_length=1,
        max_length=MAX_KEY_LENGTH,
        description="1 to 128 printable characters; keys are the owner's",
    )
    limit: int = Field(
        default=1,
        ge=1,
        le=MAX_CONCURRENCY_LIMIT,
        description="At most this many of the owner's jobs with the key claimed or running",
    )


class JobRequest(UserRequest):
    kind: str = Field(pattern=KIND_PATTERN.pattern)
    payload: dict[str, Any] | None = None
    max_attempts: int | None = None
    backoff: BackoffModel | None = None
    not_before: str | None = None
    concurrency: ConcurrencyModel | None = None
    priority: int | None = Field(
        default=None,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        description="0 to 9, default 5: among an endpoint's claimable jobs a higher priority "
        "is granted first, first in first out within one (strict: no aging)",
    )


class CreateJobRequest(JobRequest):
    # Checked by the use case (at most MAX_AFTER, each once), whose 422 names the field.
    after: list[str] | None = Field(
        default=None,
        description=f"Jobs (at most {MAX_AFTER}) this one waits on: it is held until each "
        "succeeded, and cancelled (dependency_failed) once one did not",
    )
    after_group: str | None = Field(
        default=None,
        description="A group this one waits on: held until every job of it succeeded",
    )


class FanoutRequest(JobRequest):
    selector: str = Field(
        description="The label selector the servers must match (k=v, k!=v, k in (a,b), "
        "k notin (a,b), k, !k; a comma is AND); at least one requirement"
    )
    max_parallel: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PARALLEL_LIMIT,
        description="At most this many of the group's jobs claimed or running at once",
    )
    stop_on_failure: bool = Field(
        default=False, description="Once one job fails, cancel the group's queued jobs"
    )


class ScheduleJobRequest(UserRequest):
    """The job each firing of a schedule creates: a create's fields but `not_before`."""

    kind: str = Field(pattern=KIND_PATTERN.pattern)
    payload: dict[str, Any] | None = None
    max_attempts: int | None = None
    backoff: BackoffModel | None = None
    priority: int | None = Field(
        default=None, ge=MIN_PRIORITY, le=MAX_PRIORITY, description="0 to 9, default 5"
    )
    concurrency: ConcurrencyModel | None = None


class CreateScheduleRequest(UserRequest):
    name: str
    cron: str
    timezone: str = "UTC"
    job: ScheduleJobRequest
    overlap: str = "skip"
    catchup_window_s: int = DEFAULT_CATCHUP_WINDOW_S
    paused: bool = False


class CreateAnyScheduleRequest(CreateScheduleRequest):
    """A schedule of one server (`server_id`) or of the servers a label `selector` matches at
    each firing (a group per firing): exactly one of the two."""

    server_id: str | None = Field(default=None, description="The server each firing runs on")
    selector: str | None = Field(
        default=None,
        description="In place of a server: the label selector each firing fans out over (one "
        "job per matching server the creator may submit to, as one group); at least one "
        "requirement",
    )
    max_parallel: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PARALLEL_LIMIT,
        description="A selector schedule's: at most this many of a firing's jobs claimed or "
        "running at once",
    )
    stop_on_failure: bool = Field(
        default=False,
        description="A selector schedule's: once one job of a firing fails, cancel that "
        "firing's queued jobs",
    )


class ChangeScheduleRequest(UserRequest):
    """Only the fields given change; a new `cron` or `timezone` starts the calendar after now."""

    selector: str | None = None
    """A selector schedule's only."""
    max_parallel: int | None = Field(default=None, ge=1, le=MAX_PARALLEL_LIMIT)
    stop_on_failure: bool | None = None

    name: str | None = None
    cron: str | None = None
    timezone: str | None = None
    job: ScheduleJobRequest | None = None
    overlap: str | None = None
    catchup_window_s: int | None = None
    paused: bool | None = None


class CreateJobsRequest(UserRequest):
    jobs: list[CreateJobRequest] = Field(min_length=1, max_length=1000)


class CancelJobsRequest(UserRequest):
    job_ids: list[str] = Field(min_length=1, max_length=1000)
    """Each job at most once."""


# -- operations (served by FastAPI, which sends an answer through its model) ---------------------


class HealthAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: str
