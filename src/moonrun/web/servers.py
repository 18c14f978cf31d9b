"""The servers page: create and remove servers, add and remove their administrators."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from moonrun.errors import InvalidSelector, MoonrunError, NotFound
from moonrun.scheduling.records import User
from moonrun.scheduling.views import server_view, user_view
from moonrun.security.access import can_manage_admins, require
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


@router.get("/servers")
async def servers_page(
    request: Request, done: str | None = None, selector: str | None = None
) -> Response:
    user = await signed_in(request)
    return await _servers(request, user, notice=notice_of(done), selector=selector or "")


async def _servers(
    request: Request,
    user: User,
    *,
    notice: str = "",
    problem: MoonrunError | None = None,
    selector: str = "",
) -> Response:
    """The servers page (those matching `selector`), with what a form did or why it did not."""
    platform = platform_of(request)
    directory, service = platform.directory, platform.service
    try:
        servers = await on_user_channel(request, directory.list_servers, user, selector or None)
    except InvalidSelector as error:
        # Said on the page, above the form holding the selector to correct.
        servers, problem = [], error
    ids = {s.owner_id for s in servers} | {a for s in servers for a in s.admin_ids}
    names = await on_user_channel(request, directory.names_of, ids)
    online = await on_user_channel(
        request, service.endpoints_online, [s.endpoint_id for s in servers]
    )
    rows = [
        {
            **server_view(server, online[server.endpoint_id]),
            "owner": names.get(server.owner_id, "?"),
            "admins": [{"id": admin, "name": names.get(admin, "?")} for admin in server.admin_ids],
            "can_manage_admins": can_manage_admins(user, server),
        }
        for server in servers
    ]
    endpoints, people = [], []
    if user.platform_admin:  # the create form's choices
        endpoints = await on_user_channel(request, service.endpoint_views, user)
        people = [user_view(u) for u in await on_user_channel(request, directory.list_users, user)]
    return render_outcome(
        request,
        "servers.html",
        notice,
        problem,
        servers=rows,
        endpoints=endpoints,
        people=people,
        selector=selector,
    )


@router.post("/servers")
async def create_server(request: Request) -> Response:
    """Create a server on an endpoint, owned by a user (platform admins)."""
    user = await signed_in(request)
    fields = await checked_form(request)
    directory = platform_of(request).directory
    try:
        await on_user_channel(
            request,
            directory.create_server,
            user,
            fields.get("name", "").strip(),
            endpoint_id=fields.get("endpoint_id", ""),
            owner_id=fields.get("owner_id", ""),
        )
    except MoonrunError as error:
        return await _servers(request, user, problem=shown(error))
    return back("/servers", "server_created")


@router.get("/servers/{server_id}/remove")
async def remove_server_page(request: Request, server_id: str) -> Response:
    """The confirm step of removing a server (its owner or a platform admin)."""
    user = await signed_in(request)
    directory = platform_of(request).directory
    server = await on_user_channel(request, directory.get_server, user, server_id)
    require(can_manage_admins(user, server))
    return render(
        request,
        "confirm.html",
        heading=f"Remove server {server.name}?",
        subject=server.id,
        explanation=(
            "Only a server none of whose jobs is still waiting or running can be removed. "
            "Its ended jobs stay, readable by platform admins only. This cannot be undone."
        ),
        action=f"/servers/{quote(server.id)}/remove",
        button="Remove server",
        keep="/servers",
    )


@router.post("/servers/{server_id}/remove")
async def remove_server(request: Request, server_id: str) -> Response:
    """Remove a server (its owner or a platform admin); 409 `server_busy` while a job of it
    has not ended, shown on the servers page."""
    user = await signed_in(request)
    await checked_form(request)
    directory = platform_of(request).directory
    try:
        await on_user_channel(request, directory.remove_server, user, server_id)
    except MoonrunError as error:
        return await _servers(request, user, problem=shown(error))
    return back("/servers", "server_removed")


@router.post("/servers/{server_id}/admins")
async def add_admin(request: Request, server_id: str) -> Response:
    user = await signed_in(request)
    fields = await checked_form(request)
    directory = platform_of(request).directory
    added = await on_user_channel(request, directory.user_named, fields.get("username", "").strip())
    if added is None:
        raise NotFound("no user with that name")
    await on_user_channel(request, directory.add_server_admin, user, server_id, added.id)
    return RedirectResponse("/servers", status_code=303)


@router.post("/servers/{server_id}/admins/{user_id}/remove")
async def remove_admin(request: Request, server_id: str, user_id: str) -> Response:
    user = await signed_in(request)
    await checked_form(request)
    directory = platform_of(request).directory
    await on_user_channel(request, directory.remove_server_admin, user, server_id, user_id)
    return RedirectResponse("/servers", status_code=303)
