"""The users page (platform admins): create, disable and enable users, set their passwords,
rotate their API tokens."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from moonrun.errors import MoonrunError
from moonrun.scheduling.records import User
from moonrun.scheduling.views import user_view
from moonrun.web.account import api_token_page, new_api_token, password_of, render_account
from moonrun.web.pages import (
    back,
    checked_form,
    notice_of,
    on_user_channel,
    platform_of,
    render_outcome,
    shown,
    signed_in,
)

router = APIRouter(include_in_schema=False)


@router.get("/users")
async def users_page(request: Request, done: str | None = None) -> Response:
    user = await signed_in(request)
    return await _users(request, user, notice=notice_of(done))


async def _users(
    request: Request, user: User, *, notice: str = "", problem: MoonrunError | None = None
) -> Response:
    users = await on_user_channel(request, platform_of(request).directory.list_users, user)
    return render_outcome(
        request,
        "users.html",
        notice,
        problem,
        users=[user_view(u) for u in users],
    )


@router.post("/users")
async def create_user(request: Request) -> Response:
    """Create a user (platform admins); the answer shows their API token, this once."""
    user = await signed_in(request)
    fields = await checked_form(request)
    directory = platform_of(request).directory
    try:
        created = await on_user_channel(
            request,
            directory.create_user,
            user,
            fields.get("name", "").strip(),
            platform_admin=fields.get("platform_admin") == "on",
            password=password_of(fields) or None,
        )
    except MoonrunError as error:
        return await _users(request, user, problem=shown(error))
    heading = f"User {created.user.name} is created"
    return api_token_page(
        request, heading, created.user, created.api_token, rotated=False, done="/users"
    )


async def _set_disabled(request: Request, user_id: str, disabled: bool) -> Response:
    user = await signed_in(request)
    await checked_form(request)
    directory = platform_of(request).directory
    try:
        await on_user_channel(request, directory.set_disabled, user, user_id, disabled)
    except MoonrunError as error:
        return await _users(request, user, problem=shown(error))
    return back("/users", "user_disabled" if disabled else "user_enabled")


@router.post("/users/{user_id}/disable")
async def disable_user(request: Request, user_id: str) -> Response:
    """Disable a user: their API tokens and console sessions are refused (platform admins;
    not themself)."""
    return await _set_disabled(request, user_id, True)


@router.post("/users/{user_id}/enable")
async def enable_user(request: Request, user_id: str) -> Response:
    """Enable a disabled user again (platform admins)."""
    return await _set_disabled(request, user_id, False)


@router.post("/users/{user_id}/token")
async def rotate_token(request: Request, user_id: str) -> Response:
    """A new API token for the user, shown once; their old ones stop working."""
    user = await signed_in(request)
    await checked_form(request)
    directory = platform_of(request).directory
    try:
        person, token = await on_user_channel(request, new_api_token, directory, user, user_id)
    except MoonrunError as error:
        return await _people(request, user, shown(error))
    heading = f"A new API token for {person.name}"
    return api_token_page(request, heading, person, token, rotated=True, done=_people_of(user))


@router.post("/users/{user_id}/password")
async def set_password(request: Request, user_id: str) -> Response:
    """Set a user's console password (platform admins for anyone; anyone for themself)."""
    user = await signed_in(request)
    fields = await checked_form(request)
    directory = platform_of(request).directory
    try:
        password = password_of(fields)
        await on_user_channel(request, directory.set_password, user, user_id, password)
    except MoonrunError as error:
        return await _people(request, user, shown(error))
    return back(_people_of(user), "password_set")


def _people_of(user: User) -> str:
    """Where a form about a user came from: the users page, or for someone who may not see
    it (and may act only on themself) their account page."""
    return "/users" if user.platform_admin else "/account"


async def _people(request: Request, user: User, problem: MoonrunError) -> Response:
    if user.platform_admin:
        return await _users(request, user, problem=problem)
    return render_account(request, user, problem=problem)
