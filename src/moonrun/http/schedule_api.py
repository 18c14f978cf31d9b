"""The user API's schedules (docs/protocol.md, "Schedules"): each route calls one use case of
`service/schedules.py` as the caller, and answers the schedule's view."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from moonrun.errors import InvalidRequest
from moonrun.http.api import Call, Route
from moonrun.http.schemas import (
    ChangeScheduleRequest,
    CreateAnyScheduleRequest,
    CreateScheduleRequest,
    ScheduleJobRequest,
)
from moonrun.http.user_api import as_caller
from moonrun.scheduling.views import schedule_view
from moonrun.service.schedules import ScheduleSpec, ScheduleState
from moonrun.service.specs import JobSpec
from moonrun.wire.user import SchedulesAnswer, ScheduleView, TriggeredAnswer


class SchedulesQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: str | None = None
    """Only this server's schedules."""


def view(state: ScheduleState) -> ScheduleView:
    return schedule_view(
        state.schedule,
        state.last_job,
        owner_disabled=state.owner_disabled,
        next_times=state.next_times,
        last_group_done=state.last_group_done,
    )


def _job(body: ScheduleJobRequest) -> JobSpec:
    backoff = None if body.backoff is None else body.backoff.model_dump(exclude_none=True)
    return JobSpec(
        kind=body.kind,
        payload=body.payload,
        max_attempts=body.max_attempts,
        backoff=backoff,
        priority=body.priority,
        concurrency=None if body.concurrency is None else body.concurrency.model_dump(),
    )


def _spec(
    body: CreateScheduleRequest,
    *,
    selector: str | None = None,
    max_parallel: int | None = None,
    stop_on_failure: bool = False,
) -> ScheduleSpec:
    return ScheduleSpec(
        name=body.name,
        cron=body.cron,
        job=_job(body.job),
        timezone=body.timezone,
        overlap=body.overlap,
        catchup_window_s=body.catchup_window_s,
        paused=body.paused,
        selector=selector,
        max_parallel=max_parallel,
        stop_on_failure=stop_on_failure,
    )


async def create_schedule(call: Call) -> ScheduleView:
    """Create a schedule of a server whose jobs the caller manages."""
    spec = _spec(call.body)
    schedules = call.platform.service.schedules
    return view(await as_caller(call, schedules.create, call.params["server_id"], spec))


async def create_any_schedule(call: Call) -> ScheduleView:
    """Create a schedule of a server (`server_id`) or of a label `selector`: exactly one."""
    body: CreateAnyScheduleRequest = call.body
    spec = _spec(
        body,
        selector=body.selector,
        max_parallel=body.max_parallel,
        stop_on_failure=body.stop_on_failure,
    )
    schedules = call.platform.service.schedules
    return view(await as_caller(call, schedules.create, body.server_id, spec))


async def list_schedules(call: Call) -> SchedulesAnswer:
    """The schedules of the servers whose jobs the caller manages (`?server=` one of them)."""
    query: SchedulesQuery = call.query
    states = await as_caller(call, call.platform.service.schedules.list_schedules, query.server)
    return {"schedules": [view(state) for state in states]}


async def get_schedule(call: Call) -> ScheduleView:
    schedules = call.platform.service.schedules
    return view(await as_caller(call, schedules.get, call.params["schedule_id"]))


async def change_schedule(call: Call) -> ScheduleView:
    """Change the fields given; a new calendar starts after now."""
    body: ChangeScheduleRequest = call.body
    changes = {name: getattr(body, name) for name in body.model_fields_set}
    none = sorted(name for name, value in changes.items() if value is None)
    if none:
        raise InvalidRequest(f"{none[0]} cannot be null")
    if "job" in changes:
        changes["job"] = _job(changes["job"])
    schedules = call.platform.service.schedules
    return view(await as_caller(call, schedules.change, call.params["schedule_id"], changes))


async def delete_schedule(call: Call) -> ScheduleView:
    """Delete a schedule; the answer is the schedule as it was. Its jobs stay."""
    schedules = call.platform.service.schedules
    return view(await as_caller(call, schedules.delete, call.params["schedule_id"]))


async def pause_schedule(call: Call) -> ScheduleView:
    schedules = call.platform.service.schedules
    return view(await as_caller(call, schedules.pause, call.params["schedule_id"]))


async def resume_schedule(call: Call) -> ScheduleView:
    schedules = call.platform.service.schedules
    return view(await as_caller(call, schedules.resume, call.params["schedule_id"]))


async def trigger_schedule(call: Call) -> TriggeredAnswer:
    """Fire now, outside the calendar, under the overlap policy."""
    schedules = call.platform.service.schedules
    made = await as_caller(call, schedules.trigger, call.params["schedule_id"])
    return {"schedule": view(made.state), "job_id": made.job_id, "group_id": made.group_id}


ROUTES: tuple[Route, ...] = (
    Route(
        method="POST", path="/api/v1/servers/{server_id}/schedules", channel="user", auth="user",
        body=CreateScheduleRequest, answer=ScheduleView, status=201, handler=create_schedule,
    ),
    Route(
        method="POST", path="/api/v1/schedules", channel="user", auth="user",
        body=CreateAnyScheduleRequest, answer=ScheduleView, status=201,
        handler=create_any_schedule,
    ),
    Route(
        method="GET", path="/api/v1/schedules", channel="user", auth="user",
        answer=SchedulesAnswer, status=200, handler=list_schedules, query=SchedulesQuery,
    ),
    Route(
        method="GET", path="/api/v1/schedules/{schedule_id}", channel="user", auth="user",
        answer=ScheduleView, status=200, handler=get_schedule,
    ),
    Route(
        method="PATCH", path="/api/v1/schedules/{schedule_id}", channel="user", auth="user",
        body=ChangeScheduleRequest, answer=ScheduleView, status=200, handler=change_schedule,
    ),
    Route(
        method="DELETE", path="/api/v1/schedules/{schedule_id}", channel="user", auth="user",
        answer=ScheduleView, status=200, handler=delete_schedule,
    ),
    Route(
        method="POST", path="/api/v1/schedules/{schedule_id}/pause", channel="user",
        auth="user", answer=ScheduleView, status=200, handler=pause_schedule,
    ),
    Route(
        method="POST", path="/api/v1/schedules/{schedule_id}/resume", channel="user",
        auth="user", answer=ScheduleView, status=200, handler=resume_schedule,
    ),
    Route(
        method="POST", path="/api/v1/schedules/{schedule_id}/trigger", channel="user",
        auth="user", answer=TriggeredAnswer, status=200, handler=trigger_schedule,
    ),
)  # fmt: skip
"""The schedule routes, in matching order."""
