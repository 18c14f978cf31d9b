"""The user API (PROTOCOL.md section 6): Bearer tokens, and only the safe projections leave.

No credentials is 401 `unauthenticated`; a resource that exists but is not the caller's is
403 `forbidden`; a resource that does not exist is 404 `not_found`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse

from moonrun.errors import Forbidden, Unauthenticated
from moonrun.platform.http import ERROR_RESPONSES, Platform, on_user_channel, platform_of
from moonrun.platform.schemas import (
    AddAdminRequest,
    CreatedEndpointAnswer,
    CreatedUserAnswer,
    CreateEndpointRequest,
    CreateJobRequest,
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
from moonrun.platform.web.sessions import SESSION_COOKIE
from moonrun.scheduling.records import User
from moonrun.scheduling.time import format_instant, parse_instant
from moonrun.scheduling.views import endpoint_view, job_view, server_view, user_view

router = APIRouter(prefix="/api/v1", tags=["users"], responses=ERROR_RESPONSES)


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


async def current_user(request: Request) -> AsyncIterator[User]:
    """The authenticated caller, admitted to the user channel: a Bearer token, or the
    console's session cookie (then writes also need the session's X-CSRF-Token header)."""
    platform = platform_of(request)
    async with platform.channels.user.admit():
        user = await authenticate(request, platform)
        request.state.user = user
        yield user


async def authenticate(request: Request, platform: Platform) -> User:
    token = bearer_token(request)
    if token is not None:
        user: User = await platform.channels.user.run(platform.directory.authenticate, token)
        return user
    cookie = request.cookies.get(SESSION_COOKIE)
    found = await platform.channels.user.run(platform.web.user, cookie) if cookie else None
    if found is None:
        raise Unauthenticated("send Authorization: Bearer <api token>")
    if request.method not in ("GET", "HEAD") and not platform.web.csrf_ok(
        cookie, request.headers.get("x-csrf-token")
    ):
        raise Forbidden("a cookie-authenticated write needs the X-CSRF-Token header")
    return found


Caller = Annotated[User, Depends(current_user)]


# -- users -------------------------------------------------------------------------------------


@router.post("/users", status_code=201, response_model=CreatedUserAnswer)
async def create_user(body: CreateUserRequest, request: Request, user: Caller) -> dict[str, Any]:
    """Create a user (platform admins); the answer carries its API token, once."""
    directory = platform_of(request).directory
    created = await on_user_channel(
        request,
        directory.create_user,
        user,
        body.name,
        platform_admin=body.platform_admin,
        password=body.password,
    )
    return {"user": user_view(created.user), "api_token": created.api_token}


@router.get("/users", response_model=UsersAnswer)
async def list_users(request: Request, user: Caller) -> dict[str, Any]:
    """Every user (platform admins)."""
    users = await on_user_channel(request, platform_of(request).directory.list_users, user)
    return {"users": [user_view(u) for u in users]}


# -- servers -----------------------------------------------------------------------------------


@router.post("/servers", status_code=201, response_model=ServerModel)
async def create_server(
    body: CreateServerRequest, request: Request, user: Caller
) -> dict[str, Any]:
    """Create a server on an endpoint, owned by a user (platform admins)."""
    server = await on_user_channel(
        request,
        platform_of(request).directory.create_server,
        user,
        body.name,
        endpoint_id=body.endpoint_id,
        owner_id=body.owner_id,
    )
    return dict(server_view(server))


@router.get("/servers", response_model=ServersAnswer)
async def list_servers(request: Request, user: Caller) -> dict[str, Any]:
    """The servers the caller owns or administers (every server for platform admins)."""
    servers = await on_user_channel(request, platform_of(request).directory.list_servers, user)
    return {"servers": [server_view(server) for server in servers]}


@router.get("/servers/{server_id}", response_model=ServerModel)
async def get_server(server_id: str, request: Request, user: Caller) -> dict[str, Any]:
    server = await on_user_channel(
        request, platform_of(request).directory.get_server, user, server_id
    )
    return dict(server_view(server))


@router.post("/servers/{server_id}/admins", response_model=ServerModel)
async def add_server_admin(
    server_id: str, body: AddAdminRequest, request: Request, user: Caller
) -> dict[str, Any]:
    """Make a user an administrator of the server (its owner or a platform admin)."""
    server = await on_user_channel(
        request, platform_of(request).directory.add_server_admin, user, server_id, body.user_id
    )
    return dict(server_view(server))


# -- endpoints ---------------------------------------------------------------------------------


@router.get("/endpoints", response_model=EndpointsAnswer)
async def list_endpoints(request: Request, user: Caller) -> dict[str, Any]:
    """Every endpoint with its current session's state (platform admins)."""
    views = await on_user_channel(request, platform_of(request).service.endpoint_views, user)
    return {"endpoints": views}


@router.post("/endpoints", status_code=201, response_model=CreatedEndpointAnswer)
async def create_endpoint(
    body: CreateEndpointRequest, request: Request, user: Caller
) -> dict[str, Any]:
    """Create an endpoint; the answer carries its one-time join token, once."""
    platform = platform_of(request)
    enrolled = await on_user_channel(request, platform.service.create_endpoint, user, body.name)
    return {
        "endpoint": endpoint_view(enrolled.endpoint, None, platform.clock.now()),
        "join_token": enrolled.join_token,
        "join_token_expires_at": format_instant(enrolled.join_token_expires_at),
    }


# -- jobs --------------------------------------------------------------------------------------


@router.post("/servers/{server_id}/jobs", status_code=201, response_model=JobViewModel)
async def create_job(
    server_id: str,
    body: CreateJobRequest,
    request: Request,
    user: Caller,
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key"),
) -> dict[str, Any]:
    """Queue a job. The same Idempotency-Key with the same body gives the same job."""
    backoff = None if body.backoff is None else body.backoff.model_dump(exclude_none=True)
    not_before = None if body.not_before is None else parse_instant(body.not_before, "not_before")
    job = await on_user_channel(
        request,
        platform_of(request).service.create_job,
        user,
        server_id,
        kind=body.kind,
        payload=body.payload,
        max_attempts=body.max_attempts,
        backoff=backoff,
        not_before=not_before,
        idempotency_key=idempotency_key,
    )
    return dict(job_view(job))


@router.get("/jobs", response_model=JobsAnswer)
async def list_jobs(
    request: Request,
    user: Caller,
    server_id: str | None = None,
    state: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> dict[str, Any]:
    """The jobs the caller may see, newest first, a page at a time."""
    page = await on_user_channel(
        request,
        platform_of(request).service.list_jobs,
        user,
        server_id=server_id,
        state=state,
        limit=limit,
        cursor=cursor,
    )
    return {"jobs": [job_view(job) for job in page.jobs], "next_cursor": page.next_cursor}


@router.get("/jobs/{job_id}", response_model=JobViewModel)
async def get_job(job_id: str, request: Request, user: Caller) -> dict[str, Any]:
    job = await on_user_channel(request, platform_of(request).service.get_job, user, job_id)
    return dict(job_view(job))


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=JobViewModel,
    responses={202: {"model": JobViewModel, "description": "Cancel intent waits on Run"}},
)
async def cancel_job(job_id: str, request: Request, user: Caller) -> Any:
    """Cancel: waiting jobs end at once (200); running ones get a durable intent (202)."""
    outcome = await on_user_channel(request, platform_of(request).service.cancel_job, user, job_id)
    view = JobViewModel.model_validate(job_view(outcome.job)).model_dump()
    return JSONResponse(view, status_code=202 if outcome.waits_on_run else 200)


@router.get("/jobs/{job_id}/logs", response_model=LogsAnswer)
async def job_logs(
    job_id: str,
    request: Request,
    user: Caller,
    after_seq: Annotated[int, Query(ge=-1)] = -1,
    attempt: Annotated[int | None, Query(ge=1)] = None,
) -> dict[str, Any]:
    """Log lines of one attempt (the latest with logs unless `attempt` is given)."""
    platform = platform_of(request)
    await on_user_channel(request, platform.service.get_job, user, job_id)
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
