"""The fan-out pages: a form that fans a job out by selector, the groups one made (newest
first, with their counts), and one group's page (its counts and jobs, live until every job has
ended, and Cancel)."""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from moonrun.errors import IdempotencyConflict, InvalidRequest, MoonrunError
from moonrun.scheduling.groups import MAX_PARALLEL_LIMIT
from moonrun.scheduling.records import User
from moonrun.scheduling.views import group_view, job_view
from moonrun.service.specs import JobSpec
from moonrun.web import submitform
from moonrun.web.pages import checked_form, on_user_channel, platform_of, render, signed_in

router = APIRouter(include_in_schema=False)
SHOWN_JOBS = 200
"""A group's page lists at most this many of its jobs (newest first); the API lists them all."""


SHOWN_GROUPS = 100
"""The groups page lists a person's newest this many."""


@router.get("/groups")
async def groups_page(request: Request) -> Response:
    user = await signed_in(request)
    groups = platform_of(request).service.groups
    states = await on_user_channel(request, groups.mine, user, SHOWN_GROUPS + 1)
    shown = [group_view(state.group, state.counts) for state in states[:SHOWN_GROUPS]]
    return render(request, "groups.html", groups=shown, more=len(states) > SHOWN_GROUPS)


# -- fanning out (routed before /groups/{group_id}, which would take "new" for an id) ---------


@router.get("/groups/new")
async def fanout_page(request: Request) -> Response:
    user = await signed_in(request)
    return _form(request, user, {"kind": "command", "payload": '{"argv": ["uptime"]}'})


@router.post("/groups/new")
async def fan_out(request: Request) -> Response:
    user = await signed_in(request)
    fields = await checked_form(request)
    typed = {
        name: fields.get(name, "").strip()
        for name in (
            "selector",
            "kind",
            "payload",
            "max_attempts",
            "max_parallel",
            "priority",
            "concurrency_key",
            "concurrency_limit",
        )
    }
    typed["stop_on_failure"] = "on" if fields.get("stop_on_failure") else ""
    try:
        spec = JobSpec(
            kind=typed["kind"],
            payload=submitform.parse_payload(typed["payload"]),
            max_attempts=submitform.parse_attempts(typed["max_attempts"]),
            priority=submitform.parse_priority(typed["priority"]),
            concurrency=submitform.parse_concurrency(
                typed["concurrency_key"], typed["concurrency_limit"]
            ),
        )
        made = await on_user_channel(
            request,
            platform_of(request).service.groups.fanout,
            user,
            typed["selector"],
            spec,
            max_parallel=_max_parallel(typed["max_parallel"]),
            stop_on_failure=bool(typed["stop_on_failure"]),
            idempotency_key=fields.get("submit_key") or None,
        )
    except (InvalidRequest, IdempotencyConflict) as error:
        return _form(request, user, typed, error)
    return RedirectResponse(f"/groups/{quote(made.group.id)}", status_code=303)


def _max_parallel(text: str) -> int | None:
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidRequest(
            "max_parallel must be a whole number",
            fields=(("max_parallel", "must be a whole number"),),
        ) from None


def _form(
    request: Request, user: User, typed: dict[str, str], error: MoonrunError | None = None
) -> Response:
    """The fan-out form, with what was typed and, after a refusal, why (never a value)."""
    context: dict[str, Any] = {
        "typed": typed,
        "limit": MAX_PARALLEL_LIMIT,
        "submit_key": secrets.token_urlsafe(16),
        "error": {"code": error.code, "message": error.message} if error else None,
        "problems": [{"field": f, "message": m} for f, m in error.fields] if error else [],
    }
    return render(request, "fanout.html", 200 if error is None else error.status, **context)


# -- one group ---------------------------------------------------------------------------------


@router.get("/groups/{group_id}")
async def group_page(request: Request, group_id: str, fragment: bool = False) -> Response:
    user = await signed_in(request)
    platform = platform_of(request)

    def read(actor: User) -> tuple[Any, Any, dict[str, str]]:
        state = platform.service.groups.get(actor, group_id)
        page = platform.service.list_jobs(actor, group_id=group_id, limit=SHOWN_JOBS)
        names = {server.id: server.name for server in platform.directory.list_servers(actor)}
        return state, page, names

    state, page, names = await on_user_channel(request, read, user)
    view = group_view(state.group, state.counts)
    context: dict[str, Any] = {
        "group": view,
        "jobs": sorted(
            (job_view(job) for job in page.jobs),
            key=lambda job: (names.get(job["server_id"], job["server_id"]), job["id"]),
        ),
        "more": page.next_cursor is not None,
        "server_names": names,
        "final": view["done"],
        "live_url": f"/groups/{quote(group_id)}?fragment=1",
    }
    return render(request, "_group_detail.html" if fragment else "group.html", **context)


@router.post("/groups/{group_id}/cancel")
async def cancel_group(request: Request, group_id: str) -> Response:
    user = await signed_in(request)
    await checked_form(request)
    await on_user_channel(request, platform_of(request).service.groups.cancel, user, group_id)
    return RedirectResponse(f"/groups/{quote(group_id)}", status_code=303)
