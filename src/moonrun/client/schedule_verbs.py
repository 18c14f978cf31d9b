"""`moonrun schedule create|list|show|pause|resume|trigger|delete`: a server's recurring jobs,
or (`--selector`) recurring fan-outs: a group per firing."""

from __future__ import annotations

from typing import Annotated, Any, Final

import typer

from moonrun.client import profiles
from moonrun.client.library import Schedule
from moonrun.client.verbs import (
    JsonOption,
    ProfileOption,
    connect,
    print_fields,
    print_json,
    print_table,
    read_payload,
    server_named,
    user_errors,
)

schedule_app = typer.Typer(
    no_args_is_help=True, help="Create and manage recurring jobs (cron schedules)."
)

LIST_FIELDS: Final = ("id", "name", "target", "cron", "timezone", "kind", "next", "paused")
SHOW_FIELDS: Final = (
    "id",
    "name",
    "server_id",
    "selector",
    "max_parallel",
    "cron",
    "timezone",
    "kind",
    "priority",
    "overlap",
    "catchup_window_s",
    "paused",
    "owner_disabled",
    "next_times",
    "last_firing",
    "skipped",
    "missed",
    "unmatched",
)
ScheduleIdArgument = Annotated[str, typer.Argument(help="The schedule's id")]


def _fields(schedule: Schedule) -> dict[str, Any]:
    data = schedule.data
    return {
        **data,
        "server_id": schedule.server_id or "-",
        "selector": schedule.selector or "-",
        "max_parallel": data.get("max_parallel") or "-",
        "unmatched": schedule.unmatched,
        "target": schedule.server_id or f"selector {schedule.selector}",
        "kind": schedule.kind,
        "priority": data["job"].get("priority", 5),
        "next": data["next_times"][0] if data["next_times"] else "-",
        "next_times": ", ".join(data["next_times"]) or "-",
        "last_firing": _last_firing(data["last_firing"]),
    }


def _last_firing(last: dict[str, Any] | None) -> str:
    if last is None:
        return "-"
    if last.get("job_id") is not None:
        return f"{last['scheduled_for']} {last['job_id']} ({last['job_state'] or 'gone'})"
    group_id = last.get("group_id")
    if group_id is None:
        return f"{last['scheduled_for']} (no server matched)"
    done = last.get("group_done")
    state = "gone" if done is None else "done" if done else "running"
    return f"{last['scheduled_for']} {group_id} ({state})"


def _show(schedule: Schedule, as_json: bool) -> None:
    if as_json:
        print_json(schedule.data)
    else:
        print_fields(_fields(schedule), SHOW_FIELDS)


@schedule_app.command("create")
@user_errors
def schedule_create(
    ctx: typer.Context,
    server_id: Annotated[
        str | None,
        typer.Argument(
            help="The server's id, or its name where no other you see has it (none with --selector)"
        ),
    ] = None,
    name: Annotated[str, typer.Option("--name", help="What the schedule is for")] = "",
    cron: Annotated[
        str, typer.Option("--cron", help="5 cron fields, or @hourly, @daily, @weekly, ...")
    ] = "",
    kind: Annotated[str, typer.Option("--kind", help="The job kind each firing creates")] = "",
    payload: Annotated[
        str | None, typer.Option("--payload", help="The job's payload: JSON, or @FILE")
    ] = None,
    timezone: Annotated[
        str, typer.Option("--timezone", help="IANA time zone of the cron times")
    ] = "UTC",
    overlap: Annotated[
        str,
        typer.Option("--overlap", help="While the previous job runs: skip, allow, cancel_previous"),
    ] = "skip",
    catchup_window_s: Annotated[
        int | None,
        typer.Option(
            "--catchup-window",
            help="Seconds a missed time may still fire [default: the platform's, 60]",
        ),
    ] = None,
    paused: Annotated[bool, typer.Option("--paused", help="Create it paused")] = False,
    max_attempts: Annotated[
        int | None, typer.Option("--max-attempts", help="Attempts of each job")
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option("--priority", min=0, max=9, help="Each job's priority, 0 to 9 (default 5)"),
    ] = None,
    concurrency_key: Annotated[
        str | None,
        typer.Option(
            "--concurrency-key",
            help="At most --concurrency-limit of your jobs with this key run at once",
        ),
    ] = None,
    concurrency_limit: Annotated[
        int | None,
        typer.Option(
            "--concurrency-limit", min=1, max=1000, help="With --concurrency-key (default 1)"
        ),
    ] = None,
    selector: Annotated[
        str | None,
        typer.Option(
            "--selector",
            help="In place of a SERVER: each firing is a group, one job on each of your "
            "servers whose labels match then (role=web,env=prod)",
        ),
    ] = None,
    max_parallel: Annotated[
        int | None,
        typer.Option(
            "--max-parallel",
            min=1,
            max=1000,
            help="With --selector: at most N of a firing's jobs at once",
        ),
    ] = None,
    stop_on_failure: Annotated[
        bool,
        typer.Option(
            "--stop-on-failure",
            help="With --selector: once one job of a firing fails, cancel its queued ones",
        ),
    ] = False,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Create a schedule: a job of KIND on SERVER at every time of CRON in TIMEZONE, or with
    --selector instead of a SERVER a group of them, on every server of yours matching then."""
    for option, value in (("--name", name), ("--cron", cron), ("--kind", kind)):
        if not value:
            raise typer.BadParameter(f"{option} is needed")
    if (server_id is None) == (selector is None):
        raise typer.BadParameter("give a SERVER or --selector, exactly one")
    if selector is None and (max_parallel is not None or stop_on_failure):
        raise typer.BadParameter("--max-parallel and --stop-on-failure need --selector")
    with connect(ctx, profile) as client:
        schedule = client.create_schedule(
            None if server_id is None else server_named(client, server_id),
            name,
            cron,
            kind,
            read_payload(payload),
            timezone=timezone,
            overlap=overlap,
            catchup_window_s=catchup_window_s,
            paused=paused,
            max_attempts=max_attempts,
            priority=priority,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            selector=selector,
            max_parallel=max_parallel,
            stop_on_failure=stop_on_failure,
        )
    _show(schedule, as_json)


@schedule_app.command("list")
@user_errors
def schedule_list(
    ctx: typer.Context,
    server: Annotated[
        str | None, typer.Option("--server", help="Only this server's (its id or name)")
    ] = None,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """The schedules of the servers whose jobs you manage, and your selector schedules."""
    with connect(ctx, profile) as client:
        schedules = client.schedules(server_named(client, server) if server else None)
    if as_json:
        print_json([schedule.data for schedule in schedules])
    else:
        print_table(LIST_FIELDS, (_fields(schedule) for schedule in schedules))


@schedule_app.command("show")
@user_errors
def schedule_show(
    ctx: typer.Context,
    schedule_id: ScheduleIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """One schedule: its next 5 times, its last firing, and the times skipped and missed."""
    with connect(ctx, profile) as client:
        _show(client.schedule(schedule_id), as_json)


@schedule_app.command("pause")
@user_errors
def schedule_pause(
    ctx: typer.Context,
    schedule_id: ScheduleIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Stop firing until resumed."""
    with connect(ctx, profile) as client:
        _show(client.pause_schedule(schedule_id), as_json)


@schedule_app.command("resume")
@user_errors
def schedule_resume(
    ctx: typer.Context,
    schedule_id: ScheduleIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Fire again (at most one catch-up firing for the times missed while paused)."""
    with connect(ctx, profile) as client:
        _show(client.resume_schedule(schedule_id), as_json)


@schedule_app.command("trigger")
@user_errors
def schedule_trigger(
    ctx: typer.Context,
    schedule_id: ScheduleIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Fire now, outside the calendar, under the schedule's overlap policy."""
    with connect(ctx, profile) as client:
        schedule, made = client.trigger_schedule(schedule_id)
    if as_json:
        job_id = None if schedule.selector is not None else made
        group_id = made if schedule.selector is not None else None
        print_json({"schedule": schedule.data, "job_id": job_id, "group_id": group_id})
    elif made is not None:
        typer.echo(made)
    elif schedule.selector is not None and schedule.last_group_id is None:
        # Skipping needs a previous group still running: this firing matched nothing.
        typer.echo(f"no server matched the selector of schedule {schedule_id}")
    else:
        what = "group" if schedule.selector is not None else "job"
        typer.echo(f"skipped: the previous {what} of schedule {schedule_id} has not ended")


@schedule_app.command("delete")
@user_errors
def schedule_delete(
    ctx: typer.Context,
    schedule_id: ScheduleIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Delete a schedule; the jobs it made stay."""
    with connect(ctx, profile) as client:
        deleted = client.delete_schedule(schedule_id)
    if as_json:
        print_json(deleted.data)
    else:
        typer.echo(f"schedule {schedule_id} deleted")
