"""The endpoints page (platform admins): create, drain and remove endpoints."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import Response

from moonrun.errors import MoonrunError, NotFound
from moonrun.scheduling.records import User
from moonrun.scheduling.time import format_instant
from moonrun.scheduling.views import EndpointView
from moonrun.web.pages import (
    back,
    checked_form,
    notice_of,
    on_user_channel,
    platform_of,
    render,
    render_outcome,
    shown,
    signed_in,
)

router = APIRouter(include_in_schema=False)
RUN_DATA_DIR = "/var/lib/moonrun-run"
"""The data directory the join command names, as `moonrun endpoint create` prints it."""


@router.get("/endpoints")
async def endpoints_page(request: Request, done: str | None = None) -> Response:
    user = await signed_in(request)
    return await _endpoints(request, user, notice=notice_of(done))


async def _endpoints(
    request: Request, user: User, *, notice: str = "", problem: MoonrunError | None = None
) -> Response:
    views = await on_user_channel(request, platform_of(request).service.endpoint_views, user)
    return render_outcome(
        request,
        "endpoints.html",
        notice,
        problem,
        endpoints=views,
    )


@router.post("/endpoints")
async def create_endpoint(request: Request) -> Response:
    """Create an endpoint (platform admins); the answer shows its join token, this once."""
    user = await signed_in(request)
    fields = await checked_form(request)
    service = platform_of(request).service
    try:
        enrolled = await on_user_channel(
            request, service.create_endpoint, user, fields.get("name", "").strip()
        )
    except MoonrunError as error:
        return await _endpoints(request, user, problem=shown(error))
    platform_url = str(request.base_url).rstrip("/")
    token = enrolled.join_token
    return render(
        request,
        "shown_once.html",
        heading=f"Endpoint {enrolled.endpoint.name} is created",
        subject=enrolled.endpoint.id,
        secret_label="Join token",
        secret=token,
        expires_at=format_instant(enrolled.join_token_expires_at),
        command=f"moonrun run join --platform {platform_url} --token {token} "
        f"--data-dir {RUN_DATA_DIR}",
        done="/endpoints",
        done_label="Back to endpoints",
    )


async def _endpoint(request: Request, user: User, endpoint_id: str) -> EndpointView:
    """One endpoint as platform admins see it."""
    views: list[EndpointView] = await on_user_channel(
        request, platform_of(request).service.endpoint_views, user
    )
    for view in views:
        if view["id"] == endpoint_id:
            return view
    raise NotFound("no such endpoint")


async def _drain(request: Request, endpoint_id: str, draining: bool) -> Response:
    user = await signed_in(request)
    await checked_form(request)
    service = platform_of(request).service
    try:
        await on_user_channel(request, service.set_draining, user, endpoint_id, draining)
    except MoonrunError as error:
        return await _endpoints(request, user, problem=shown(error))
    return back("/endpoints", "endpoint_drained" if draining else "endpoint_undrained")


@router.post("/endpoints/{endpoint_id}/drain")
async def drain_endpoint(request: Request, endpoint_id: str) -> Response:
    """Grant the endpoint no new claims; its running attempts finish (platform admins)."""
    return await _drain(request, endpoint_id, True)


@router.post("/endpoints/{endpoint_id}/undrain")
async def undrain_endpoint(request: Request, endpoint_id: str) -> Response:
    """Grant the endpoint claims again (platform admins)."""
    return await _drain(request, endpoint_id, False)


@router.get("/endpoints/{endpoint_id}/remove")
async def remove_endpoint_page(request: Request, endpoint_id: str) -> Response:
    """The confirm step of removing an endpoint (platform admins)."""
    user = await signed_in(request)
    endpoint = await _endpoint(request, user, endpoint_id)
    return render(
        request,
        "confirm.html",
        heading=f"Remove endpoint {endpoint['name']}?",
        subject=endpoint["id"],
        explanation=(
            "Only an endpoint no server points at can be removed. Its session ends, and its "
            "Run's requests are refused from then on. This cannot be undone."
        ),
        action=f"/endpoints/{quote(endpoint['id'])}/remove",
        button="Remove endpoint",
        keep="/endpoints",
    )


@router.post("/endpoints/{endpoint_id}/remove")
async def remove_endpoint(request: Request, endpoint_id: str) -> Response:
    """Remove an endpoint (platform admins); 409 `endpoint_in_use` while a server points at
    it, shown on the endpoints page."""
    user = await signed_in(request)
    await checked_form(request)
    service = platform_of(request).service
    try:
        await on_user_channel(request, service.remove_endpoint, user, endpoint_id)
    except MoonrunError as error:
        return await _endpoints(request, user, problem=shown(error))
    return back("/endpoints", "endpoint_removed")
