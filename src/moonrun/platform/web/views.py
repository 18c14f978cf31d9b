"""The console's pages. They call the same service and build the same JobView as the API:
there is no second projection, and nothing a user may not see reaches a template."""

from __future__ import annotations

import contextlib
import secrets
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from moonrun.errors import (
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    MoonrunError,
    NotFound,
    Unauthenticated,
)
from moonrun.platform.answers import JobPage
from moonrun.platform.http import on_user_channel, platform_of
from moonrun.platform.web import logview, progressview, submitform
from moonrun.platform.web.sessions import SESSION_COOKIE, SIGN_IN_COOKIE
from moonrun.scheduling.jobs import JobState
from moonrun.scheduling.records import User
from moonrun.scheduling.views import job_view, server_view, user_view

router = APIRouter(include_in_schema=False)

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
NOT_CONSOLE = ("/api/", "/run/", "/healthz", "/metrics", "/openapi.json", "/docs", "/redoc")


def environment() -> Environment:
    templates = Environment(
        loader=PackageLoader("moonrun.platform.web", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    templates.globals["progress_shown"] = progressview.progress_shown
    return templates


def is_console(path: str) -> bool:
    return not path.startswith(NOT_CONSOLE)


class SignInRequired(Unauthenticated):
    """Sign in to see this page."""


# -- plumbing ----------------------------------------------------------------------------------


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


async def signed_in(request: Request) -> User:
    """The signed-in user, or `SignInRequired` (a redirect to the sign-in page)."""
    platform = platform_of(request)
    token = request.cookies.get(SESSION_COOKIE)
    user = await platform.channels.user.run(platform.web.user, token) if token else None
    if user is None:
        raise SignInRequired()
    request.state.user = user
    return user


async def form_of(request: Request) -> dict[str, str]:
    """An urlencoded form body (the console sends nothing else)."""
    body = await request.body()
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=32)
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest("the form could not be read") from None
    return {name: values[0] for name, values in fields.items()}


async def checked_form(request: Request) -> dict[str, str]:
    """The form of a signed-in user's POST, refused without the session's CSRF token."""
    platform = platform_of(request)
    fields = await form_of(request)
    if not platform.web.csrf_ok(request.cookies.get(SESSION_COOKIE), fields.get("csrf_token")):
        raise FormExpired()
    return fields


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


async def console_error(request: Request, error: MoonrunError) -> Response:
    """Errors on console pages: sign-in redirects, and styled 403/404/other pages."""
    if isinstance(error, Unauthenticated):
        target = _page_of(request)
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
    if getattr(request.state, "user", None) is None:  # so that the page keeps its navigation
        platform = platform_of(request)
        token = request.cookies.get(SESSION_COOKIE)
        with contextlib.suppress(MoonrunError):
            request.state.user = (
                await on_user_channel(request, platform.web.user, token) if token else None
            )
    titles = {403: "Not yours to see", 404: "Nothing here", 429: "Slow down"}
    title = "This form has expired" if isinstance(error, FormExpired) else None
    return render(
        request,
        "error.html",
        status=error.status,
        title=title or titles.get(error.status, "Something went wrong"),
        message=error.message,
        error_status=error.status,
    )


def _page_of(request: Request) -> str:
    """Where to come back after signing in: the page itself, or for a form post the page the
    form was on (a POST-only path cannot be fetched again)."""
    path = request.url.path
    if request.method in ("GET", "HEAD"):
        return path + (f"?{request.url.query}" if request.url.query else "")
    if path.startswith("/jobs/") and path.endswith("/cancel"):
        return path.removesuffix("/cancel")
    if path.startswith("/servers/"):
        return "/servers"
    return "/jobs"


class FormExpired(Forbidden):
    """This form is missing its security token; reload the page and try again."""


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
    csrf = request.cookies.get(SIGN_IN_COOKIE) or platform_of(request).web.new_sign_in_token()
    response = render(
        request, "login.html", status=status, next=next, message=message, csrf=csrf, name=name
    )
    set_cookie(request, response, SIGN_IN_COOKIE, csrf, max_age=3600)
    return response


@router.post("/login")
async def login(request: Request) -> Response:
    platform = platform_of(request)
    fields = await form_of(request)
    name, password = fields.get("username", ""), fields.get("password", "")
    target = safe_next(fields.get("next"))
    cookie = request.cookies.get(SIGN_IN_COOKIE)
    if not cookie or not platform.web.same(cookie, fields.get("csrf_token", "")):
        return _login_page(
            request,
            next=target,
            status=403,
            message="This sign-in form expired. Please try again.",
        )
    address = request.client.host if request.client else "unknown"
    wait_s = platform.throttle.wait_s(name, address)
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
        platform.throttle.failed(name, address)
        return _login_page(
            request, next=target, status=401, name=name, message="Wrong name or password."
        )
    platform.throttle.succeeded(name)
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


# -- jobs --------------------------------------------------------------------------------------


@router.get("/jobs")
async def jobs_page(
    request: Request,
    server_id: str | None = None,
    state: str | None = None,
    kind: str | None = None,
    id: str | None = None,
    cursor: str | None = None,
    fragment: bool = False,
) -> Response:
    user = await signed_in(request)
    platform = platform_of(request)
    server_id, state, kind = server_id or None, state or None, (kind or "").strip() or None
    id_prefix = _id_prefix(id)
    search_error = ""
    try:
        page = await on_user_channel(
            request,
            platform.service.list_jobs,
            user,
            server_id=server_id,
            state=state,
            limit=25,
            cursor=cursor,
            kind=kind,
            id_prefix=id_prefix,
        )
    except InvalidRequest as error:
        # A search too broad or malformed: said on the page, whose filters then start empty
        # (a refused value is never shown again: it may be a secret typed in the wrong box).
        search_error = error.message
        page = JobPage((), None)
        state = kind = id = cursor = None
    servers = await on_user_channel(request, platform.directory.list_servers, user)
    online = await on_user_channel(
        request, platform.service.endpoints_online, [s.endpoint_id for s in servers]
    )
    names = {server.id: server.name for server in servers}
    filters = {
        k: v
        for k, v in {"server_id": server_id, "state": state, "kind": kind, "id": id}.items()
        if v
    }
    older = (
        "/jobs?" + urlencode({**filters, "cursor": page.next_cursor}) if page.next_cursor else None
    )
    context: dict[str, Any] = {
        "jobs": [job_view(job) for job in page.jobs],
        "server_names": names,
        "servers": [server_view(server, online[server.endpoint_id]) for server in servers],
        "states": [s.value for s in JobState],
        "filters": filters,
        "older": older,
        "live_url": "/jobs?" + urlencode({**filters, "fragment": "1", **_cursor(cursor)}),
        "search_error": search_error,
    }
    status = 422 if search_error else 200
    return render(request, "_jobs_table.html" if fragment else "jobs.html", status, **context)


def _cursor(cursor: str | None) -> dict[str, str]:
    return {"cursor": cursor} if cursor else {}


def _id_prefix(text: str | None) -> str | None:
    """What a person typed to find a job by id: its start, with or without `job_`."""
    typed = (text or "").strip()
    if not typed:
        return None
    return typed if typed.startswith("job_") else "job_" + typed


# -- submitting (routed before /jobs/{job_id}, which would take "new" for an id) ------------


@router.get("/jobs/new")
async def submit_page(
    request: Request, server_id: str | None = None, kind: str | None = None
) -> Response:
    user = await signed_in(request)
    return await _submit_form(request, user, server_id=server_id, kind=kind)


@router.post("/jobs/new")
async def submit_job(request: Request) -> Response:
    user = await signed_in(request)
    fields = await checked_form(request)
    server_id, kind = fields.get("server_id", ""), fields.get("kind", "").strip()
    text, attempts = fields.get("payload", ""), fields.get("max_attempts", "").strip()
    form = {"server_id": server_id, "kind": kind, "payload": text, "max_attempts": attempts}
    try:
        payload = submitform.parse_payload(text)
        max_attempts = submitform.parse_attempts(attempts)
        job = await on_user_channel(
            request,
            platform_of(request).service.create_job,
            user,
            server_id,
            kind=kind,
            payload=payload,
            max_attempts=max_attempts,
            idempotency_key=fields.get("submit_key") or None,
        )
    except (InvalidRequest, IdempotencyConflict) as error:
        return await _submit_form(request, user, error=error, **form)
    return RedirectResponse(f"/jobs/{quote(job.id)}", status_code=303)


async def _submit_form(
    request: Request,
    user: User,
    *,
    server_id: str | None = None,
    kind: str | None = None,
    payload: str | None = None,
    max_attempts: str = "",
    error: MoonrunError | None = None,
) -> Response:
    """The submit form for one of the user's servers (the first, unless one is chosen), with
    the kinds its Run advertised; after a refused submit, what was typed and why."""
    platform = platform_of(request)
    servers = await on_user_channel(request, platform.directory.list_servers, user)
    chosen = next((s for s in servers if s.id == server_id), servers[0] if servers else None)
    if server_id and chosen is not None and chosen.id != server_id:
        raise NotFound("no such server")
    context: dict[str, Any] = {"servers": servers, "server": None, "kinds": []}
    if chosen is not None:
        online = await on_user_channel(
            request, platform.service.endpoints_online, [chosen.endpoint_id]
        )
        advertisement = await on_user_channel(
            request, platform.service.server_kinds, user, chosen.id
        )
        kinds = submitform.kinds_of(advertisement)
        chosen_kind = kind or (kinds[0]["kind"] if kinds else "")
        skeleton = next((k["skeleton"] for k in kinds if k["kind"] == chosen_kind), "{}")
        context |= {
            "server": server_view(chosen, online[chosen.endpoint_id]),
            "kinds": kinds,
            "chosen_kind": chosen_kind,
            "payload": skeleton if payload is None else payload,
            "max_attempts": max_attempts,
            "submit_key": secrets.token_urlsafe(16),
            "error": {"code": error.code, "message": error.message} if error else None,
            "problems": [{"field": f, "message": m} for f, m in error.fields] if error else [],
        }
    status = 200 if error is None else error.status
    return render(request, "submit.html", status, **context)


# -- one job -----------------------------------------------------------------------------------


@router.get("/jobs/{job_id}")
async def job_page(request: Request, job_id: str, fragment: bool = False) -> Response:
    user = await signed_in(request)
    platform = platform_of(request)
    job = await on_user_channel(request, platform.service.get_job, user, job_id)
    view = job_view(job)
    attempts = await on_user_channel(request, platform.logs.attempts, job_id)
    logs_attempt = attempts[-1] if attempts else None
    page = None
    if logs_attempt is not None:
        page = await on_user_channel(
            request, platform.logs.tail, job_id, logs_attempt, logview.TAIL_LINES
        )
    lines = logview.shown_tail(page) if page else []
    server = await on_user_channel(request, platform.directory.get_server, user, job.server_id)
    artifacts = await on_user_channel(request, platform.artifacts.artifacts, job_id)
    context: dict[str, Any] = {
        "artifacts": [
            {
                "attempt": a.attempt,
                "name": a.name,
                "size": a.size,
                "complete": a.complete,
                "url": f"/api/v1/jobs/{quote(job_id)}/artifacts/{a.name}?attempt={a.attempt}",
            }
            for a in artifacts
        ],
        "job": view,
        "server_name": server.name,
        "logs": lines,
        "logs_kept": page.kept_lines if page else 0,
        "logs_dropped": page.dropped_lines if page else 0,
        "logs_url": f"/api/v1/jobs/{quote(job_id)}/logs?attempt={logs_attempt}",
        "final": view["state"] in TERMINAL_STATES,
        "logs_attempt": logs_attempt,
        "can_cancel": view["state"] not in TERMINAL_STATES and not view["cancel"]["requested"],
        "live_url": f"/jobs/{quote(job_id)}?fragment=1",
        "rerun_nonce": secrets.token_urlsafe(8),
    }
    return render(request, "_job_detail.html" if fragment else "job.html", **context)


@router.post("/jobs/{job_id}/rerun")
async def rerun_job(request: Request, job_id: str) -> Response:
    user = await signed_in(request)
    fields = await checked_form(request)
    service = platform_of(request).service
    key = fields.get("submit_key") or None
    job = await on_user_channel(request, service.rerun_job, user, job_id, idempotency_key=key)
    return RedirectResponse(f"/jobs/{quote(job.id)}", status_code=303)


@router.post("/jobs/{job_id}/cancel")
async def cancel_job(request: Request, job_id: str) -> Response:
    user = await signed_in(request)
    await checked_form(request)
    await on_user_channel(request, platform_of(request).service.cancel_job, user, job_id)
    return RedirectResponse(f"/jobs/{quote(job_id)}", status_code=303)


# -- servers, endpoints, users -----------------------------------------------------------------


@router.get("/servers")
async def servers_page(request: Request, message: str | None = None) -> Response:
    user = await signed_in(request)
    platform = platform_of(request)
    servers = await on_user_channel(request, platform.directory.list_servers, user)
    ids = {s.owner_id for s in servers} | {a for s in servers for a in s.admin_ids}
    names = await on_user_channel(request, platform.directory.names_of, ids)
    online = await on_user_channel(
        request, platform.service.endpoints_online, [s.endpoint_id for s in servers]
    )
    rows = [
        {
            **server_view(server, online[server.endpoint_id]),
            "owner": names.get(server.owner_id, "?"),
            "admins": [{"id": admin, "name": names.get(admin, "?")} for admin in server.admin_ids],
            "can_manage_admins": user.platform_admin or user.id == server.owner_id,
        }
        for server in servers
    ]
    return render(request, "servers.html", servers=rows, message=message or "")


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


@router.get("/endpoints")
async def endpoints_page(request: Request) -> Response:
    user = await signed_in(request)
    views = await on_user_channel(request, platform_of(request).service.endpoint_views, user)
    return render(request, "endpoints.html", endpoints=views)


@router.get("/users")
async def users_page(request: Request) -> Response:
    user = await signed_in(request)
    users = await on_user_channel(request, platform_of(request).directory.list_users, user)
    return render(request, "users.html", users=[user_view(u) for u in users])
