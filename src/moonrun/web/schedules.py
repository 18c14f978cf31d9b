"""A server's schedules page, and the page of one's selector schedules (a group per firing):
list, create (with a preview of the next times), pause, resume, trigger and delete."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from moonrun.errors import InvalidRequest, MoonrunError
from moonrun.scheduling.records import User
from moonrun.scheduling.schedules import DEFAULT_CATCHUP_WINDOW_S, Overlap
from moonrun.scheduling.time import format_instant
from moonrun.service.schedules import ScheduleSpec, ScheduleState
from moonrun.service.specs import JobSpec
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


def _row(state: ScheduleState) -> dict[str, Any]:
    schedule, last = state.schedule, state.last_job
    return {
        "id": schedule.id,
        "name": schedule.name,
        "selector": schedule.selector,
        "max_parallel": schedule.max_parallel,
        "last_scheduled_for": None
        if schedule.last_scheduled_for is None
        else format_instant(schedule.last_scheduled_for),
        "last_group_id": schedule.last_group_id,
        "last_group_done": state.last_group_done,
        "unmatched": schedule.unmatched,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "kind": json.loads(schedule.job_json)["kind"],
        "overlap": schedule.overlap.value,
        "paused": schedule.paused,
        "owner_disabled": state.owner_disabled,
        "next_times": [format_instant(t) for t in state.next_times],
        "last_job_id": schedule.last_job_id,
        "last_state": None if last is None else last.state.value,
        "skipped": schedule.skipped,
        "missed": schedule.missed,
    }


@router.get("/servers/{server_id}/schedules")
async def schedules_page(request: Request, server_id: str, done: str | None = None) -> Response:
    user = await signed_in(request)
    return await _page(request, user, server_id, notice=notice_of(done))


async def _page(
    request: Request,
    user: User,
    server_id: str | None,
    *,
    notice: str = "",
    problem: MoonrunError | None = None,
    form: dict[str, str] | None = None,
) -> Response:
    """A server's schedules page, or (`server_id` None) the actor's selector schedules."""
    platform = platform_of(request)
    schedules = platform.service.schedules
    if server_id is None:
        server = None
        states = await on_user_channel(request, schedules.selector_schedules, user)
    else:
        server = await on_user_channel(request, platform.directory.get_server, user, server_id)
        states = await on_user_channel(request, schedules.list_schedules, user, server_id)
    return render_outcome(
        request,
        "schedules.html",
        notice,
        problem,
        server=server,
        schedules=[_row(state) for state in states],
        overlaps=[o.value for o in Overlap],
        form=form
        or {
            "name": "",
            "cron": "0 3 * * *",
            "timezone": "UTC",
            "kind": "",
            "payload": "{}",
            "overlap": Overlap.SKIP.value,
            "catchup_window_s": str(DEFAULT_CATCHUP_WINDOW_S),
            "selector": "",
            "max_parallel": "",
        },
    )


@router.get("/schedules")
async def selector_schedules_page(request: Request, done: str | None = None) -> Response:
    """The selector schedules one made (every one, for platform admins), and their form."""
    user = await signed_in(request)
    return await _page(request, user, None, notice=notice_of(done))


@router.get("/schedules/preview")
async def selector_preview(request: Request, cron: str = "", timezone: str = "UTC") -> HTMLResponse:
    """The selector schedules form's preview fragment."""
    await signed_in(request)
    return _preview(request, cron, timezone)


@router.post("/schedules")
async def create_selector_schedule(request: Request) -> Response:
    user = await signed_in(request)
    fields = await checked_form(request)
    form = {name: fields.get(name, "") for name in (*FORM_FIELDS, "selector", "max_parallel")}
    schedules = platform_of(request).service.schedules
    try:
        limit = form["max_parallel"].strip()
        spec = dataclasses.replace(
            _spec(form, fields),
            selector=form["selector"].strip(),
            max_parallel=_whole(limit, "max_parallel") if limit else None,
            stop_on_failure=bool(fields.get("stop_on_failure")),
        )
        await on_user_channel(request, schedules.create, user, None, spec)
    except MoonrunError as error:
        return await _page(request, user, None, problem=shown(error), form=form)
    return back("/schedules", "schedule_created")


@router.get("/servers/{server_id}/schedules/preview")
async def preview(
    request: Request, server_id: str, cron: str = "", timezone: str = "UTC"
) -> HTMLResponse:
    """The next 5 times of a calendar as the form's preview fragment (the script fetches it
    as the calendar is typed)."""
    user = await signed_in(request)
    platform = platform_of(request)
    await on_user_channel(request, platform.directory.get_server, user, server_id)
    return _preview(request, cron, timezone)


def _preview(request: Request, cron: str, timezone: str) -> HTMLResponse:
    try:
        schedules = platform_of(request).service.schedules
        times = [format_instant(t) for t in schedules.preview(cron, timezone)]
        problem = ""
    except MoonrunError as error:
        times, problem = [], error.message
    return render(request, "_cron_preview.html", times=times, preview_problem=problem)


@router.post("/servers/{server_id}/schedules")
async def create_schedule(request: Request, server_id: str) -> Response:
    user = await signed_in(request)
    fields = await checked_form(request)
    form = {name: fields.get(name, "") for name in FORM_FIELDS}
    schedules = platform_of(request).service.schedules
    try:
        spec = _spec(form, fields)
        await on_user_channel(request, schedules.create, user, server_id, spec)
    except MoonrunError as error:
        return await _page(request, user, server_id, problem=shown(error), form=form)
    return back(f"/servers/{quote(server_id)}/schedules", "schedule_created")


@router.post("/schedules/{schedule_id}/{action}")
async def act(request: Request, schedule_id: str, action: str) -> Response:
    """Pause, resume, trigger or delete, then back to the server's schedules."""
    user = await signed_in(request)
    await checked_form(request)
    schedules = platform_of(request).service.schedules
    verbs = {
        "pause": (schedules.pause, "schedule_paused"),
        "resume": (schedules.resume, "schedule_resumed"),
        "trigger": (schedules.trigger, "schedule_triggered"),
        "delete": (schedules.delete, "schedule_deleted"),
    }
    if action not in verbs:
        raise InvalidRequest("unknown schedule action")
    state = await on_user_channel(request, schedules.get, user, schedule_id)
    work, done = verbs[action]
    await on_user_channel(request, work, user, schedule_id)
    return back(schedules_page_of(state.schedule.server_id), done)


def schedules_page_of(server_id: str | None) -> str:
    """The page that lists a schedule: its server's, or the selector schedules'."""
    return "/schedules" if server_id is None else f"/servers/{quote(server_id)}/schedules"


FORM_FIELDS: Final = ("name", "cron", "timezone", "kind", "payload", "overlap", "catchup_window_s")


def _spec(form: dict[str, str], fields: Mapping[str, Any]) -> ScheduleSpec:
    return ScheduleSpec(
        name=form["name"].strip(),
        cron=form["cron"],
        job=JobSpec(form["kind"].strip(), _payload(form["payload"])),
        timezone=form["timezone"].strip() or "UTC",
        overlap=form["overlap"],
        catchup_window_s=_whole(form["catchup_window_s"]),
        paused=bool(fields.get("paused")),
    )


def _payload(text: str) -> dict[str, Any]:
    try:
        payload = json.loads(text or "{}")
    except ValueError:
        raise InvalidRequest("payload must be JSON") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("payload must be a JSON object")
    return payload


def _whole(text: str, field: str = "catchup_window_s") -> int:
    if not text.strip().isdigit() or len(text.strip()) > 9:
        what = "of seconds" if field == "catchup_window_s" else ""
        raise InvalidRequest(f"{field} must be a whole number {what}".rstrip())
    return int(text.strip())
