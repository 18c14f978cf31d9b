"""`moonrun schedule create|list|show|pause|resume|trigger|delete`: a server's recurring jobs."""

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

LIST_FIELDS: Final = ("id", "name", "server_id", "cron", "timezone", "kind", "next", "paused")
SHOW_FIELDS: Final = (
    "id",
    "name",
    "server_id",
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
)
ScheduleIdArgument = Annotated[str, typer.Argument(help="The schedule's id")]


def _fields(schedule: Schedule) -> dict[str, Any]:
    data = schedule.data
    last = data["last_firing"]
    return {
        **data,
        "kind": schedule.kind,
        "priority": data["job"].get("priority", 5),
        "next": data["next_times"][0] if data["next_times"] else "-",
        "next_times": ", ".join(data["next_times"]) or "-",
        "last_firing": "-"
        if last is None
        else f"{last['scheduled_for']} {last['job_id']} ({last['job_state'] or 'gone'})",
    }


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
        str, typer.Argument(help="The server's id, or its name where no other you see has it")
    ],
    name: Annotated[str, typer.Option("--name", help="What the schedule is for")],
    cron: Annotated[
        str, typer.Option("--cron", help="5 cron fields, or @hourly, @daily, @weekly, ...")
    ],
    kind: Annotated[str, typer.Option("--kind", help="The job kind each firing creates")],
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
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Create a schedule: a job of KIND at every time of CRON in TIMEZONE."""
    with connect(ctx, profile) as client:
        schedule = client.create_schedule(
            server_named(client, server_id),
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
    """The schedules of the servers whose jobs you manage."""
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
        schedule, job_id = client.trigger_schedule(schedule_id)
    if as_json:
        print_json({"schedule": schedule.data, "job_id": job_id})
    elif job_id is None:
        typer.echo(f"skipped: the previous job of schedule {schedule_id} has not ended")
    else:
        typer.echo(job_id)


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
