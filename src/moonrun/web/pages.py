"""The console's pages. They call the same service and build the same JobView as the API:
there is no second projection, and nothing a user may not see reaches a template."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
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
    TooLarge,
    Unauthenticated,
)
from moonrun.http.platform import on_user_channel, platform_of
from moonrun.scheduling.jobs import JobState
from moonrun.scheduling.records import User
from moonrun.scheduling.time import format_instant
from moonrun.scheduling.views import EndpointView, job_view, server_view, user_view
from moonrun.security.access import can_manage_admins, require
from moonrun.service.answers import JobPage
from moonrun.service.directory import Directory
from moonrun.service.scheduling import SchedulingService
from moonrun.service.websessions import SESSION_COOKIE, SIGN_IN_COOKIE, SIGN_IN_FORM_TTL_S
from moonrun.web import logview, progressview, submitform

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
FORM_FIELDS = 32
"""Fields a console form may have (a form with more is 413 `too_large`)."""
MAX_BULK_CANCEL = 200
"""Jobs one "Cancel selected" may name."""
RUN_DATA_DIR = "/var/lib/moonrun-run"
"""The data directory the join command names, as `moonrun endpoint create` prints it."""
NOTICES = {
    "endpoint_drained": "The endpoint is draining: it gets no new jobs; its running jobs finish.",
    "endpoint_undrained": "The endpoint takes jobs again.",
    "endpoint_removed": "The endpoint is removed; its Run is refused from now on.",
    "user_disabled": "The user is disabled: their API tokens and console sessions are refused.",
    "user_enabled": "The user is enabled again.",
    "password_set": "The password is set.",
    "server_created": "The server is created.",
    "server_removed": "The server is removed; its ended jobs stay readable by platform admins.",
}
"""What a form that worked says on the page it leads back to (`?done=`). Only these fixed
texts: a page never shows text taken from its address."""


def environment() -> Environment:
    templates = Environment(
        loader=PackageLoader("moonrun.web", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    templates.globals["progress_shown"] = progressview.progress_shown
    templates.globals["terminal_states"] = TERMINAL_STATES
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
        return path.removesuffix("/cancel")  # /jobs/cancel (Cancel selected) -> /jobs
    if path.startswith("/jobs/") and path.endswith("/rerun"):
        return path.removesuffix("/rerun")
    if path == "/jobs/new":
        return path
    for page in ("/servers", "/endpoints", "/users", "/account"):
        if path == page or path.startswith(page + "/"):
            return page
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
    wait_s = platform.throttle.reserve(name, address)  # counted before it is checked
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
    platform.throttle.succeeded(name, address)
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


@dataclass(frozen=True, slots=True)
class Listing:
    """What the jobs page lists: its filters and page, as its query (or a form) gives them."""

    server_id: str | None = None
    state: str | None = None
    kind: str | None = None
    id: str | None = None
    """The start of a job id as a person typed it, with or without `job_`."""
    cursor: str | None = None

    @classmethod
    def of(cls, values: Mapping[str, str | None]) -> Listing:
        """From query or form values; empty ones are no filter."""
        return cls(**{name: (values.get(name) or "").strip() or None for name in _LISTING})

    def query(self) -> dict[str, str]:
        return {name: value for name in _LISTING if (value := getattr(self, name))}


_LISTING: Final = ("server_id", "state", "kind", "id", "cursor")


@router.get("/jobs")
async def jobs_page(
    request: Request,
    server_id: str | None = None,
    state: str | None = None,
    kind: str | None = None,
    id: str | None = None,
    cursor: str | None = None,
    fragment: bool = False,
    cancelled: str | None = None,
    cancelling: str | None = None,
    ended: str | None = None,
    refused: str | None = None,
) -> Response:
    user = await signed_in(request)
    counts = CancelCounts.of(cancelled, cancelling, ended, refused)
    listing = Listing.of(
        {"server_id": server_id, "state": state, "kind": kind, "id": id, "cursor": cursor}
    )
    return await _jobs(request, user, listing, fragment=fragment, notice=counts.notice())


async def _jobs(
    request: Request,
    user: User,
    listing: Listing,
    *,
    fragment: bool = False,
    notice: str = "",
    problem: MoonrunError | None = None,
) -> Response:
    """The jobs page (or its live fragment), with what a form did or why it did not."""
    platform = platform_of(request)
    search_error = ""
    try:
        page = await on_user_channel(
            request,
            platform.service.list_jobs,
            user,
            server_id=listing.server_id,
            state=listing.state,
            limit=25,
            cursor=listing.cursor,
            kind=listing.kind,
            id_prefix=_id_prefix(listing.id),
        )
    except InvalidRequest as error:
        # A search too broad or malformed: said on the page, whose filters then start empty
        # (a refused value is never shown again: it may be a secret typed in the wrong box).
        search_error = error.message
        page = JobPage((), None)
        listing = Listing(server_id=listing.server_id)
    servers = await on_user_channel(request, platform.directory.list_servers, user)
    online = await on_user_channel(
        request, platform.service.endpoints_online, [s.endpoint_id for s in servers]
    )
    names = {server.id: server.name for server in servers}
    filters = {name: value for name, value in listing.query().items() if name != "cursor"}
    cursor = listing.cursor
    older = (
        "/jobs?" + urlencode({**filters, "cursor": page.next_cursor}) if page.next_cursor else None
    )
    context: dict[str, Any] = {
        "jobs": [job_view(job) for job in page.jobs],
        "server_names": names,
        "servers": [server_view(server, online[server.endpoint_id]) for server in servers],
        "states": [s.value for s in JobState],
        "filters": filters,
        "cursor": cursor or "",
        "older": older,
        "live_url": "/jobs?" + urlencode({**filters, "fragment": "1", **_cursor(cursor)}),
        "search_error": search_error,
        "notice": notice,
        "problem": problem.message if problem else "",
    }
    status = problem.status if problem else 422 if search_error else 200
    return render(request, "_jobs_table.html" if fragment else "jobs.html", status, **context)


@dataclass(frozen=True, slots=True)
class CancelCounts:
    """What "Cancel selected" did: jobs that ended cancelled at once, jobs whose Run was asked
    to stop them, jobs that had already ended (left alone), and jobs it could not cancel."""

    cancelled: int = 0
    cancelling: int = 0
    ended: int = 0
    refused: int = 0

    @classmethod
    def of(cls, *values: str | None) -> CancelCounts:
        """From the page's query (anything but a small count counts as 0)."""
        return cls(*(int(v) if v and v.isdigit() and len(v) <= 4 else 0 for v in values))

    def query(self) -> dict[str, int]:
        return {
            "cancelled": self.cancelled,
            "cancelling": self.cancelling,
            "ended": self.ended,
            "refused": self.refused,
        }

    def notice(self) -> str:
        parts = [
            _jobs_phrase(self.cancelled, "cancelled"),
            _jobs_phrase(self.cancelling, "asked to stop (cancelling)"),
            _jobs_phrase(self.ended, "had already ended", were=False),
            _jobs_phrase(self.refused, "could not be cancelled (not yours, or gone)", were=False),
        ]
        said = "; ".join(part for part in parts if part)
        return said[:1].upper() + said[1:] + "." if said else ""


def _jobs_phrase(count: int, what: str, *, were: bool = True) -> str:
    if not count:
        return ""
    verb = ("was " if count == 1 else "were ") if were else ""
    return f"{count} job{'' if count == 1 else 's'} {verb}{what}"


def cancel_each(service: SchedulingService, user: User, job_ids: list[str]) -> CancelCounts:
    """Cancel each job through `service.cancel_job`, as one cancel would; a job that has
    already ended is left alone, and one the user may not cancel (or that does not exist) is
    counted, not raised."""
    cancelled = cancelling = ended = refused = 0
    for job_id in job_ids:
        try:
            if service.get_job(user, job_id).state.is_terminal:
                ended += 1
                continue
            outcome = service.cancel_job(user, job_id)
        except (Forbidden, NotFound):
            refused += 1
            continue
        if outcome.waits_on_run:
            cancelling += 1
        elif outcome.job.state is JobState.CANCELLED:
            cancelled += 1
        else:  # it ended otherwise in the meantime
            ended += 1
    return CancelCounts(cancelled, cancelling, ended, refused)


@router.post("/jobs/cancel")
async def cancel_jobs(request: Request) -> Response:
    """Cancel selected: each job named by a `job_id` field (at most `MAX_BULK_CANCEL`)."""
    user = await signed_in(request)
    fields = await checked_form(request, max_fields=MAX_BULK_CANCEL + FORM_FIELDS)
    listing = Listing.of(fields)
    job_ids = list(dict.fromkeys(job_id for job_id in fields.every("job_id") if job_id))
    problem: MoonrunError | None = None
    if not job_ids:
        problem = InvalidRequest("select at least one job to cancel")
    elif len(job_ids) > MAX_BULK_CANCEL:
        problem = TooLarge(f"select at most {MAX_BULK_CANCEL} jobs at once")
    if problem is not None:
        return await _jobs(request, user, listing, problem=problem)
    service = platform_of(request).service
    counts = await on_user_channel(request, cancel_each, service, user, job_ids)
    query = listing.query() | counts.query()
    return RedirectResponse("/jobs?" + urlencode(query), status_code=303)


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


# -- servers -----------------------------------------------------------------------------------


@router.get("/servers")
async def servers_page(request: Request, done: str | None = None) -> Response:
    user = await signed_in(request)
    return await _servers(request, user, notice=notice_of(done))


async def _servers(
    request: Request, user: User, *, notice: str = "", problem: MoonrunError | None = None
) -> Response:
    """The servers page, with what a form did or why it did not."""
    platform = platform_of(request)
    directory, service = platform.directory, platform.service
    servers = await on_user_channel(request, directory.list_servers, user)
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


# -- endpoints ---------------------------------------------------------------------------------


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


# -- users and the signed-in user's account ----------------------------------------------------


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


def _password_of(fields: Form) -> str:
    """The form's new password, typed twice the same."""
    password = fields.get("password", "")
    if password != fields.get("password_again", ""):
        raise InvalidRequest("the two passwords differ")
    return password


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
            password=_password_of(fields) or None,
        )
    except MoonrunError as error:
        return await _users(request, user, problem=shown(error))
    heading = f"User {created.user.name} is created"
    return _api_token_page(
        request, heading, created.user, created.api_token, rotated=False, done="/users"
    )


def _api_token_page(
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
        person, token = await on_user_channel(request, _rotate, directory, user, user_id)
    except MoonrunError as error:
        return await _people(request, user, shown(error))
    heading = f"A new API token for {person.name}"
    return _api_token_page(request, heading, person, token, rotated=True, done=_people_of(user))


def _rotate(directory: Directory, actor: User, user_id: str) -> tuple[User, str]:
    """As the API's rotate: the new token, and the user it belongs to."""
    token = directory.rotate_api_token(actor, user_id)
    return directory.user_by_id(user_id), token


@router.post("/users/{user_id}/password")
async def set_password(request: Request, user_id: str) -> Response:
    """Set a user's console password (platform admins for anyone; anyone for themself)."""
    user = await signed_in(request)
    fields = await checked_form(request)
    directory = platform_of(request).directory
    try:
        password = _password_of(fields)
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
    return _account(request, user, problem=problem)


@router.get("/account")
async def account_page(request: Request, done: str | None = None) -> Response:
    """The signed-in user: their own password and API token."""
    user = await signed_in(request)
    return _account(request, user, notice=notice_of(done))


def _account(
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
        password = _password_of(fields)
        await on_user_channel(request, directory.set_password, user, user.id, password)
    except MoonrunError as error:
        return _account(request, user, problem=shown(error))
    return back("/account", "password_set")


@router.post("/account/token")
async def rotate_own_token(request: Request) -> Response:
    """A new API token for oneself, shown once; the old ones stop working."""
    user = await signed_in(request)
    await checked_form(request)
    directory = platform_of(request).directory
    _, token = await on_user_channel(request, _rotate, directory, user, user.id)
    return _api_token_page(
        request, "Your new API token", user, token, rotated=True, done="/account"
    )
