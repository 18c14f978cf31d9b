"""What every console page shares: the platform as the console sees it (`ConsolePlatform`),
pages rendered with their security headers, the signed-in user, forms and their CSRF token, and
what a form that worked says. The pages: account.py, jobs.py, servers.py, endpoints.py,
users.py; console.py joins them into one router. They call the same service and build the same
JobView as the API: there is no second projection, and nothing a user may not see reaches a
template."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qs, urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from moonrun.artifacts.protocol import ArtifactStore
from moonrun.errors import Forbidden, InvalidRequest, MoonrunError, TooLarge, Unauthenticated
from moonrun.logs.protocol import LogStore
from moonrun.scheduling.records import User
from moonrun.service.directory import Directory
from moonrun.service.scheduling import SchedulingService
from moonrun.service.websessions import SESSION_COOKIE, SignInThrottle, WebSessions

T = TypeVar("T")

TERMINAL_STATES = {"succeeded", "failed", "cancelled"}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
FORM_FIELDS = 32
"""Fields a console form may have (a form with more is 413 `too_large`)."""
NOTICES = {
    "endpoint_drained": "The endpoint is draining: it gets no new jobs; its running jobs finish.",
    "endpoint_undrained": "The endpoint takes jobs again.",
    "endpoint_removed": "The endpoint is removed; its Run is refused from now on.",
    "user_disabled": "The user is disabled: their API tokens and console sessions are refused.",
    "user_enabled": "The user is enabled again.",
    "password_set": "The password is set.",
    "server_created": "The server is created.",
    "server_removed": "The server is removed; its ended jobs stay readable by platform admins.",
    "schedule_created": "The schedule is created.",
    "schedule_paused": "The schedule is paused: it fires no more until resumed.",
    "schedule_resumed": "The schedule fires again.",
    "schedule_triggered": "The schedule fired now (unless its overlap policy skipped it).",
    "schedule_deleted": "The schedule is deleted; its jobs stay.",
}
"""What a form that worked says on the page it leads back to (`?done=`). Only these fixed
texts: a page never shows text taken from its address."""


# -- what the console is given -----------------------------------------------------------------


class UserChannel(Protocol):
    """Where the console's store work runs: the user channel (inline, or on its threads)."""

    async def run(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...

    async def thread(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...


class ConsoleChannels(Protocol):
    @property
    def user(self) -> UserChannel: ...


class ConsolePlatform(Protocol):
    """What the console is given: the use cases (never the store), the log and artifact
    stores, the sign-in sessions and throttle, and the user channel. The wiring builds one
    (`wiring/platform.py`'s `Platform`) and installs it (`console.install`)."""

    service: SchedulingService
    directory: Directory
    web: WebSessions
    throttle: SignInThrottle
    logs: LogStore
    artifacts: ArtifactStore

    @property
    def channels(self) -> ConsoleChannels: ...


def platform_of(request: Request) -> ConsolePlatform:
    platform: ConsolePlatform = request.app.state.console
    return platform


async def on_user_channel(request: Request, work: Any, *args: Any, **kwargs: Any) -> Any:
    """Run `work` for a console request on a thread of the user channel (signing in hashes a
    password: never on the event loop)."""
    return await platform_of(request).channels.user.thread(work, *args, **kwargs)


class SignInRequired(Unauthenticated):
    """Sign in to see this page."""


# -- pages, users and forms ---------------------------------------------------------------------


def render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    platform = platform_of(request)
    user: User | None = getattr(request.state, "user", None)
    token = request.cookies.get(SESSION_COOKIE)
    values: dict[str, Any] = {
        "user": user,
        "csrf": platform.web.csrf(token) if user is not None and token else "",
        "path": request.url.path,
    }
    values.update(context)
    html = request.app.state.templates.get_template(template).render(**values)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def render_outcome(
    request: Request, template: str, notice: str, problem: MoonrunError | None, **context: Any
) -> HTMLResponse:
    """A page as it stands after a form: its notice, or the refusal's message and status."""
    return render(
        request,
        template,
        problem.status if problem else 200,
        notice=notice,
        problem=problem.message if problem else "",
        **context,
    )


async def signed_in(request: Request) -> User:
    """The signed-in user, or `SignInRequired` (a redirect to the sign-in page)."""
    platform = platform_of(request)
    token = request.cookies.get(SESSION_COOKIE)
    user = await platform.channels.user.run(platform.web.user, token) if token else None
    if user is None:
        raise SignInRequired()
    request.state.user = user
    return user


class Form(dict[str, str]):
    """A form's fields, each its first value; `every` has all the values of a repeated one."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        super().__init__({name: values[0] for name, values in fields.items()})
        self._fields = fields

    def every(self, name: str) -> list[str]:
        return list(self._fields.get(name, ()))


async def form_of(request: Request, max_fields: int = FORM_FIELDS) -> Form:
    """An urlencoded form body (the console sends nothing else) of at most `max_fields`
    fields: more is 413 `too_large`, before anything looks at them."""
    body = await request.body()
    if body.count(b"&") >= max_fields:
        raise TooLarge(f"a console form has at most {max_fields} fields")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=max_fields)
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest("the form could not be read") from None
    return Form(fields)


async def checked_form(request: Request, max_fields: int = FORM_FIELDS) -> Form:
    """The form of a signed-in user's POST, refused without the session's CSRF token."""
    platform = platform_of(request)
    fields = await form_of(request, max_fields)
    if not platform.web.csrf_ok(request.cookies.get(SESSION_COOKIE), fields.get("csrf_token")):
        raise FormExpired()
    return fields


def shown(error: MoonrunError) -> MoonrunError:
    """A form's error, to show on the page the form came from: a refusal (401, 403) is raised
    again instead, to answer its own page."""
    if isinstance(error, Unauthenticated | Forbidden):
        raise error
    return error


def back(path: str, done: str) -> RedirectResponse:
    """After a form that worked: 303 to its page, which says what was done (`NOTICES`)."""
    return RedirectResponse(f"{path}?{urlencode({'done': done})}", status_code=303)


def notice_of(done: str | None) -> str:
    return NOTICES.get(done or "", "")


def safe_next(target: str | None) -> str:
    """Only a path on this site: never another host (`//host`, `https:`...)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/jobs"
    return target


def set_cookie(request: Request, response: Response, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        path="/",
    )


class FormExpired(Forbidden):
    """This form is missing its security token; reload the page and try again."""
