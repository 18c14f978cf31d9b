"""The user API (PROTOCOL.md section 6): Bearer tokens, and only the safe projections leave.

No credentials is 401 `unauthenticated`; a resource that exists but is not the caller's is
403 `forbidden`; a resource that does not exist is 404 `not_found`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, Response

from moonrun.errors import Forbidden, InvalidRequest, Unauthenticated
from moonrun.platform.http import (
    ERROR_RESPONSES,
    Platform,
    json_answer,
    on_user_channel,
    platform_of,
)
from moonrun.platform.schemas import (
    AddAdminRequest,
    CreatedEndpointAnswer,
    CreatedJobsAnswer,
    CreatedUserAnswer,
    CreateEndpointRequest,
    CreateJobRequest,
    CreateJobsRequest,
    CreateServerRequest,
    CreateUserRequest,
    EndpointsAnswer,
    JobsAnswer,
    JobViewModel,
    LogsAnswer,
    ServerModel,
    ServersAnswer,
    UsersAnswer,
)
from moonrun.platform.service import JobSpec
from moonrun.platform.watch import wait_for
from moonrun.platform.web.sessions import SESSION_COOKIE
from moonrun.scheduling.jobs import Job
from moonrun.scheduling.records import User
from moonrun.scheduling.time import format_instant, parse_instant
from moonrun.scheduling.views import endpoint_view, job_view, server_view, user_view

T = TypeVar("T")

router = APIRouter(prefix="/api/v1", tags=["users"], responses=ERROR_RESPONSES)


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a user request presents, not checked yet: an API token, or the console's cookie
    (then a write also needs the session's X-CSRF-Token header)."""

    token: str | None
    cookie: str | None
    write: bool
    csrf: str | None

    @classmethod
    def of(cls, request: Request) -> Credentials:
        return cls(
            bearer_token(request),
            request.cookies.get(SESSION_COOKIE),
            request.method not in ("GET", "HEAD"),
            request.headers.get("x-csrf-token"),
        )

    def check(self, platform: Platform) -> User:
        """The user these credentials belong to (blocking: it reads the store)."""
        if self.token is not None:
            return platform.directory.authenticate(self.token)
        found = platform.web.user(self.cookie) if self.cookie else None
        if found is None:
            raise Unauthenticated("send Authorization: Bearer <api token>")
        if self.write and not platform.web.csrf_ok(self.cookie, self.csrf):
            raise Forbidden("a cookie-authenticated write needs the X-CSRF-Token header")
        return found


async def current_user(request: Request) -> AsyncIterator[Credentials]:
    """The caller's credentials, admitted to the user channel; `as_caller` checks them on the
    same trip to the channel's threads as the work they authorise."""
    async with platform_of(request).channels.user.admit() as admission:
        request.state.admission = admission
        credentials = Credentials.of(request)
        if credentials.token is None and credentials.cookie is None:
            raise Unauthenticated("send Authorization: Bearer <api token>")
        request.state.credentials = credentials
        yield credentials


async def as_caller(request: Request, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Check the request's credentials and run `work(user, *args, **kwargs)`, in one trip to
    the user channel (each trip is a thread hop, the largest cost of a small request)."""
    platform = platform_of(request)
    credentials: Credentials = request.state.credentials

    def run() -> T:
        user = credentials.check(platform)
        request.state.user = user
        return work(user, *args, **kwargs)

    return await platform.channels.user.run(run)


async def authenticate(request: Request, platform: Platform) -> User:
    """Check the request's credentials on their own (for errors raised before the route)."""
    return await platform.channels.user.run(Credentials.of(request).check, platform)


Caller = Annotated[Credentials, Depends(current_user)]


# -- users -------------------------------------------------------------------------------------


@router.post("/users", status_code=201, response_model=CreatedUserAnswer)
async def create_user(body: CreateUserRequest, request: Request, caller: Caller) -> dict[str, Any]:
    """Create a user (platform admins); the answer carries its API token, once."""
    directory = platform_of(request).directory
    created = await as_caller(
        request,
        directory.create_user,
        body.name,
        platform_admin=body.platform_admin,
        password=body.password,
    )
    return {"user": user_view(created.user), "api_token": created.api_token}


@router.get("/users", response_model=UsersAnswer)
async def list_users(request: Request, caller: Caller) -> dict[str, Any]:
    """Every user (platform admins)."""
    users = await as_caller(request, platform_of(request).directory.list_users)
    return {"users": [user_view(u) for u in users]}


# -- servers -----------------------------------------------------------------------------------


@router.post("/servers", status_code=201, response_model=ServerModel)
async def create_server(
    body: CreateServerRequest, request: Request, caller: Caller
) -> dict[str, Any]:
    """Create a server on an endpoint, owned by a user (platform admins)."""
    server = await as_caller(
        request,
        platform_of(request).directory.create_server,
        body.name,
        endpoint_id=body.endpoint_id,
        owner_id=body.owner_id,
    )
    return dict(server_view(server))


@router.get("/servers", response_model=ServersAnswer)
async def list_servers(request: Request, caller: Caller) -> dict[str, Any]:
    """The servers the caller owns or administers (every server for platform admins)."""
    servers = await as_caller(request, platform_of(request).directory.list_servers)
    return {"servers": [server_view(server) for server in servers]}


@router.get("/servers/{server_id}", response_model=ServerModel)
async def get_server(server_id: str, request: Request, caller: Caller) -> dict[str, Any]:
    server = await as_caller(request, platform_of(request).directory.get_server, server_id)
    return dict(server_view(server))


@router.post("/servers/{server_id}/admins", response_model=ServerModel)
async def add_server_admin(
    server_id: str, body: AddAdminRequest, request: Request, caller: Caller
) -> dict[str, Any]:
    """Make a user an administrator of the server (its owner or a platform admin)."""
    server = await as_caller(
        request, platform_of(request).directory.add_server_admin, server_id, body.user_id
    )
    return dict(server_view(server))


# -- endpoints ---------------------------------------------------------------------------------


@router.get("/endpoints", response_model=EndpointsAnswer)
async def list_endpoints(request: Request, caller: Caller) -> dict[str, Any]:
    """Every endpoint with its current session's state (platform admins)."""
    views = await as_caller(request, platform_of(request).service.endpoint_views)
    return {"endpoints": views}


@router.post("/endpoints", status_code=201, response_model=CreatedEndpointAnswer)
async def create_endpoint(
    body: CreateEndpointRequest, request: Request, caller: Caller
) -> dict[str, Any]:
    """Create an endpoint; the answer carries its one-time join token, once."""
    platform = platform_of(request)
    enrolled = await as_caller(request, platform.service.create_endpoint, body.name)
    return {
        "endpoint": endpoint_view(enrolled.endpoint, None, platform.clock.now()),
        "join_token": enrolled.join_token,
        "join_token_expires_at": format_instant(enrolled.join_token_expires_at),
    }


# -- jobs --------------------------------------------------------------------------------------


def _spec(body: CreateJobRequest) -> JobSpec:
    backoff = None if body.backoff is None else body.backoff.model_dump(exclude_none=True)
    not_before = None if body.not_before is None else parse_instant(body.not_before, "not_before")
    return JobSpec(body.kind, body.payload, body.max_attempts, backoff, not_before)


def etag(job: Job) -> str:
    """The job's entity tag: it changes whenever the job does."""
    return f'"{job.version}"'


def job_answer(job: Job, status: int = 200) -> Response:
    return json_answer(job_view(job), status, headers={"ETag": etag(job)})


@router.post("/servers/{server_id}/jobs", status_code=201, response_model=JobViewModel)
async def create_job(
    server_id: str,
    body: CreateJobRequest,
    request: Request,
    caller: Caller,
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key"),
) -> Any:
    """Queue a job. The same Idempotency-Key with the same body gives the same job."""
    service = platform_of(request).service

    def create(user: User) -> Job:
        spec = _spec(body)  # after the credentials: a bad body never answers before them
        return service.create_job(
            user,
            server_id,
            kind=spec.kind,
            payload=spec.payload,
            max_attempts=spec.max_attempts,
            backoff=spec.backoff,
            not_before=spec.not_before,
            idempotency_key=idempotency_key,
        )

    return job_answer(await as_caller(request, create), 201)


@router.post("/servers/{server_id}/jobs/batch", status_code=201, response_model=CreatedJobsAnswer)
async def create_jobs(
    server_id: str,
    body: CreateJobsRequest,
    request: Request,
    caller: Caller,
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key"),
) -> Any:
    """Queue up to 1,000 jobs at once, all or none. An Idempotency-Key covers the batch: the
    same key with the same batch gives the same jobs."""
    service = platform_of(request).service

    def create(user: User) -> list[Job]:
        specs = [_spec(job) for job in body.jobs]
        return service.create_jobs(user, server_id, specs, idempotency_key=idempotency_key)

    jobs = await as_caller(request, create)
    return json_answer({"jobs": [job_view(job) for job in jobs]}, 201)


@router.get("/jobs", response_model=JobsAnswer)
async def list_jobs(
    request: Request,
    caller: Caller,
    server_id: str | None = None,
    state: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> Any:
    """The jobs the caller may see, newest first, a page at a time."""
    page = await as_caller(
        request,
        platform_of(request).service.list_jobs,
        server_id=server_id,
        state=state,
        limit=limit,
        cursor=cursor,
    )
    return json_answer(
        {"jobs": [job_view(job) for job in page.jobs], "next_cursor": page.next_cursor}
    )


@router.get(
    "/jobs/{job_id}",
    response_model=JobViewModel,
    responses={304: {"description": "Not modified: the job still has the If-None-Match tag"}},
)
async def get_job(
    job_id: str,
    request: Request,
    caller: Caller,
    wait_s: Annotated[float | None, Query(gt=0, le=3600)] = None,
    until: Literal["terminal"] | None = None,
    if_none_match: str | None = Header(default=None, alias="If-None-Match"),
) -> Any:
    """The job (its ETag changes whenever it does). A blocking read: with `wait_s`, answer as
    soon as the job is no longer the one `If-None-Match` names (304 if it still is when the
    wait ends), or with `until=terminal`, once it has ended (the current job when the wait
    ends first)."""
    platform = platform_of(request)
    service = platform.service
    job = await as_caller(request, service.get_job, job_id)
    if wait_s is None:
        return job_answer(job)
    if until is None and if_none_match is None:
        raise InvalidRequest("wait_s needs an If-None-Match header or until=terminal")

    def settled(job: Job) -> bool:
        if until == "terminal":
            return job.state.is_terminal
        return etag(job) != if_none_match

    if not settled(job):
        admission = request.state.admission
        deadline = time.monotonic() + min(wait_s, platform.http.max_read_wait_s)
        with platform.watch.job(job_id, settled) as waiter:
            while True:
                waiter.event.clear()  # registered, then read again: no change slips in between
                job = await as_caller(request, service.get_job, job_id)
                remaining = deadline - time.monotonic()
                if settled(job) or remaining <= 0:
                    break
                admission.leave()  # a waiting read holds no place on the user channel
                await wait_for(waiter.event, min(remaining, platform.watch.recheck_s))
                admission.enter()
                seen = waiter.latest
                if seen is not None and seen.version > job.version:
                    # The committed record the wake-up carried: the reader's access was
                    # checked when the read began and at each read of the store since.
                    job = seen
                    break
    if until is None and not settled(job):
        return Response(status_code=304, headers={"ETag": etag(job)})
    return job_answer(job)


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=JobViewModel,
    responses={202: {"model": JobViewModel, "description": "Cancel intent waits on Run"}},
)
async def cancel_job(job_id: str, request: Request, caller: Caller) -> Any:
    """Cancel: waiting jobs end at once (200); running ones get a durable intent (202)."""
    outcome = await as_caller(request, platform_of(request).service.cancel_job, job_id)
    view = JobViewModel.model_validate(job_view(outcome.job)).model_dump()
    return JSONResponse(view, status_code=202 if outcome.waits_on_run else 200)


@router.get("/jobs/{job_id}/logs", response_model=LogsAnswer)
async def job_logs(
    job_id: str,
    request: Request,
    caller: Caller,
    after_seq: Annotated[int, Query(ge=-1)] = -1,
    attempt: Annotated[int | None, Query(ge=1)] = None,
) -> dict[str, Any]:
    """Log lines of one attempt (the latest with logs unless `attempt` is given)."""
    platform = platform_of(request)
    await as_caller(request, platform.service.get_job, job_id)
    logs = platform.logs
    if attempt is None:
        attempts = await on_user_channel(request, logs.attempts, job_id)
        attempt = attempts[-1] if attempts else None
    lines = (
        []
        if attempt is None
        else await on_user_channel(request, logs.read, job_id, attempt, after_seq)
    )
    return {
        "attempt": attempt,
        "lines": [
            {"attempt": attempt, "seq": ln.seq, "ts": ln.ts, "stream": ln.stream, "text": ln.text}
            for ln in lines
        ],
    }
