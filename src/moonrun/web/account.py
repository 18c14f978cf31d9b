"""Signing in and out, and the signed-in user's account: their own password and API token."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from moonrun.errors import InvalidRequest, MoonrunError
from moonrun.scheduling.records import User
from moonrun.scheduling.views import user_view
from moonrun.service.directory import Directory
from moonrun.service.websessions import SESSION_COOKIE, SIGN_IN_COOKIE, SIGN_IN_FORM_TTL_S
from moonrun.web.pages import (
    Form,
    back,
    checked_form,
    form_of,
    notice_of,
    on_user_channel,
    platform_of,
    render,
    render_outcome,
    safe_next,
    set_cookie,
    shown,
    signed_in,
)

router = APIRouter(include_in_schema=False)


# -- sign-in -----------------------------------------------------------------------------------


@router.get("/", response_class=RedirectResponse)
async def home() -> RedirectResponse:
    return RedirectResponse("/jobs", status_code=303)


@router.get("/login")
async def login_form(request: Request, next: str | None = None) -> Response:
    platform = platform_of(request)
    token = request.cookies.get(SESSION_COOKIE)
    if token and await on_user_channel(request, platform.web.user, token) is not None:
        return RedirectResponse(safe_next(next), status_code=303)
    return _login_page(request, next=safe_next(next))


def _login_page(
    request: Request, *, next: str, message: str = "", status: int = 200, name: str = ""
) -> Response:
    cookie, csrf = platform_of(request).web.sign_in_form(request.cookies.get(SIGN_IN_COOKIE))
    response = render(
        request, "login.html", status=status, next=next, message=message, csrf=csrf, name=name
    )
    set_cookie(request, response, SIGN_IN_COOKIE, cookie, max_age=SIGN_IN_FORM_TTL_S)
    return response


@router.post("/login")
async def login(request: Request) -> Response:
    platform = platform_of(request)
    fields = await form_of(request)
    name, password = fields.get("username", ""), fields.get("password", "")
    target = safe_next(fields.get("next"))
    if not platform.web.sign_in_form_ok(
        request.cookies.get(SIGN_IN_COOKIE), fields.get("csrf_token")
    ):
        return _login_page(
            request,
            next=target,
            status=403,
            message="This sign-in form expired. Please try again.",
        )
    address = request.client.host if request.client else "unknown"
    # Counted before it is checked (in files, when platform processes count together).
    wait_s = await on_user_channel(request, platform.throttle.reserve, name, address)
    if wait_s:
        refused = _login_page(
            request,
            next=target,
            status=429,
            name=name,
            message=f"Too many failed sign-ins. Try again in {wait_s} second(s).",
        )
        refused.headers["Retry-After"] = str(wait_s)
        return refused
    user = await on_user_channel(request, platform.directory.sign_in, name, password)
    if user is None:
        return _login_page(
            request, next=target, status=401, name=name, message="Wrong name or password."
        )
    await on_user_channel(request, platform.throttle.succeeded, name, address)
    await on_user_channel(
        request, platform.web.close, request.cookies.get(SESSION_COOKIE)
    )  # any previous
    token = await on_user_channel(request, platform.web.open, user)
    response = RedirectResponse(target, status_code=303)
    set_cookie(request, response, SESSION_COOKIE, token, max_age=int(platform.web.ttl_s))
    response.delete_cookie(SIGN_IN_COOKIE, path="/")
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    await signed_in(request)
    await checked_form(request)
    platform = platform_of(request)
    await on_user_channel(request, platform.web.close, request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


# -- the signed-in user's account --------------------------------------------------------------


@router.get("/account")
async def account_page(request: Request, done: str | None = None) -> Response:
    """The signed-in user: their own password and API token."""
    user = await signed_in(request)
    return render_account(request, user, notice=notice_of(done))


def render_account(
    request: Request, user: User, *, notice: str = "", problem: MoonrunError | None = None
) -> Response:
    return render_outcome(
        request,
        "account.html",
        notice,
        problem,
        me=user_view(user),
    )


@router.post("/account/password")
async def set_own_password(request: Request) -> Response:
    """Set one's own console password (anyone signed in, as the API allows)."""
    user = await signed_in(request)
    fields = await checked_form(request)
    directory = platform_of(request).directory
    try:
        password = password_of(fields)
        await on_user_channel(request, directory.set_password, user, user.id, password)
    except MoonrunError as error:
        return render_account(request, user, problem=shown(error))
    return back("/account", "password_set")


@router.post("/account/token")
async def rotate_own_token(request: Request) -> Response:
    """A new API token for oneself, shown once; the old ones stop working."""
    user = await signed_in(request)
    await checked_form(request)
    directory = platform_of(request).directory
    _, token = await on_user_channel(request, new_api_token, directory, user, user.id)
    return api_token_page(request, "Your new API token", user, token, rotated=True, done="/account")


def password_of(fields: Form) -> str:
    """The form's new password, typed twice the same."""
    password = fields.get("password", "")
    if password != fields.get("password_again", ""):
        raise InvalidRequest("the two passwords differ")
    return password


def api_token_page(
    request: Request, heading: str, person: User, token: str, *, rotated: bool, done: str
) -> Response:
    """The one page that shows an API token: the answer to the form that made it."""
    explanation = ""
    if rotated:
        own = person.id == request.state.user.id
        explanation = (
            "Your old API tokens stop working now: save this one again with `moonrun login`."
            if own
            else f"The old API tokens of {person.name} stop working now."
        )
    return render(
        request,
        "shown_once.html",
        heading=heading,
        subject=person.id,
        secret_label="API token",
        secret=token,
        explanation=explanation,
        done=done,
        done_label="Back to your account" if done == "/account" else "Back to users",
    )


def new_api_token(directory: Directory, actor: User, user_id: str) -> tuple[User, str]:
    """As the API's rotate: the new token, and the user it belongs to."""
    token = directory.rotate_api_token(actor, user_id)
    return directory.user_by_id(user_id), token
