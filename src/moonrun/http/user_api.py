"""The user API (docs/protocol.md, "User API"): Bearer tokens, and only the safe projections leave.

No credentials is 401 `unauthenticated`; a resource that exists but is not the caller's is
403 `forbidden`; a resource that does not exist is 404 `not_found`. Served by
`http/api.py` like the Run API. Each request makes one trip to the user channel's
threads, which checks its credentials and then does the work (`as_caller`): a thread hop is
the largest cost of a small request.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import replace
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from moonrun.artifacts.protocol import NAME_PATTERN, ArtifactInfo, ArtifactStore
from moonrun.errors import ArtifactIncomplete, InvalidRequest, MoonrunError, NotFound
from moonrun.http.api import Call, JsonReply, Route, Stream, error_body
from moonrun.http.platform import HttpPlatform
from moonrun.http.schemas import (
    SEQ_MAX,
    AddAdminRequest,
    CancelJobsRequest,
    CreateEndpointRequest,
    CreateJobRequest,
    CreateJobsRequest,
    CreateServerRequest,
    CreateUserRequest,
    JobRequest,
    SetLabelsRequest,
    SetPasswordRequest,
)
from moonrun.logs.protocol import LogPage
from moonrun.scheduling.jobs import Job
from moonrun.scheduling.kinds import load_advertisement
from moonrun.scheduling.records import Server, User
from moonrun.scheduling.redaction import redacted
from moonrun.scheduling.time import format_instant, parse_instant
from moonrun.scheduling.views import endpoint_view, job_view, server_view, user_view
from moonrun.service.answers import CancelOutcome
from moonrun.service.retention import job_data
from moonrun.service.specs import JobSpec
from moonrun.wire.user import (
    ArtifactsAnswer,
    CancelEntry,
    CancelJobsAnswer,
    CreatedEndpointAnswer,
    CreatedJobsAnswer,
    CreatedUserAnswer,
    EndpointsAnswer,
    EndpointView,
    JobsAnswer,
    JobView,
    KindsAnswer,
    LogLineView,
    LogsAnswer,
    RotatedTokenAnswer,
    ServersAnswer,
    ServerView,
    UsersAnswer,
    UserView,
)

T = TypeVar("T")


async def as_caller(call: Call, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Check the request's credentials and run `work(user, *args, **kwargs)`, together, as the
    user channel runs store work."""
    return await call.channel.run(_as_caller(call, work, args, kwargs))


async def as_caller_on_a_thread(call: Call, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`as_caller` for work that is slow without the store (it hashes a password)."""
    return await call.channel.thread(_as_caller(call, work, args, kwargs))


def _as_caller(
    call: Call, work: Callable[..., T], args: Any, kwargs: dict[str, Any]
) -> Callable[[], T]:
    platform, credentials = call.platform, call.credentials
    assert credentials is not None
    return lambda: work(credentials.check(platform), *args, **kwargs)


# -- query strings -----------------------------------------------------------------------------


class _Query(BaseModel):
    # An unknown parameter is refused, never ignored: a misspelt filter would list everything.
    model_config = ConfigDict(extra="forbid")


INCLUDE_DESCRIPTION = (
    "payload: add the job's payload, as its submitter gave it, with the value of every "
    "credential-looking member shown as [redacted] (docs/protocol.md, Payload)"
)

Include = Literal["payload"]
"""What a job's view may add when asked for: `include=payload` (any other value is 422)."""


class JobsQuery(_Query):
    server_id: str | None = None
    state: str | None = None
    kind: str | None = None
    id_prefix: str | None = None
    limit: int = Field(default=50, ge=1, le=200)
    cursor: str | None = None
    group: str | None = Field(default=None, description="Only the jobs of this fan-out group")
    include: Include | None = Field(default=None, description=INCLUDE_DESCRIPTION)


class ServersQuery(_Query):
    selector: str | None = Field(
        default=None,
        description="Only the servers whose labels, over their endpoint's, match this "
        "label selector (k=v, k!=v, k in (a,b), k notin (a,b), k, !k; a comma is AND)",
    )


class JobReadQuery(_Query):
    wait_s: float | None = Field(default=None, gt=0, le=3600)
    until: Literal["terminal", "logs_complete"] | None = None
    include: Include | None = Field(default=None, description=INCLUDE_DESCRIPTION)


class LogsQuery(_Query):
    after_seq: int = Field(default=-1, ge=-1, le=SEQ_MAX)
    attempt: int | None = Field(default=None, ge=1, le=2**31)
    limit: int = Field(default=1000, ge=1, le=1000)
    tail: int | None = Field(default=None, ge=1, le=1000)


class ArtifactQuery(_Query):
    attempt: int | None = Field(default=None, ge=1, le=2**31)


# -- users -------------------------------------------------------------------------------------


async def whoami(call: Call) -> UserView:
    """The caller: the user its credentials belong to."""
    user = await as_caller(call, lambda user: user)
    return user_view(user)


async def create_user(call: Call) -> CreatedUserAnswer:
    """Create a user (platform admins); the answer carries its API token, once."""
    body: CreateUserRequest = call.body
    created = await as_caller_on_a_thread(
        call,
        call.platform.directory.create_user,
        body.name,
        platform_admin=body.platform_admin,
        password=body.password,
    )
    return {"user": user_view(created.user), "api_token": created.api_token}


async def list_users(call: Call) -> UsersAnswer:
    """Every user (platform admins)."""
    users = await as_caller(call, call.platform.directory.list_users)
    return {"users": [user_view(u) for u in users]}


async def disable_user(call: Call) -> UserView:
    """Disable a user (platform admins): their API tokens and console sessions are refused."""
    directory, user_id = call.platform.directory, call.params["user_id"]
    return user_view(await as_caller(call, directory.set_disabled, user_id, True))


async def enable_user(call: Call) -> UserView:
    """Enable a disabled user again (platform admins)."""
    directory, user_id = call.platform.directory, call.params["user_id"]
    return user_view(await as_caller(call, directory.set_disabled, user_id, False))


async def rotate_token(call: Call) -> RotatedTokenAnswer:
    """A new API token for the user, shown once; their old ones stop working (the user
    themself or a platform admin)."""
    directory, user_id = call.platform.directory, call.params["user_id"]

    def rotate(actor: User) -> tuple[User, str]:
        token = directory.rotate_api_token(actor, user_id)
        user = directory.user_by_id(user_id)
        return user, token

    user, token = await as_caller(call, rotate)
    return {"user": user_view(user), "api_token": token}


async def set_password(call: Call) -> UserView:
    """Set the user's console password (the user themself or a platform admin)."""
    body: SetPasswordRequest = call.body
    directory = call.platform.directory
    user = await as_caller_on_a_thread(
        call, directory.set_password, call.params["user_id"], body.password
    )
    return user_view(user)


# -- servers -----------------------------------------------------------------------------------


async def server_views(call: Call, servers: Sequence[Server]) -> list[ServerView]:
    """The servers as their owners see them, with whether each one's host is online."""
    service = call.platform.service
    online = await call.channel.run(service.endpoints_online, [s.endpoint_id for s in servers])
    return [server_view(server, online[server.endpoint_id]) for server in servers]


async def one_server_view(call: Call, server: Server) -> ServerView:
    return (await server_views(call, [server]))[0]


async def create_server(call: Call) -> ServerView:
    """Create a server on an endpoint, owned by a user (platform admins)."""
    body: CreateServerRequest = call.body
    server = await as_caller(
        call,
        call.platform.directory.create_server,
        body.name,
        endpoint_id=body.endpoint_id,
        owner_id=body.owner_id,
        labels=body.labels,
    )
    return await one_server_view(call, server)


async def list_servers(call: Call) -> ServersAnswer:
    """The servers the caller owns or administers (every server for platform admins), those
    matching `selector` when one is given."""
    query: ServersQuery = call.query
    servers = await as_caller(call, call.platform.directory.list_servers, query.selector)
    return {"servers": await server_views(call, servers)}


async def set_server_labels(call: Call) -> ServerView:
    """Replace the server's labels (its owner, its administrators or a platform admin)."""
    body: SetLabelsRequest = call.body
    directory, server_id = call.platform.directory, call.params["server_id"]
    server = await as_caller(call, directory.set_server_labels, server_id, body.labels)
    return await one_server_view(call, server)


async def get_server(call: Call) -> ServerView:
    """A server the caller owns or administers (any server for platform admins)."""
    server = await as_caller(call, call.platform.directory.get_server, call.params["server_id"])
    return await one_server_view(call, server)


async def add_server_admin(call: Call) -> ServerView:
    """Make a user an administrator of the server (its owner or a platform admin)."""
    body: AddAdminRequest = call.body
    server = await as_caller(
        call, call.platform.directory.add_server_admin, call.params["server_id"], body.user_id
    )
    return await one_server_view(call, server)


async def remove_server_admin(call: Call) -> ServerView:
    """Take a user's administration of the server away (its owner or a platform admin)."""
    server = await as_caller(
        call,
        call.platform.directory.remove_server_admin,
        call.params["server_id"],
        call.params["user_id"],
    )
    return await one_server_view(call, server)


async def remove_server(call: Call) -> ServerView:
    """Remove a server none of whose jobs is still waiting or running (its owner or a
    platform admin); the answer is the server as it was."""
    directory = call.platform.directory
    server = await as_caller(call, directory.remove_server, call.params["server_id"])
    return await one_server_view(call, server)


# -- endpoints ---------------------------------------------------------------------------------


async def list_endpoints(call: Call) -> EndpointsAnswer:
    """Every endpoint with its current session's state (platform admins)."""
    return {"endpoints": await as_caller(call, call.platform.service.endpoint_views)}


async def create_endpoint(call: Call) -> CreatedEndpointAnswer:
    """Create an endpoint; the answer carries its one-time join token, once."""
    body: CreateEndpointRequest = call.body
    platform = call.platform
    enrolled = await as_caller(call, platform.service.create_endpoint, body.name)
    # No Run has registered yet: offline, whatever the bound.
    now = platform.clock.now()
    bound = platform.service.cadence.liveness_bound_ms(now)
    return {
        "endpoint": endpoint_view(enrolled.endpoint, None, now, liveness_bound_ms=bound),
        "join_token": enrolled.join_token,
        "join_token_expires_at": format_instant(enrolled.join_token_expires_at),
    }


async def drain_endpoint(call: Call) -> EndpointView:
    """Grant the endpoint no new claims; its running attempts finish (platform admins)."""
    service, endpoint_id = call.platform.service, call.params["endpoint_id"]
    return await as_caller(call, service.set_draining, endpoint_id, True)


async def undrain_endpoint(call: Call) -> EndpointView:
    """Grant the endpoint claims again (platform admins)."""
    service, endpoint_id = call.platform.service, call.params["endpoint_id"]
    return await as_caller(call, service.set_draining, endpoint_id, False)


async def set_endpoint_labels(call: Call) -> EndpointView:
    """Replace the endpoint's labels, whatever its Run proposed at join (platform admins)."""
    body: SetLabelsRequest = call.body
    service, endpoint_id = call.platform.service, call.params["endpoint_id"]
    return await as_caller(call, service.set_endpoint_labels, endpoint_id, body.labels)


async def remove_endpoint(call: Call) -> EndpointView:
    """Remove an endpoint no server points at, ending its session (platform admins)."""
    service, endpoint_id = call.platform.service, call.params["endpoint_id"]
    return await as_caller(call, service.remove_endpoint, endpoint_id)


# -- jobs --------------------------------------------------------------------------------------


def job_spec(body: JobRequest) -> JobSpec:
    """The job a create (or a fan-out) asks for, as a value."""
    backoff = None if body.backoff is None else body.backoff.model_dump(exclude_none=True)
    not_before = None if body.not_before is None else parse_instant(body.not_before, "not_before")
    concurrency = None if body.concurrency is None else body.concurrency.model_dump()
    spec = JobSpec(
        kind=body.kind,
        payload=body.payload,
        max_attempts=body.max_attempts,
        backoff=backoff,
        not_before=not_before,
        concurrency=concurrency,
        priority=body.priority,
    )
    if isinstance(body, CreateJobRequest):
        spec = replace(spec, after=tuple(body.after or ()), after_group=body.after_group)
    return spec


def logs_complete(platform: HttpPlatform, job: Job) -> bool:
    """Whether the job's latest attempt has all its log lines in."""
    return platform.service.logs_complete(job, None, platform.logs.complete)


def view(platform: HttpPlatform, job: Job) -> JobView:
    return job_view(job, logs_complete=logs_complete(platform, job))


async def with_payloads(call: Call, views: Sequence[JobView], jobs: Sequence[Job]) -> None:
    """Add each job's payload, redacted, to its view (`include=payload`). On one of the
    channel's threads: redacting a page of 200 payloads of up to 64 KiB each is CPU work
    (milliseconds each) that the event loop, which serves Run's heartbeats, should not wait
    on."""
    shown = await call.channel.thread(lambda: [redacted(job.payload()) for job in jobs])
    for one, payload in zip(views, shown, strict=True):
        one["payload"] = payload


def etag(job: Job, complete: bool) -> str:
    """The job's entity tag: it changes whenever the job does, and when its logs complete."""
    return f'"{job.version}.logs"' if complete else f'"{job.version}"'


def job_reply(platform: HttpPlatform, job: Job, status: int = 200) -> JsonReply[JobView]:
    """The job's view, with its ETag."""
    complete = logs_complete(platform, job)
    return JsonReply(status, job_view(job, logs_complete=complete), {"ETag": etag(job, complete)})


async def read_reply(call: Call, job: Job, payload: bool) -> JsonReply[JobView]:
    """A read's answer: the job's view, with its payload when asked for. A payload never
    changes, so the ETag is the same with or without it (the two are different URLs)."""
    reply = job_reply(call.platform, job)
    if payload:
        await with_payloads(call, [reply.content], [job])
    return reply


async def create_job(call: Call) -> JsonReply[JobView]:
    """Queue a job. The same Idempotency-Key with the same body gives the same job."""
    body: CreateJobRequest = call.body
    service = call.platform.service
    key = call.headers.get("idempotency-key")

    def create(user: User) -> Job:
        spec = job_spec(body)
        return service.create_job(
            user,
            call.params["server_id"],
            kind=spec.kind,
            payload=spec.payload,
            max_attempts=spec.max_attempts,
            backoff=spec.backoff,
            not_before=spec.not_before,
            idempotency_key=key,
            concurrency=spec.concurrency,
            after=spec.after,
            after_group=spec.after_group,
            priority=spec.priority,
        )

    return job_reply(call.platform, await as_caller(call, create), 201)


async def create_jobs(call: Call) -> CreatedJobsAnswer:
    """Queue up to 1,000 jobs at once, all or none. An Idempotency-Key covers the batch: the
    same key with the same batch gives the same jobs."""
    body: CreateJobsRequest = call.body
    service = call.platform.service
    key = call.headers.get("idempotency-key")

    def create(user: User) -> list[Job]:
        specs = [job_spec(job) for job in body.jobs]
        return service.create_jobs(user, call.params["server_id"], specs, idempotency_key=key)

    jobs = await as_caller(call, create)
    return {"jobs": [view(call.platform, job) for job in jobs]}


async def list_jobs(call: Call) -> JobsAnswer:
    """The jobs the caller may see, newest first, a page at a time (with `include=payload`,
    each with its payload, credential-looking members redacted)."""
    query: JobsQuery = call.query
    page = await as_caller(
        call,
        call.platform.service.list_jobs,
        server_id=query.server_id,
        state=query.state,
        limit=query.limit,
        cursor=query.cursor,
        kind=query.kind,
        id_prefix=query.id_prefix,
        group_id=query.group,
    )
    views = [view(call.platform, job) for job in page.jobs]
    if query.include == "payload":
        await with_payloads(call, views, page.jobs)
    return {"jobs": views, "next_cursor": page.next_cursor}


async def rerun_job(call: Call) -> JsonReply[JobView]:
    """Queue a new job like a finished one (same server, kind, payload and retry policy);
    the same Idempotency-Key gives the same new job."""
    service, key = call.platform.service, call.headers.get("idempotency-key")
    job = await as_caller(call, service.rerun_job, call.params["job_id"], idempotency_key=key)
    return job_reply(call.platform, job, 201)


async def server_kinds(call: Call) -> KindsAnswer:
    """The kinds the server's Run advertised, with each payload's JSON Schema."""
    advertisement = await as_caller(
        call, call.platform.service.server_kinds, call.params["server_id"]
    )
    if advertisement is None:
        return {"advertised": False, "advertised_at": None, "kinds": []}
    kinds = load_advertisement(advertisement.kinds_json)
    return {
        "advertised": True,
        "advertised_at": format_instant(advertisement.advertised_at),
        "kinds": [{"kind": kind, "payload_schema": kinds[kind]} for kind in sorted(kinds)],
    }


async def get_job(call: Call) -> JsonReply[JobView] | JsonReply[None]:
    """The job (its ETag changes whenever it does). A blocking read: with `wait_s`, answer as
    soon as the job is no longer the one `If-None-Match` names (304 if it still is when the
    wait ends), or with `until=terminal`, once it has ended, or with `until=logs_complete`,
    once it has ended and its last attempt's logs are all in (the current job when the wait
    ends first). With `include=payload`, the view carries the job's payload, credential-looking
    members redacted."""
    platform, query = call.platform, call.query
    service, job_id = platform.service, call.params["job_id"]
    if_none_match = call.headers.get("if-none-match")
    payload = query.include == "payload"
    if query.wait_s is None or (query.until is None and if_none_match is None):
        job = await as_caller(call, service.get_job, job_id)  # 401, 403 and 404 come first
        if query.wait_s is not None:
            raise InvalidRequest("wait_s needs an If-None-Match header or until=terminal")
        return await read_reply(call, job, payload)

    def settled(job: Job) -> bool:
        if query.until == "terminal":
            return job.state.is_terminal
        if query.until == "logs_complete":
            return job.state.is_terminal and logs_complete(platform, job)
        return etag(job, logs_complete(platform, job)) != if_none_match

    credentials = call.credentials
    assert credentials is not None
    job = await service.wait_for_job(
        lambda: credentials.check(platform),
        job_id,
        settled,
        wait_s=min(query.wait_s, platform.http.max_read_wait_s),
        waiting=call.waiting(),
    )
    if query.until is None and not settled(job):
        return JsonReply(304, None, {"ETag": etag(job, logs_complete(platform, job))})
    return await read_reply(call, job, payload)


async def delete_job(call: Call) -> JobView:
    """Delete a finished job now, with its attempts, logs, artifacts and idempotency record;
    the answer is the job as it was. A job the caller may not manage is 404, as if it did not
    exist; one that has not ended is 409 `job_not_finished`."""
    platform = call.platform
    forget = job_data(platform.logs, platform.artifacts)
    # On a thread: it deletes the job's files.
    job = await as_caller_on_a_thread(
        call, platform.service.delete_job, call.params["job_id"], forget
    )
    return job_view(job)


async def cancel_job(call: Call) -> JsonReply[JobView]:
    """Cancel: waiting jobs end at once (200); running ones get a durable intent (202)."""
    outcome = await as_caller(call, call.platform.service.cancel_job, call.params["job_id"])
    return JsonReply(202 if outcome.waits_on_run else 200, view(call.platform, outcome.job))


async def cancel_jobs(call: Call) -> CancelJobsAnswer:
    """Cancel several jobs in one request and one commit: each answered in order as its own
    cancel would be (its status, and its JobView or its refusal)."""
    body: CancelJobsRequest = call.body
    outcomes = await as_caller(call, call.platform.service.cancel_jobs, body.job_ids)
    return {
        "answers": [
            _cancel_entry(call.platform, *pair) for pair in zip(body.job_ids, outcomes, strict=True)
        ]
    }


def _cancel_entry(
    platform: HttpPlatform, job_id: str, outcome: CancelOutcome | MoonrunError
) -> CancelEntry:
    if isinstance(outcome, MoonrunError):
        return {"job_id": job_id, "status": outcome.status, "error": error_body(outcome)["error"]}
    status = 202 if outcome.waits_on_run else 200
    return {"job_id": job_id, "status": status, "answer": view(platform, outcome.job)}


async def job_logs(call: Call) -> LogsAnswer:
    """A page of log lines of one attempt (the latest with logs unless `attempt` is given):
    whole batches after `after_seq`, or with `tail` the newest lines."""
    platform, query = call.platform, call.query
    job_id, logs = call.params["job_id"], platform.logs

    def read(user: User) -> tuple[LogPage, bool]:
        job = platform.service.get_job(user, job_id)
        attempt = query.attempt
        if attempt is None:
            attempts = logs.attempts(job_id)
            attempt = attempts[-1] if attempts else None
        # Complete: the attempt's (or, with no attempt that has lines, the job's latest)
        complete = platform.service.logs_complete(job, attempt, logs.complete)
        if attempt is None:
            return LogPage(None, [], query.after_seq, False), complete
        if query.tail is not None:
            return logs.tail(job_id, attempt, query.tail, query.after_seq), complete
        return logs.read(job_id, attempt, query.after_seq, query.limit), complete

    page, complete = await as_caller(call, read)
    attempt = page.attempt
    lines: list[LogLineView] = (
        []
        if attempt is None  # (then there are none)
        else [
            {"attempt": attempt, "seq": ln.seq, "ts": ln.ts, "stream": ln.stream, "text": ln.text}
            for ln in page.lines
        ]
    )
    return {
        "attempt": attempt,
        "lines": lines,
        "next_after_seq": page.next_after_seq,
        "more": page.more,
        "dropped_lines": page.dropped_lines,
        "dropped_bytes": page.dropped_bytes,
        "logs_complete": complete,
    }


# -- artifacts ---------------------------------------------------------------------------------


async def job_artifacts(call: Call) -> ArtifactsAnswer:
    """The job's artifacts, every attempt's, and whether each is complete (downloadable)."""
    platform, job_id = call.platform, call.params["job_id"]

    def read(user: User) -> list[ArtifactInfo]:
        platform.service.get_job(user, job_id)
        return platform.artifacts.artifacts(job_id)

    found = await as_caller(call, read)
    return {
        "artifacts": [
            {"attempt": a.attempt, "name": a.name, "size": a.size, "complete": a.complete}
            for a in found
        ]
    }


def artifact_etag(info: ArtifactInfo) -> str:
    """The artifact's entity tag: a complete artifact never changes (its chunks are written
    once), so its attempt, name, size and chunk count name its bytes."""
    return f'"{info.attempt}-{info.name}-{info.size}-{info.chunks}"'


_RANGE = re.compile(r"^bytes=([0-9]*)-([0-9]*)$")
PAST_ANY_END = 1 << 64
"""What a byte position of more than 19 digits stands for: beyond any artifact's size."""


def _position(digits: str) -> int:
    """A byte position of any length, read without `int()` refusing one of more than 4,300
    digits: a longer one lies past the end of any artifact, and is one."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 19 else PAST_ANY_END


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The one range `bytes=a-b` (or `a-`, or `-n`) asks for, inclusive and within `size`;
    None (the whole artifact) for no header, several ranges or one that cannot be met.

    As RFC 9110 (14.1.2) reads them: a last position past the end means the end, and a suffix
    longer than the artifact the whole of it, however many digits either has.
    """
    match = _RANGE.match(header.strip()) if header else None
    if match is None or size == 0:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:
        start, end = max(size - _position(last), 0), size - 1
    else:
        start = _position(first)
        end = min(_position(last), size - 1) if last else size - 1
    return (start, end) if start <= end and start < size else None


async def _parts(
    store: ArtifactStore, call: Call, job_id: str, info: ArtifactInfo, start: int, end: int
) -> AsyncGenerator[bytes, None]:
    """Bytes `start` to `end` (inclusive), a chunk at a time, read on the artifacts channel's
    threads (a slow artifact disk holds none of the user channel's)."""
    threads = call.platform.channels.artifacts
    offset = 0
    for index, length in enumerate(info.chunk_sizes):
        if offset + length > start and offset <= end:
            data = await threads.thread(store.read_chunk, job_id, info.attempt, info.name, index)
            yield data[max(start - offset, 0) : end - offset + 1]
        offset += length


async def download_artifact(call: Call) -> JsonReply[None] | Stream:
    """The artifact's bytes (of the latest attempt that has it, unless `attempt` is given),
    streamed a chunk at a time. `If-None-Match` with its ETag is 304; one `Range: bytes=a-b`
    is 206. An artifact whose final chunk has not arrived is 409 `artifact_incomplete`."""
    platform, query = call.platform, call.query
    job_id, name = call.params["job_id"], call.params["name"]
    if not NAME_PATTERN.match(name):
        raise InvalidRequest("artifact name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

    def read(user: User) -> list[ArtifactInfo]:
        platform.service.get_job(user, job_id)
        return platform.artifacts.artifacts(job_id)

    found = [
        a
        for a in await as_caller(call, read)
        if a.name == name and query.attempt in (None, a.attempt)
    ]
    if not found:
        raise NotFound(f"job {job_id} has no artifact {name}")
    info = found[-1]
    if not info.complete:
        raise ArtifactIncomplete(f"artifact {name} of attempt {info.attempt} is not complete")
    tag = artifact_etag(info)
    headers = {
        "ETag": tag,
        "Accept-Ranges": "bytes",
        "Content-Disposition": f'attachment; filename="{name}"',
    }
    if call.headers.get("if-none-match") == tag:
        return JsonReply(304, None, headers)
    wanted = byte_range(call.headers.get("range"), info.size)
    status, (start, end) = 200, (0, info.size - 1)
    if wanted is not None:
        status, (start, end) = 206, wanted
        headers["Content-Range"] = f"bytes {start}-{end}/{info.size}"
    parts = _parts(platform.artifacts, call, job_id, info, start, end)
    return Stream(status, end - start + 1, parts, headers)


IDEMPOTENCY = ("Idempotency-Key",)

ROUTES: tuple[Route, ...] = (
    Route(
        method="GET", path="/api/v1/me", channel="user", auth="user", answer=UserView, status=200,
        handler=whoami,
    ),
    Route(
        method="POST", path="/api/v1/users", channel="user", auth="user", body=CreateUserRequest,
        answer=CreatedUserAnswer, status=201, handler=create_user, no_store=True,
    ),
    Route(
        method="GET", path="/api/v1/users", channel="user", auth="user", answer=UsersAnswer,
        status=200, handler=list_users,
    ),
    Route(
        method="POST", path="/api/v1/users/{user_id}/disable", channel="user", auth="user",
        answer=UserView, status=200, handler=disable_user,
    ),
    Route(
        method="POST", path="/api/v1/users/{user_id}/enable", channel="user", auth="user",
        answer=UserView, status=200, handler=enable_user,
    ),
    Route(
        method="POST", path="/api/v1/users/{user_id}/token", channel="user", auth="user",
        answer=RotatedTokenAnswer, status=200, handler=rotate_token, no_store=True,
    ),
    Route(
        method="PUT", path="/api/v1/users/{user_id}/password", channel="user", auth="user",
        body=SetPasswordRequest, answer=UserView, status=200, handler=set_password,
    ),
    Route(
        method="POST", path="/api/v1/servers", channel="user", auth="user",
        body=CreateServerRequest, answer=ServerView, status=201, handler=create_server,
    ),
    Route(
        method="GET", path="/api/v1/servers", channel="user", auth="user", answer=ServersAnswer,
        status=200, handler=list_servers, query=ServersQuery,
    ),
    Route(
        method="GET", path="/api/v1/servers/{server_id}", channel="user", auth="user",
        answer=ServerView, status=200, handler=get_server,
    ),
    Route(
        method="DELETE", path="/api/v1/servers/{server_id}", channel="user", auth="user",
        answer=ServerView, status=200, handler=remove_server,
    ),
    Route(
        method="PUT", path="/api/v1/servers/{server_id}/labels", channel="user", auth="user",
        body=SetLabelsRequest, answer=ServerView, status=200, handler=set_server_labels,
    ),
    Route(
        method="POST", path="/api/v1/servers/{server_id}/admins", channel="user", auth="user",
        body=AddAdminRequest, answer=ServerView, status=200, handler=add_server_admin,
    ),
    Route(
        method="DELETE", path="/api/v1/servers/{server_id}/admins/{user_id}", channel="user",
        auth="user", answer=ServerView, status=200, handler=remove_server_admin,
    ),
    Route(
        method="GET", path="/api/v1/endpoints", channel="user", auth="user", answer=EndpointsAnswer,
        status=200, handler=list_endpoints,
    ),
    Route(
        method="POST", path="/api/v1/endpoints", channel="user", auth="user",
        body=CreateEndpointRequest, answer=CreatedEndpointAnswer, status=201,
        handler=create_endpoint, no_store=True,
    ),
    Route(
        method="POST", path="/api/v1/endpoints/{endpoint_id}/drain", channel="user", auth="user",
        answer=EndpointView, status=200, handler=drain_endpoint,
    ),
    Route(
        method="POST", path="/api/v1/endpoints/{endpoint_id}/undrain", channel="user", auth="user",
        answer=EndpointView, status=200, handler=undrain_endpoint,
    ),
    Route(
        method="PUT", path="/api/v1/endpoints/{endpoint_id}/labels", channel="user", auth="user",
        body=SetLabelsRequest, answer=EndpointView, status=200, handler=set_endpoint_labels,
    ),
    Route(
        method="DELETE", path="/api/v1/endpoints/{endpoint_id}", channel="user", auth="user",
        answer=EndpointView, status=200, handler=remove_endpoint,
    ),
    Route(
        method="POST", path="/api/v1/servers/{server_id}/jobs", channel="user", auth="user",
        body=CreateJobRequest, answer=JobView, status=201, handler=create_job, headers=IDEMPOTENCY,
    ),
    Route(
        method="POST", path="/api/v1/servers/{server_id}/jobs/batch", channel="user", auth="user",
        body=CreateJobsRequest, answer=CreatedJobsAnswer, status=201, handler=create_jobs,
        headers=IDEMPOTENCY,
    ),
    Route(
        method="GET", path="/api/v1/servers/{server_id}/kinds", channel="user", auth="user",
        answer=KindsAnswer, status=200, handler=server_kinds,
    ),
    Route(
        method="GET", path="/api/v1/jobs", channel="user", auth="user", answer=JobsAnswer,
        status=200, handler=list_jobs, query=JobsQuery,
    ),
    Route(
        method="POST", path="/api/v1/jobs/{job_id}/rerun", channel="user", auth="user",
        answer=JobView, status=201, handler=rerun_job, headers=IDEMPOTENCY,
    ),
    Route(
        method="GET", path="/api/v1/jobs/{job_id}", channel="user", auth="user", answer=JobView,
        status=200, handler=get_job, query=JobReadQuery, headers=("If-None-Match",),
        also={304: (None, "Not modified: the job still has the If-None-Match tag")},
    ),
    Route(
        method="DELETE", path="/api/v1/jobs/{job_id}", channel="user", auth="user",
        answer=JobView, status=200, handler=delete_job,
    ),
    Route(
        method="POST", path="/api/v1/jobs/cancel", channel="user", auth="user",
        body=CancelJobsRequest, answer=CancelJobsAnswer, status=200, handler=cancel_jobs,
    ),
    Route(
        method="POST", path="/api/v1/jobs/{job_id}/cancel", channel="user", auth="user",
        answer=JobView, status=200, handler=cancel_job,
        also={202: (JobView, "Cancel intent waits on Run")},
    ),
    Route(
        method="GET", path="/api/v1/jobs/{job_id}/logs", channel="user", auth="user",
        answer=LogsAnswer, status=200, handler=job_logs, query=LogsQuery,
    ),
    Route(
        method="GET", path="/api/v1/jobs/{job_id}/artifacts", channel="user", auth="user",
        answer=ArtifactsAnswer, status=200, handler=job_artifacts,
    ),
    Route(
        method="GET", path="/api/v1/jobs/{job_id}/artifacts/{name}", channel="user", auth="user",
        answer=None, status=200, handler=download_artifact, query=ArtifactQuery,
        headers=("If-None-Match", "Range"),
        also={
            206: (None, "The one byte range Range asked for"),
            304: (None, "Not modified: the artifact still has the If-None-Match tag"),
        },
    ),
)  # fmt: skip
"""Every user route, in matching order."""
