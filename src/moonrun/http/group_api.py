"""The user API's fan-out groups (docs/protocol.md, "Groups"): each route calls one use case of
`service/groups.py` as the caller."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from moonrun.errors import InvalidRequest
from moonrun.http.api import Call, JsonReply, Route
from moonrun.http.schemas import FanoutRequest
from moonrun.http.user_api import IDEMPOTENCY, as_caller, job_spec
from moonrun.scheduling.records import User
from moonrun.scheduling.views import group_view, job_view
from moonrun.service.groups import MAX_GROUPS_LISTED, FanOut, GroupState
from moonrun.wire.user import FanoutAnswer, GroupsAnswer, GroupView


class GroupReadQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    wait_s: float | None = Field(default=None, gt=0, le=3600)
    until: Literal["terminal"] | None = None


class GroupsQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=MAX_GROUPS_LISTED)


def view(state: GroupState) -> GroupView:
    return group_view(state.group, state.counts)


async def fanout(call: Call) -> JsonReply[FanoutAnswer]:
    """Queue one job on each server the caller may submit to whose labels match the
    selector, all at once, as one group. The same Idempotency-Key with the same body gives
    the same group."""
    body: FanoutRequest = call.body
    groups = call.platform.service.groups
    key = call.headers.get("idempotency-key")

    def make(user: User) -> tuple[FanOut, GroupState]:
        made = groups.fanout(
            user,
            body.selector,
            job_spec(body),
            max_parallel=body.max_parallel,
            stop_on_failure=body.stop_on_failure,
            idempotency_key=key,
        )
        return made, groups.get(user, made.group.id)

    made, state = await as_caller(call, make)
    answer: FanoutAnswer = {"group": view(state), "jobs": [job_view(job) for job in made.jobs]}
    return JsonReply(201, answer)


async def list_groups(call: Call) -> GroupsAnswer:
    """The groups the caller made, newest first (the newest `limit`), with their counts."""
    query: GroupsQuery = call.query
    states = await as_caller(call, call.platform.service.groups.mine, query.limit)
    return {"groups": [view(state) for state in states]}


async def get_group(call: Call) -> GroupView:
    """The group with its jobs' counts by state. A blocking read: with `wait_s` and
    `until=terminal`, answer once every job has ended (the group as it is when the wait ends
    first)."""
    platform, query = call.platform, call.query
    groups, group_id = platform.service.groups, call.params["group_id"]
    if query.wait_s is None:
        if query.until is not None:
            raise InvalidRequest("until=terminal needs wait_s")
        return view(await as_caller(call, groups.get, group_id))
    if query.until is None:
        await as_caller(call, groups.get, group_id)  # 401, 403 and 404 come first
        raise InvalidRequest("wait_s needs until=terminal")
    credentials = call.credentials
    assert credentials is not None
    state = await groups.wait(
        lambda: credentials.check(platform),
        group_id,
        lambda state: state.done,
        wait_s=min(query.wait_s, platform.http.max_read_wait_s),
        waiting=call.waiting(),
    )
    return view(state)


async def cancel_group(call: Call) -> GroupView:
    """Ask every job of the group that has not ended to cancel: waiting ones end at once,
    running ones get a durable intent. The answer is the group after it."""
    groups = call.platform.service.groups
    return view(await as_caller(call, groups.cancel, call.params["group_id"]))


ROUTES: tuple[Route, ...] = (
    Route(
        method="POST", path="/api/v1/jobs/fanout", channel="user", auth="user",
        body=FanoutRequest, answer=FanoutAnswer, status=201, handler=fanout, headers=IDEMPOTENCY,
    ),
    Route(
        method="GET", path="/api/v1/groups", channel="user", auth="user",
        answer=GroupsAnswer, status=200, handler=list_groups, query=GroupsQuery,
    ),
    Route(
        method="GET", path="/api/v1/groups/{group_id}", channel="user", auth="user",
        answer=GroupView, status=200, handler=get_group, query=GroupReadQuery,
    ),
    Route(
        method="POST", path="/api/v1/groups/{group_id}/cancel", channel="user", auth="user",
        answer=GroupView, status=200, handler=cancel_group,
    ),
)  # fmt: skip
"""The groups' routes, in matching order."""
