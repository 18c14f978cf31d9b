"""The console as the wiring mounts it: every page's routes in one router, its templates and
static files, and the page an error on a console path gets."""

from __future__ import annotations

import contextlib
from urllib.parse import quote

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, PackageLoader, select_autoescape

from moonrun.errors import MoonrunError, Unauthenticated
from moonrun.service.websessions import SESSION_COOKIE
from moonrun.web import (
    account,
    endpoints,
    groups,
    jobs,
    progressview,
    schedules,
    servers,
    users,
)
from moonrun.web.pages import (
    TERMINAL_STATES,
    ConsolePlatform,
    FormExpired,
    on_user_channel,
    platform_of,
    render,
)

NOT_CONSOLE = ("/api/", "/run/", "/healthz", "/metrics", "/openapi.json", "/docs", "/redoc")

router = APIRouter(include_in_schema=False)
"""Every console route, each resource's in its own module."""
for resource in (account, jobs, groups, servers, schedules, endpoints, users):
    router.include_router(resource.router)


def install(app: FastAPI, platform: ConsolePlatform) -> None:
    """Serve the console from `app` over `platform`: its pages, templates and static files."""
    app.state.console = platform
    app.state.templates = environment()
    app.include_router(router)
    app.mount("/static", StaticFiles(packages=[("moonrun.web", "static")]), "static")


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


async def error_page(request: Request, error: MoonrunError) -> Response:
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
    if path.startswith("/jobs/") and path.endswith("/delete"):
        return path.removesuffix("/delete")
    if path == "/jobs/new":
        return path
    for page in ("/servers", "/endpoints", "/users", "/account"):
        if path == page or path.startswith(page + "/"):
            return page
    return "/jobs"
