"""`moonrun group list|show|wait|cancel` and `job submit --selector`: fan-out groups from a
terminal."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any, Final

import typer

from moonrun.client import profiles
from moonrun.client.library import OUTAGE_GRACE_S, Client, Group, Job, WaitTimedOut
from moonrun.client.verbs import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_TIMED_OUT,
    JsonOption,
    OutageGraceOption,
    ProfileOption,
    connect,
    print_fields,
    print_json,
    print_table,
    user_errors,
)

group_app = typer.Typer(
    no_args_is_help=True, help="List, read, wait for and cancel fan-out groups."
)

GROUP_FIELDS: Final = (
    "id",
    "selector",
    "kind",
    "job_count",
    "max_parallel",
    "stop_on_failure",
    "counts",
    "done",
    "created_at",
)
STATES: Final = ("queued", "accepted", "running", "retrying", "succeeded", "failed", "cancelled")
FOLLOW_POLL_S: Final = 1.0
"""How often a followed fan-out lists its jobs again for the ones that ended."""
GroupIdArgument = Annotated[str, typer.Argument(help="The group's id (grp_...)")]


@dataclass(frozen=True)
class FanOutAsked:
    """The job a `job submit --selector` asks for on every matching server."""

    selector: str
    kind: str
    payload: dict[str, Any] | None
    max_attempts: int | None
    not_before: str | None
    idempotency_key: str | None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    priority: int | None = None


def counts_text(counts: dict[str, int]) -> str:
    """`2 running, 1 succeeded` (the states with none left out)."""
    return ", ".join(f"{counts[state]} {state}" for state in STATES if counts.get(state)) or "-"


def show_group(group: Group, as_json: bool) -> None:
    if as_json:
        print_json(group.data)
    else:
        print_fields({**group.data, "counts": counts_text(group.counts)}, GROUP_FIELDS)


def exit_for_group(group: Group) -> None:
    """Exit 0 when every job succeeded, 3 when one failed, 4 when one was cancelled (and
    none failed), 5 while some have not ended."""
    if not group.done:
        raise typer.Exit(EXIT_TIMED_OUT)
    if group.counts.get("failed"):
        raise typer.Exit(EXIT_FAILED)
    if group.counts.get("cancelled"):
        raise typer.Exit(EXIT_CANCELLED)


def job_line(job: Job, names: dict[str, str]) -> str:
    """`web-1  job_x  failed: exit_status: exit 1`: one server's job as it ended."""
    error = (job.terminal or {}).get("error") or {}
    said = ": ".join(str(part) for part in (error.get("code"), error.get("message")) if part)
    said = f": {said}" if said and said != job.state else ""
    return f"{names.get(job.server_id, job.server_id)}  {job.id}  {job.state}{said}"


def fan_out(
    ctx: typer.Context,
    profile: str,
    asked: FanOutAsked,
    *,
    max_parallel: int | None,
    stop_on_failure: bool,
    wait: bool,
    outage_grace: float,
    as_json: bool,
) -> None:
    """Fan the job out; with `wait`, print a line per server as its job ends and exit as
    `group wait` does."""
    with connect(ctx, profile, outage_grace_s=outage_grace) as client:
        made = client.fanout(
            asked.selector,
            asked.kind,
            asked.payload,
            max_parallel=max_parallel,
            stop_on_failure=stop_on_failure,
            max_attempts=asked.max_attempts,
            not_before=asked.not_before,
            idempotency_key=asked.idempotency_key,
            concurrency_key=asked.concurrency_key,
            concurrency_limit=asked.concurrency_limit,
            priority=asked.priority,
        )
        if not wait:
            if as_json:
                print_json({"group": made.group.data, "jobs": [job.data for job in made.jobs]})
            else:
                typer.echo(f"group {made.group.id}: {made.group.job_count} jobs")
                print_table(("id", "server_id", "state"), (job.data for job in made.jobs))
            return
        if not as_json:
            typer.echo(
                f"group {made.group.id}: {made.group.job_count} jobs; "
                "a line per server as its job ends",
                err=True,
            )
        group = _follow(client, made.group.id, quiet=as_json)
        if as_json:
            jobs = sorted(client.jobs(group=group.id), key=lambda job: job.id)
            print_json({"group": group.data, "jobs": [job.data for job in jobs]})
        else:
            typer.echo(f"group {group.id}: {counts_text(group.counts)}")
    exit_for_group(group)


def _follow(client: Client, group_id: str, *, quiet: bool) -> Group:
    """Until every job of the group ended: a line for each job as it ends (unless `quiet`)."""
    names = {server.id: server.name for server in client.servers()}
    said: set[str] = set()
    while True:
        group = client.group(group_id)
        ended = [job for job in client.jobs(group=group_id) if job.ended and job.id not in said]
        for job in sorted(ended, key=lambda job: (names.get(job.server_id, ""), job.id)):
            said.add(job.id)
            if not quiet:
                typer.echo(job_line(job, names))
        if group.done:
            return group
        time.sleep(FOLLOW_POLL_S)


@group_app.command("list")
@user_errors
def group_list(
    ctx: typer.Context,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=200, help="At most this many (the newest)")
    ] = 50,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """The groups you made, newest first, with how many of their jobs are in each state."""
    with connect(ctx, profile) as client:
        groups = client.groups(limit)
    if as_json:
        print_json([group.data for group in groups])
        return
    rows = ({**group.data, "counts": counts_text(group.counts)} for group in groups)
    print_table(("id", "selector", "kind", "job_count", "counts", "created_at"), rows)


@group_app.command("show")
@user_errors
def group_show(
    ctx: typer.Context,
    group_id: GroupIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """One group: its selector, options and how many of its jobs are in each state."""
    with connect(ctx, profile) as client:
        show_group(client.group(group_id), as_json)


@group_app.command("wait")
@user_errors
def group_wait(
    ctx: typer.Context,
    group_id: GroupIdArgument,
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0, help="Give up after this many seconds")
    ] = None,
    outage_grace: OutageGraceOption = OUTAGE_GRACE_S,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Wait until every job of the group ended. Exit 0 all succeeded, 3 one failed, 4 one was
    cancelled, 5 timed out."""
    with connect(ctx, profile, outage_grace_s=outage_grace) as client:
        try:
            group = client.wait_group(group_id, timeout)
        except WaitTimedOut:
            group = client.group(group_id)
    show_group(group, as_json)
    exit_for_group(group)


@group_app.command("cancel")
@user_errors
def group_cancel(
    ctx: typer.Context,
    group_id: GroupIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Ask every job of the group that has not ended to cancel (waiting ones end at once)."""
    with connect(ctx, profile) as client:
        show_group(client.cancel_group(group_id), as_json)
