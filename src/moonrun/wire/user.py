"""The user API's answers (docs/protocol.md, "User API"): the views of records, and the
answers that carry them.

`scheduling/views.py` decides, field by field, what of a record goes into its view; this
module only declares the shapes. Instants are RFC 3339 strings.
"""

from __future__ import annotations

from typing import Any, NotRequired

from typing_extensions import TypedDict

from moonrun.wire.error_body import ErrorDetail

# -- views ---------------------------------------------------------------------------------------


class LastFailureView(TypedDict):
    reason: str
    code: str | None
    attempt: int
    at: str
    message: str | None


class RetryView(TypedDict):
    next_eligible_at: str | None
    initial_s: float
    multiplier: float
    max_s: float
    last_failure: LastFailureView | None


class ProgressView(TypedDict):
    seq: int
    percent: float | None
    message: str | None
    at: str


class CancelView(TypedDict):
    requested: bool
    requested_at: str | None
    result: str | None
    resolved_at: str | None


class TerminalErrorView(TypedDict):
    code: str
    message: str


class TerminalView(TypedDict):
    outcome: str
    attempt: int
    at: str
    error: TerminalErrorView | None
    result: Any
    """What the ending attempt's handler returned (docs/kinds.md, "Results"): for `command`
    its `exit_code`, `signal`, `duration_s`, `stdout_bytes` and `stderr_bytes`; null when the
    platform ended the job (cancelled before a claim, a lease that expired) or the Run said
    nothing."""


class ReconcileView(TypedDict):
    outcome: str | None
    at: str | None


class PastAttemptView(TypedDict):
    attempt: int
    claimed_at: str | None
    ended_at: str
    outcome: str
    code: str | None


class JobGroupView(TypedDict):
    """The fan-out group a job belongs to (docs/protocol.md, "Groups")."""

    id: str
    held: bool
    """Queued but not claimable yet: its group has `max_parallel` jobs under way, and one of
    them must end first."""


class JobConcurrencyView(TypedDict):
    """A job's concurrency key (docs/protocol.md, "Concurrency keys")."""

    key: str
    limit: int
    held: bool
    """Queued but not claimable yet: its owner has `limit` jobs with the key under way, and
    one of them must end first (or its group holds it still)."""


class WaitingForView(TypedDict):
    """What a job held on its dependencies waits on (docs/protocol.md, "Dependencies")."""

    jobs: list[str]
    """The jobs it named (`after`), each to succeed; those that did already are listed too."""
    group: str | None
    """The group it named (`after_group`), every job of which is to succeed."""


class JobScheduleView(TypedDict):
    """The schedule firing that made a job."""

    id: str
    scheduled_for: str
    """The calendar time it fired for (or the time of a trigger)."""


class JobView(TypedDict):
    """A job as users see it: its scheduling status, never the platform's credentials; its
    payload only when asked for."""

    id: str
    server_id: str
    kind: str
    state: str
    attempt: int
    max_attempts: int
    created_at: str
    updated_at: str
    retry: RetryView
    progress: ProgressView | None
    cancel: CancelView
    terminal: TerminalView | None
    reconcile: ReconcileView
    history: list[PastAttemptView]
    group: JobGroupView | None
    """The fan-out group that made it, if one did."""
    logs_complete: bool
    """The latest attempt's log lines are all in: it ended and its Run sent its last batch, or
    the transfer grace after its end passed (docs/protocol.md, "Reading logs")."""
    schedule: JobScheduleView | None
    """The schedule whose firing made the job, if one did."""
    concurrency: JobConcurrencyView | None
    """Its concurrency key, if it carries one."""
    waiting_for: WaitingForView | None
    """While it is held on its dependencies, what it waits on; else null. A job whose
    dependency did not succeed ends `cancelled`, its terminal error `dependency_failed`."""
    priority: int
    """0 to 9, 5 by default: among its endpoint's claimable jobs a higher one goes first."""
    payload: NotRequired[dict[str, Any]]
    """Only with `include=payload`: the payload its submitter gave, each credential-looking
    member's value (`token`, `password`, `api_key`, ...: docs/protocol.md, "Payload") shown as
    "[redacted]"."""


class EndpointView(TypedDict):
    id: str
    name: str
    online: bool
    generation: int
    last_seen_at: str | None
    capacity: int | None
    run_version: str | None
    draining: bool
    """No new claims are granted to it (docs/protocol.md, "Endpoints")."""
    labels: dict[str, str]
    """Set by platform admins, or proposed by its Run at join (docs/protocol.md, "Labels")."""


class ServerView(TypedDict):
    id: str
    name: str
    endpoint_id: str
    owner_id: str
    admin_ids: list[str]
    created_at: str
    endpoint_online: bool
    """Whether the Run of the server's endpoint holds a live session now."""
    labels: dict[str, str]
    """The server's own labels; selectors match them over its endpoint's (docs/protocol.md,
    "Labels")."""


class GroupCountsView(TypedDict):
    """How many of a group's jobs are in each state."""

    queued: int
    accepted: int
    running: int
    retrying: int
    succeeded: int
    failed: int
    cancelled: int


class GroupView(TypedDict):
    """A fan-out group (docs/protocol.md, "Groups"): what made it and where its jobs are."""

    id: str
    creator_id: str
    selector: str
    kind: str
    created_at: str
    job_count: int
    max_parallel: int | None
    stop_on_failure: bool
    counts: GroupCountsView
    done: bool
    """Every job of the group has ended."""


class BackoffAsked(TypedDict):
    """The backoff a create asked for (the fields it gave)."""

    initial_s: NotRequired[float]
    multiplier: NotRequired[float]
    max_s: NotRequired[float]


class ScheduleConcurrencyView(TypedDict):
    """The concurrency key a schedule's jobs carry (docs/protocol.md, "Concurrency keys")."""

    key: str
    limit: int


class ScheduleJobView(TypedDict):
    """What each firing creates, without the payload (each job a firing makes shows its own on
    request: `include=payload`)."""

    kind: str
    max_attempts: int | None
    backoff: BackoffAsked | None
    priority: int
    """Its jobs' priority, 5 unless the schedule named one."""
    concurrency: ScheduleConcurrencyView | None
    """Its jobs' concurrency key and limit, if it names one."""


class LastFiringView(TypedDict):
    scheduled_for: str
    job_id: str | None
    """The job it made; None for a selector schedule's firing (it made a group)."""
    job_state: str | None
    """None once the job is gone (deleted by retention), and for a selector firing."""
    group_id: str | None
    """The group a selector schedule's firing made; None when nothing matched (and for a
    server's schedule)."""
    group_done: bool | None
    """Every job of that group has ended; None without a group, or once its jobs are gone."""


class ScheduleView(TypedDict):
    id: str
    server_id: str | None
    """The server each firing makes a job on; None for a selector schedule."""
    selector: str | None
    """The label selector each firing fans out over (a group per firing); None for a server's
    schedule."""
    max_parallel: int | None
    """A selector schedule's groups' `max_parallel`."""
    stop_on_failure: bool
    """A selector schedule's groups' `stop_on_failure`."""
    name: str
    cron: str
    timezone: str
    job: ScheduleJobView
    overlap: str
    catchup_window_s: int
    paused: bool
    owner_disabled: bool
    """The server's owner is disabled: no time fires (each is counted missed) until enabled."""
    next_times: list[str]
    """The next 5 calendar times that may fire (RFC 3339, UTC)."""
    last_firing: LastFiringView | None
    skipped: int
    """Times not fired because the previous firing's job had not ended (`overlap: skip`)."""
    missed: int
    """Times not fired because no platform was up, the schedule was paused, the owner was
    disabled, or the job could not be made; at most one catch-up firing comes after a gap."""
    unmatched: int
    """A selector schedule's firings whose selector matched no server (no group made)."""
    created_at: str


class UserView(TypedDict):
    id: str
    name: str
    platform_admin: bool
    created_at: str
    disabled: bool
    """Its API tokens and console sessions are refused (docs/protocol.md, "Users and access")."""


# -- answers -------------------------------------------------------------------------------------


class CreatedUserAnswer(TypedDict):
    user: UserView
    api_token: str
    """Shown once."""


class RotatedTokenAnswer(TypedDict):
    user: UserView
    api_token: str
    """The user's only API token from now, shown once."""


class UsersAnswer(TypedDict):
    users: list[UserView]


class SchedulesAnswer(TypedDict):
    schedules: list[ScheduleView]


class TriggeredAnswer(TypedDict):
    schedule: ScheduleView
    job_id: str | None
    """The job the trigger made; None when the overlap policy skipped it (and for a selector
    schedule)."""
    group_id: str | None
    """The group a selector schedule's trigger made; None when skipped or nothing matched."""


class ServersAnswer(TypedDict):
    servers: list[ServerView]


class GroupsAnswer(TypedDict):
    groups: list[GroupView]
    """The caller's own groups, newest first."""


class AdvertisedKind(TypedDict):
    kind: str
    payload_schema: Any
    """The JSON Schema the server's Run checks this kind's payloads with (docs/kinds.md)."""


class KindsAnswer(TypedDict):
    advertised: bool
    """Whether the server's Run advertised its kinds; when not (an older Run, or one that
    never registered), every kind is accepted at submit and checked only on the host."""
    advertised_at: str | None
    kinds: list[AdvertisedKind]


class EndpointsAnswer(TypedDict):
    endpoints: list[EndpointView]


class CreatedEndpointAnswer(TypedDict):
    endpoint: EndpointView
    join_token: str
    """Shown once."""
    join_token_expires_at: str


class CreatedJobsAnswer(TypedDict):
    jobs: list[JobView]


class FanoutAnswer(TypedDict):
    group: GroupView
    jobs: list[JobView]
    """One per matching server, in the order held jobs are released."""


class JobsAnswer(TypedDict):
    jobs: list[JobView]
    next_cursor: str | None


class CancelEntry(TypedDict):
    """One job of a bulk cancel: what its own cancel would have answered."""

    job_id: str
    status: int
    """200, 202 (the intent waits on Run), or the refusal's status."""
    answer: NotRequired[JobView]
    """When `status` is 200 or 202."""
    error: NotRequired[ErrorDetail]
    """When it is not."""


class CancelJobsAnswer(TypedDict):
    answers: list[CancelEntry]
    """One per job, in the request's order."""


class LogLineView(TypedDict):
    attempt: int
    seq: int
    ts: str
    stream: str
    text: str


class LogsAnswer(TypedDict):
    attempt: int | None
    lines: list[LogLineView]
    next_after_seq: int
    """Pass as `after_seq` for the next page (or, after a tail, for newer lines)."""
    more: bool
    """This page left lines after `next_after_seq` off."""
    dropped_lines: int
    """Lines of the attempt the platform dropped for its bounds (docs/protocol.md, "Log bounds")."""
    dropped_bytes: int
    logs_complete: bool
    """This attempt's lines are all in: no line after this page will ever come."""


class ArtifactView(TypedDict):
    attempt: int
    name: str
    size: int
    """The bytes stored so far (all of them once complete)."""
    complete: bool
    """Its final chunk has arrived: it can be downloaded."""


class ArtifactsAnswer(TypedDict):
    artifacts: list[ArtifactView]
    """Every attempt's artifacts, by attempt then name."""
