"""The user verbs of `moonrun` (login, job, endpoint, user, server), built on the client."""

from __future__ import annotations

import difflib
import enum
import functools
import itertools
import json
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Final, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from moonrun.client import profiles
from moonrun.client.drawn import safe_json
from moonrun.client.labelargs import apply_changes, labels_text, naming_labels, parse_pairs
from moonrun.client.library import OUTAGE_GRACE_S, Client, Job, WaitTimedOut
from moonrun.errors import InvalidRequest, MoonrunError, NotFound, Unauthenticated

P = ParamSpec("P")
R = TypeVar("R")

EXIT_ERROR: Final = 1
EXIT_FAILED: Final = 3
EXIT_CANCELLED: Final = 4
EXIT_TIMED_OUT: Final = 5
EXIT_OF_STATE: Final[Mapping[str, int]] = {
    "succeeded": 0,
    "failed": EXIT_FAILED,
    "cancelled": EXIT_CANCELLED,
}
PROGRESS_POLL_S: Final = 0.5
RUN_DATA_DIR: Final = "/var/lib/moonrun-run"
TAIL: Final = "moonrun.command_tail"


@dataclass(frozen=True)
class Environment:
    """What the user verbs take from the process environment; `cli.main` builds it."""

    config_home: Path
    platform: str | None = None
    token: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> Environment:
        return cls(
            profiles.config_home(environ),
            environ.get("MOONRUN_PLATFORM") or None,
            environ.get("MOONRUN_TOKEN") or None,
        )

    @property
    def config_path(self) -> Path:
        return profiles.config_path(self.config_home)


def _environment(ctx: typer.Context) -> Environment:
    found = ctx.find_object(Environment)
    if found is None:
        raise InvalidRequest("moonrun's user verbs need the environment (run them as `moonrun`)")
    return found


def user_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Report moonrun's errors as one line `moonrun: error: <code>: <message>` and exit 1."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except MoonrunError as error:
            typer.echo(f"moonrun: error: {error.code}: {error.message}", err=True)
            raise typer.Exit(EXIT_ERROR) from None

    return run


# -- options -------------------------------------------------------------------------------

ProfileOption = Annotated[
    str,
    typer.Option(
        "--profile",
        help="The profile in the config file; MOONRUN_PLATFORM and MOONRUN_TOKEN override it",
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print one JSON document with the API's keys")
]


def credentials(ctx: typer.Context, profile: str) -> tuple[str, str]:
    """The platform URL and API token: MOONRUN_PLATFORM / MOONRUN_TOKEN, else the profile's."""
    environment = _environment(ctx)
    platform, token = environment.platform, environment.token
    if platform is None or token is None:
        saved = profiles.load(environment.config_path).get(profile)
        if saved is None:
            raise Unauthenticated(
                f"not logged in (no profile {profile!r} in {environment.config_path}): "
                "run `moonrun login --platform URL`"
            )
        platform, token = platform or saved.platform, token or saved.token
    return platform, token


def connect(ctx: typer.Context, profile: str, *, outage_grace_s: float | None = None) -> Client:
    if outage_grace_s is None:
        return Client(*credentials(ctx, profile))
    return Client(*credentials(ctx, profile), outage_grace_s=outage_grace_s)


OutageGraceOption = Annotated[
    float,
    typer.Option(
        "--outage-grace",
        min=0,
        help="Seconds to keep following through a platform that does not answer "
        "(a restart) before giving up",
    ),
]


def server_named(client: Client, given: str) -> str:
    """The id of the server `given` names: an id (`srv_...`) as it is; else the one server of
    that name among those the caller may see. None is `not_found` and several are
    `invalid_request`, each listing what there is, so the next try can be right."""
    if given.startswith("srv_"):
        return given
    servers = client.servers()
    named = [server for server in servers if server.name == given]
    if len(named) == 1:
        return named[0].id
    if named:
        matches = ", ".join(f"{server.id} (endpoint {server.endpoint_id})" for server in named)
        raise InvalidRequest(f"{len(named)} servers are named {given!r}: {matches}; give its id")
    seen = ", ".join(sorted(server.name for server in servers)[:20]) or "none"
    raise NotFound(f"no server {given!r} (not an id, srv_..., nor a name you see: {seen})")


def endpoint_named(client: Client, given: str) -> str:
    """The id of the endpoint `given` names: an id (`ep_...`) as it is, else the endpoint of
    that name (endpoint names are unique; listing them needs a platform admin, as every verb
    that takes one does)."""
    if given.startswith("ep_"):
        return given
    endpoints = client.endpoints()
    for endpoint in endpoints:
        if endpoint.name == given:
            return endpoint.id
    seen = ", ".join(sorted(endpoint.name for endpoint in endpoints)[:20]) or "none"
    raise NotFound(f"no endpoint {given!r} (not an id, ep_..., nor a name: {seen})")


def user_named(client: Client, given: str) -> str:
    """The id of the user `given` names: an id (`usr_...`) as it is, else the user of that
    name (user names are unique; listing them needs a platform admin, as every verb that
    takes one this way does)."""
    if given.startswith("usr_"):
        return given
    for user in client.users():
        if user.name == given:
            return user.id
    raise NotFound(f"no user {given!r} (not an id, usr_..., nor a user's name)")


def kind_hint(client: Client, kind: str, server_id: str | None) -> str | None:
    """When a listing by `kind` found nothing: the kinds the Runs of the caller's servers (or
    of `server_id`) run, and the closest one, in case `kind` was a typo. None when `kind` is
    one of them (it simply has no jobs) or no Run said what it runs."""
    ids = [server_id] if server_id is not None else [s.id for s in client.servers()[:50]]
    known: set[str] = set()
    for one in ids:
        known.update(client.kinds(one).schemas)
    if not known or kind in known:
        return None
    close = difflib.get_close_matches(kind, sorted(known), n=1)
    mean = f" (did you mean {close[0]!r}?)" if close else ""
    runs = "this server's Run runs" if server_id is not None else "your servers' Runs run"
    return f"no jobs of kind {kind!r}{mean}; {runs} {', '.join(sorted(known))}"


# -- output --------------------------------------------------------------------------------


def stdout() -> Console:
    # Off a terminal nothing should be cut to 80 columns: ids are meant to be copied.
    return Console(width=None if sys.stdout.isatty() else 10_000, highlight=False)


def print_json(document: Any) -> None:
    # Valid JSON with no raw control or bidi character: safe on a terminal, equal when parsed.
    typer.echo(safe_json(document))


def text(value: Any) -> Text:
    """A table cell shown as it is (rich markup in a name or message is not interpreted)."""
    if value is None:
        return Text("-")
    if isinstance(value, bool):
        return Text("yes" if value else "no")
    if isinstance(value, list):
        return Text(", ".join(str(item) for item in value) or "-")
    if isinstance(value, dict):
        return Text(labels_text(value))
    return Text(str(value))


def print_table(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    table = Table(*columns, box=None, header_style="bold", pad_edge=False)
    for row in rows:
        table.add_row(*(text(row.get(column)) for column in columns))
    stdout().print(table)


def print_fields(data: Mapping[str, Any], names: Sequence[str]) -> None:
    width = max(len(name) for name in names)
    for name in names:
        typer.echo(f"{name.ljust(width)}  {text(data.get(name)).plain}")


def job_fields(job: Job) -> dict[str, Any]:
    """A JobView flattened for key-value lines."""
    data = dict(job.data)
    progress = data.get("progress") or {}
    terminal = data.get("terminal") or {}
    error = terminal.get("error") or {}
    failure = (data.get("retry") or {}).get("last_failure") or {}
    data["attempt"] = f"{data.get('attempt')} of {data.get('max_attempts')}"
    data["progress"] = progress_text(progress, ended=job.ended)
    data["error"] = f"{error['code']}: {error['message']}" if error else None
    data["result"] = _compact(terminal["result"]) if terminal.get("result") is not None else None
    data["last_failure"] = (
        f"{failure['code']}: {failure['message']} (attempt {failure['attempt']})"
        if failure
        else None
    )
    data["cancel_requested"] = (data.get("cancel") or {}).get("requested")
    waiting = job.waiting_for
    if waiting is not None:
        named = list(waiting.get("jobs") or [])
        if waiting.get("group"):
            named.append(f"group {waiting['group']}")
        data["waiting_for"] = ", ".join(named)
    return data


def progress_text(progress: dict[str, Any], *, ended: bool) -> str | None:
    """A progress report as a person reads it: the percent rounded (none when the handler gave
    none), its message, and for an ended job that this was its last report, not its end."""
    if not progress:
        return None
    percent = progress.get("percent")
    parts = [f"{percent:.0f}%" if isinstance(percent, int | float) else None]
    parts.append(progress.get("message") or None)
    if ended:
        parts.append("(last report before it ended)")
    return " ".join(part for part in parts if part) or None


def _compact(value: Any) -> str:
    return safe_json(value, compact=True)


JOB_FIELDS: Final = (
    "id",
    "server_id",
    "kind",
    "state",
    "attempt",
    "priority",
    "created_at",
    "updated_at",
    "progress",
    "cancel_requested",
    "last_failure",
    "error",
    "result",
)


def show_job(job: Job, as_json: bool) -> None:
    """The job's fields, a line each; then, when it was read with its payload, the payload as
    indented JSON below a `payload` line (drawn safely: `drawn.safe_json`)."""
    if as_json:
        print_json(job.data)
        return
    # A job held on its dependencies says what it waits on (the line is there only then).
    names = JOB_FIELDS if job.waiting_for is None else (*JOB_FIELDS, "waiting_for")
    print_fields(job_fields(job), names)
    if job.payload is not None:
        typer.echo("payload")
        for line in safe_json(job.payload).splitlines():
            typer.echo(f"  {line}")


def ending(job: Job) -> str:
    error = (job.terminal or {}).get("error")
    said = f": {error['code']}: {error['message']}" if error else ""
    return f"job {job.id} {job.state}{said}"


def exit_for(job: Job) -> None:
    """Exit 0, 3 or 4 for a job that succeeded, failed or was cancelled."""
    code = EXIT_OF_STATE.get(job.state, EXIT_TIMED_OUT)
    if code:
        raise typer.Exit(code)


# -- login, logout, whoami -----------------------------------------------------------------


def _read_secret(prompt: str) -> str:
    """From a hidden prompt on a terminal, else the first line of stdin (never argv)."""
    if sys.stdin.isatty():
        value: str = typer.prompt(prompt, hide_input=True)
    else:
        value = sys.stdin.readline()
    value = value.strip()
    if not value:
        raise InvalidRequest(f"no {prompt.lower()} given")
    return value


@user_errors
def login(
    ctx: typer.Context,
    platform: Annotated[str, typer.Option("--platform", help="The platform's base URL")],
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
) -> None:
    """Save a platform URL and API token as a profile, once the platform accepts the token.

    The token is read from a hidden prompt, or from stdin when stdin is not a terminal.
    """
    environment = _environment(ctx)
    url = platform.rstrip("/")
    if not url.startswith(("http://", "https://")):
        # Checked before the token is read: a usage error, not a connection that fails later.
        raise typer.BadParameter(
            f"{platform!r} is not a URL; did you mean http://{url} (or https://)?",
            param_hint="'--platform'",
        )
    token = _read_secret("API token")
    with Client(url, token) as client:
        user = client.whoami()
    saved = profiles.load(environment.config_path)
    saved[profile] = profiles.Profile(url, token)
    profiles.save(environment.config_path, saved)
    typer.echo(f"logged in to {url} as {user.name} (profile {profile})")


@user_errors
def logout(ctx: typer.Context, profile: ProfileOption = profiles.DEFAULT_PROFILE) -> None:
    """Forget a profile's platform and token."""
    path = _environment(ctx).config_path
    saved = profiles.load(path)
    if saved.pop(profile, None) is None:
        typer.echo(f"profile {profile} was not logged in")
        return
    profiles.save(path, saved)
    typer.echo(f"logged out (profile {profile})")


@user_errors
def whoami(
    ctx: typer.Context,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Show the user the token belongs to."""
    with connect(ctx, profile) as client:
        user = client.whoami()
    if as_json:
        print_json(user.data)
    else:
        print_fields(user.data, ("id", "name", "platform_admin", "created_at"))


# -- jobs ----------------------------------------------------------------------------------

job_app = typer.Typer(no_args_is_help=True, help="Submit, watch and cancel jobs.")


class CommandTail(typer.core.TyperCommand):
    """Keeps what follows `--` (a command line) apart from the verb's own arguments."""

    # `ctx` is the click Context typer vendors (typer._click), which typer does not export.
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[TAIL] = args[cut + 1 :]
            args = args[:cut]
        return super().parse_args(ctx, args)


def read_payload(text_or_file: str | None) -> dict[str, Any] | None:
    if text_or_file is None:
        return None
    try:
        if text_or_file == "@-":
            raw = sys.stdin.read()
        elif text_or_file.startswith("@"):
            raw = Path(text_or_file[1:]).read_text(encoding="utf-8")
        else:
            raw = text_or_file
    except OSError as error:
        raise typer.BadParameter(f"cannot read {text_or_file[1:]}: {error.strerror}") from None
    try:
        payload = json.loads(raw)
    except ValueError as error:
        raise typer.BadParameter(f"not JSON: {error}") from None
    if not isinstance(payload, dict):
        raise typer.BadParameter("the payload must be a JSON object")
    return payload


BATCH_SIZE: Final = 1000
"""Jobs per batch request (the route's bound): a longer file is sent as several batches."""


def read_batch(path: str) -> list[dict[str, Any]]:
    """The jobs of a JSON-lines file (`-`: stdin), one create's body per line (blank lines
    skipped); a line that is not a JSON object is bad usage naming its number."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise typer.BadParameter(f"cannot read {path}: {error.strerror}") from None
    jobs: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            job = json.loads(line)
        except ValueError as error:
            raise typer.BadParameter(f"{path} line {number}: not JSON: {error}") from None
        if not isinstance(job, dict):
            raise typer.BadParameter(f"{path} line {number}: a job must be a JSON object")
        jobs.append(job)
    if not jobs:
        raise typer.BadParameter(f"{path} holds no job")
    return jobs


def _submit_batch(
    ctx: typer.Context,
    profile: str,
    server: str,
    jobs: list[dict[str, Any]],
    idempotency_key: str | None,
    as_json: bool,
) -> None:
    """Queue the jobs through the batch route, BATCH_SIZE at a time (each batch all or none;
    with --idempotency-key K, batch n carries K-n, so a rerun of the command makes none twice)."""
    made = []
    with connect(ctx, profile) as client:
        server_id = server_named(client, server)
        for n, start in enumerate(range(0, len(jobs), BATCH_SIZE)):
            key = None if idempotency_key is None else f"{idempotency_key}-{n}"
            made += client.submit_batch(
                server_id, jobs[start : start + BATCH_SIZE], idempotency_key=key
            )
    if as_json:
        print_json([job.data for job in made])
    else:
        print_table(("id", "server_id", "kind", "state"), (job.data for job in made))


@job_app.command("submit", cls=CommandTail)
@user_errors
def job_submit(
    ctx: typer.Context,
    server: Annotated[
        str | None,
        typer.Argument(help="The server's id, or its unambiguous name (none with --selector)"),
    ] = None,
    kind: Annotated[
        str | None, typer.Argument(help="The job's kind; omit it with `-- CMD ARG...`")
    ] = None,
    payload: Annotated[
        str | None,
        typer.Option("--payload", help="A JSON object, or @FILE to read it (@- for stdin)"),
    ] = None,
    max_attempts: Annotated[int | None, typer.Option("--max-attempts", min=1)] = None,
    not_before: Annotated[
        str | None, typer.Option("--not-before", help="RFC 3339 time before which it waits")
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option("--idempotency-key", help="The same key submits the same job once"),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the job ends")] = False,
    follow: Annotated[
        bool, typer.Option("--follow", help="Show progress and stream the log until it ends")
    ] = False,
    selector: Annotated[
        str | None,
        typer.Option(
            "--selector",
            help="Fan out: one job on each of your servers whose labels match (role=web,env=prod)",
        ),
    ] = None,
    max_parallel: Annotated[
        int | None,
        typer.Option("--max-parallel", min=1, help="With --selector: at most N at once"),
    ] = None,
    stop_on_failure: Annotated[
        bool,
        typer.Option(
            "--stop-on-failure", help="With --selector: cancel the queued jobs once one fails"
        ),
    ] = False,
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
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority",
            min=0,
            max=9,
            help="0 to 9 (default 5): a higher priority is granted first on its endpoint",
        ),
    ] = None,
    after: Annotated[
        list[str] | None,
        typer.Option(
            "--after",
            help="Wait until this job succeeded (repeatable; cancelled if one does not)",
        ),
    ] = None,
    after_group: Annotated[
        str | None,
        typer.Option("--after-group", help="Wait until every job of this group succeeded"),
    ] = None,
    batch: Annotated[
        str | None,
        typer.Option(
            "--batch",
            help="Queue the jobs of a JSON-lines FILE (- for stdin), one create's body per "
            "line, through the batch route",
        ),
    ] = None,
    outage_grace: OutageGraceOption = OUTAGE_GRACE_S,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Queue a job on a server: `submit SERVER KIND`, or `submit SERVER -- CMD ARG...` for a
    `command` job whose payload is {"argv": [CMD, ARG...]}. With --selector instead of a
    SERVER, one job on each matching server, as a group (`submit --selector role=web KIND`);
    --follow then prints a line per server as its job ends, and exits 3 if any failed. With
    --wait or --follow, a platform restart of up to --outage-grace seconds is ridden through.
    With --after JOB_ID (repeatable) or --after-group GROUP_ID, the job waits until each of them
    succeeded."""
    if batch is not None:
        if server is None or kind is not None or ctx.meta.get(TAIL) is not None or selector:
            raise typer.BadParameter("--batch takes a SERVER and no KIND, `--` or --selector")
        _submit_batch(ctx, profile, server, read_batch(batch), idempotency_key, as_json)
        return
    if selector is not None:
        # With --selector the one positional is the KIND; a server id there is a SERVER too.
        if (server is not None and kind is not None) or (server or "").startswith("srv_"):
            raise typer.BadParameter("give a SERVER or --selector, not both")
        if after or after_group is not None:
            raise typer.BadParameter("--after and --after-group take a SERVER, not --selector")
        kind = kind if kind is not None else server
        server = None
    elif server is None:
        raise typer.BadParameter("a SERVER (or --selector) is needed")
    elif max_parallel is not None or stop_on_failure:
        raise typer.BadParameter("--max-parallel and --stop-on-failure need --selector")
    if concurrency_limit is not None and concurrency_key is None:
        raise typer.BadParameter("--concurrency-limit needs --concurrency-key")
    body = read_payload(payload)
    tail: list[str] | None = ctx.meta.get(TAIL)
    if tail is not None:
        if kind is not None:
            raise typer.BadParameter("give KIND or `-- CMD ARG...`, not both")
        if not tail:
            raise typer.BadParameter("`--` needs a command after it")
        kind, body = "command", {**(body or {}), "argv": tail}
    if kind is None:
        raise typer.BadParameter("a KIND, or `-- CMD ARG...`, is needed")
    if server is None:
        from moonrun.client import group_verbs  # it builds on this module

        assert selector is not None
        group_verbs.fan_out(
            ctx,
            profile,
            group_verbs.FanOutAsked(
                selector,
                kind,
                body,
                max_attempts,
                not_before,
                idempotency_key,
                concurrency_key,
                concurrency_limit,
                priority,
            ),
            max_parallel=max_parallel,
            stop_on_failure=stop_on_failure,
            wait=wait or follow,
            outage_grace=outage_grace,
            as_json=as_json,
        )
        return
    with connect(ctx, profile, outage_grace_s=outage_grace) as client:
        job = client.submit(
            server_named(client, server),
            kind,
            body,
            max_attempts=max_attempts,
            not_before=not_before,
            idempotency_key=idempotency_key,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            after=after,
            after_group=after_group,
            priority=priority,
        )
        if follow:
            job = _follow(ctx, profile, client, job, logs_to_stderr=as_json)
        elif wait:
            if not as_json:
                typer.echo(f"job {job.id} {job.state}; waiting for it to end")
            job = client.wait(job.id, logs=True)
    if not (wait or follow):
        show_job(job, as_json)
        return
    if as_json:
        print_json(job.data)
    elif wait and not follow:
        typer.echo(ending(job))
    exit_for(job)


def _follow(
    ctx: typer.Context, profile: str, client: Client, job: Job, *, logs_to_stderr: bool
) -> Job:
    """Stream the job's log; on a terminal, below the lines a live status line says the job's
    state, its progress (or the time since it started when it reports none), and each failed
    attempt and its retry as they happen. Off a terminal: plain lines. The job as it ended."""
    out = Console(stderr=logs_to_stderr, highlight=False)
    live = out.is_terminal
    stop = threading.Event()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=out,
        transient=True,
        disable=not live,  # off a terminal a bar is noise in the captured output
    ) as bar:
        task = bar.add_task(f"{job.id} {job.state}", total=None)
        said: set[str] = set()

        def watch() -> None:
            # A client of its own: the log stream holds the other one's connection.
            with connect(ctx, profile) as watcher:
                while not stop.is_set():
                    try:
                        seen = watcher.job(job.id)
                    except MoonrunError:
                        # The status line is a view only; the log stream reports real trouble.
                        seen = None
                    if seen is not None:
                        percent = status_percent(seen)
                        bar.update(task, total=None if percent is None else 100)
                        bar.update(task, completed=percent or 0, description=status_line(seen))
                        note = retry_note(seen)
                        if note is not None and note not in said:
                            said.add(note)
                            if live:  # above the status line, with the log lines
                                bar.console.print(note, markup=False, highlight=False)
                            else:  # never among the job's own lines on stdout
                                typer.echo(note, err=True)
                    stop.wait(PROGRESS_POLL_S)

        watcher = threading.Thread(target=watch, name="moonrun-progress", daemon=True)
        watcher.start()
        try:
            for line in client.logs(job.id, follow=True):
                text = line.data.get("text", "")
                if live:  # above the status line, which rich draws again below it
                    bar.console.print(text, markup=False, highlight=False)
                else:
                    typer.echo(text, err=logs_to_stderr)
        finally:
            stop.set()
            watcher.join()
    ended = client.wait(job.id, logs=True)
    typer.echo(ending(ended), err=True)
    return ended


def status_percent(seen: Job) -> float | None:
    """The bar's fill: 100 once succeeded, else the last reported percent (None: no bar)."""
    if seen.state == "succeeded":
        return 100.0
    percent = (seen.progress or {}).get("percent")
    return float(percent) if isinstance(percent, int | float) else None


def status_line(seen: Job) -> str:
    """`job_x running copying` (the progress message while the job runs)."""
    message = "" if seen.ended else (seen.progress or {}).get("message") or ""
    return f"{seen.id} {seen.state} {message}".rstrip()


def retry_note(seen: Job) -> str | None:
    """`attempt 1 failed: exit_status: ...; retry in 2 s` while a retry waits; else None."""
    if seen.state != "retrying":
        return None
    retry = seen.data.get("retry") or {}
    failure = retry.get("last_failure") or {}
    why = ": ".join(str(part) for part in (failure.get("code"), failure.get("message")) if part)
    why = why or str(failure.get("reason") or "ended")
    when = ""
    eligible = retry.get("next_eligible_at")
    updated = seen.data.get("updated_at")
    if isinstance(eligible, str) and isinstance(updated, str):
        delay = (_when(eligible) - _when(updated)).total_seconds()
        when = f"; retry in {max(0.0, delay):.0f} s"
    return f"attempt {failure.get('attempt', seen.attempt)} failed: {why}{when}"


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@job_app.command("list")
@user_errors
def job_list(
    ctx: typer.Context,
    server: Annotated[
        str | None, typer.Option("--server", help="Only this server's jobs (its id or name)")
    ] = None,
    state: Annotated[
        list[str] | None,
        typer.Option("--state", help="Only jobs in this state; repeated: in any of them"),
    ] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="Only jobs of this kind")] = None,
    id_prefix: Annotated[
        str | None,
        typer.Option("--id-prefix", help="Only jobs whose id starts so (job_ and 3 or more)"),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="At most this many (the newest)")
    ] = None,
    group: Annotated[
        str | None, typer.Option("--group", help="Only this fan-out group's jobs")
    ] = None,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """The jobs you may see, newest first (every page, or the newest --limit)."""
    states: list[str | None] = list(dict.fromkeys(state)) if state else [None]
    with connect(ctx, profile) as client:
        server = server_named(client, server) if server is not None else None
        jobs: list[Job] = []
        for one in states:  # one listing per state: each is newest first, merged below
            found = client.jobs(
                server_id=server, state=one, kind=kind, id_prefix=id_prefix, group=group
            )
            jobs += itertools.islice(found, limit)
        hint = kind_hint(client, kind, server) if kind is not None and not jobs else None
    if hint is not None:
        typer.echo(f"moonrun: {hint}", err=True)  # stdout stays the (empty) listing
    jobs.sort(key=lambda job: (job.created_at, job.id), reverse=True)
    jobs = jobs[:limit]
    if as_json:
        print_json([job.data for job in jobs])
    else:
        print_table(
            ("id", "server_id", "kind", "state", "attempt", "created_at"),
            (job.data for job in jobs),
        )


JobIdArgument = Annotated[str, typer.Argument(help="The job's id")]


class LogStream(enum.StrEnum):
    stdout = "stdout"
    stderr = "stderr"


@job_app.command("show")
@user_errors
def job_show(
    ctx: typer.Context,
    job_id: JobIdArgument,
    payload: Annotated[
        bool,
        typer.Option(
            "--payload/--no-payload",
            help="Show what the job was given (its payload, credential-looking members redacted)",
        ),
    ] = True,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """One job: its state, attempts and, once it ended, what its handler returned; and its
    payload (each member whose name looks like a credential shown as [redacted])."""
    with connect(ctx, profile) as client:
        show_job(client.job(job_id, include_payload=payload), as_json)


@job_app.command("wait")
@user_errors
def job_wait(
    ctx: typer.Context,
    job_id: JobIdArgument,
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0, help="Give up after this many seconds")
    ] = None,
    logs: Annotated[
        bool,
        typer.Option(
            "--logs/--no-logs",
            help="Also wait until the job's log lines are all in (job logs then shows them all)",
        ),
    ] = True,
    outage_grace: OutageGraceOption = OUTAGE_GRACE_S,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Wait until the job ends, and its log lines are all in. Exit 0 succeeded, 3 failed, 4
    cancelled, 5 timed out.

    A platform that does not answer for up to --outage-grace seconds (a restart) is waited
    out; longer, exit 1 `unreachable`."""
    with connect(ctx, profile, outage_grace_s=outage_grace) as client:
        try:
            job = client.wait(job_id, timeout, logs=logs)
        except WaitTimedOut:
            job = client.job(job_id)
            if job.state not in EXIT_OF_STATE:
                if as_json:
                    print_json(job.data)
                else:
                    typer.echo(f"job {job.id} is still {job.state} after {timeout} s")
                raise typer.Exit(EXIT_TIMED_OUT) from None
    if as_json:
        print_json(job.data)
    else:
        typer.echo(ending(job))
    exit_for(job)


@job_app.command("rerun")
@user_errors
def job_rerun(
    ctx: typer.Context,
    job_id: JobIdArgument,
    idempotency_key: Annotated[
        str | None,
        typer.Option("--idempotency-key", help="The same key reruns the job once"),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the new job ends")] = False,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Queue a finished job again, as a new job (same server, kind, payload and retries)."""
    with connect(ctx, profile) as client:
        job = client.rerun(job_id, idempotency_key=idempotency_key)
        if wait:
            if not as_json:
                typer.echo(f"job {job.id} {job.state}; waiting for it to end")
            job = client.wait(job.id)
    if not wait:
        show_job(job, as_json)
        return
    if as_json:
        print_json(job.data)
    else:
        typer.echo(ending(job))
    exit_for(job)


@job_app.command("cancel")
@user_errors
def job_cancel(
    ctx: typer.Context,
    job_ids: Annotated[list[str], typer.Argument(help="The jobs' ids (1 to 1,000)")],
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Cancel jobs: a waiting job ends at once, a running one gets a cancel intent.

    Several jobs go in one request, each answered on its own line (with --json, one object
    each: {"job_id", "job"} or {"job_id", "error"}); exit 1 when any of them was refused.
    """
    with connect(ctx, profile) as client:
        if len(job_ids) == 1:
            answers: list[Job | MoonrunError] = [client.cancel(job_ids[0])]
        else:
            answers = client.cancel_many(job_ids)
    answered = list(zip(job_ids, answers, strict=True))
    refused = [answer for answer in answers if isinstance(answer, MoonrunError)]
    if as_json:
        entries = [_cancelled_entry(job_id, answer) for job_id, answer in answered]
        print_json(entries[0]["job"] if len(job_ids) == 1 else entries)
    else:
        for job_id, answer in answered:
            if isinstance(answer, MoonrunError):
                typer.echo(f"job {job_id}: error: {answer.code}: {answer.message}", err=True)
            elif answer.state == "cancelled":
                typer.echo(f"job {answer.id} cancelled")
            elif answer.ended:
                typer.echo(f"job {answer.id} had already ended ({answer.state}): nothing to cancel")
            else:
                typer.echo(f"job {answer.id} is {answer.state}; cancel requested")
    if refused:
        raise typer.Exit(EXIT_ERROR)


@job_app.command("delete")
@user_errors
def job_delete(
    ctx: typer.Context,
    job_id: JobIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Delete a finished job now, with its logs and artifacts (exit 1 `job_not_finished`
    while it has not ended; `not_found` for a job you may not manage)."""
    with connect(ctx, profile) as client:
        job = client.delete(job_id)
    if as_json:
        print_json(job.data)
    else:
        typer.echo(f"job {job.id} deleted ({job.state})")


def _cancelled_entry(job_id: str, answer: Job | MoonrunError) -> dict[str, Any]:
    if isinstance(answer, MoonrunError):
        return {"job_id": job_id, "error": {"code": answer.code, "message": answer.message}}
    return {"job_id": job_id, "job": answer.data}


@job_app.command("logs")
@user_errors
def job_logs(
    ctx: typer.Context,
    job_id: JobIdArgument,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing lines until the job ends")
    ] = False,
    attempt: Annotated[
        int | None, typer.Option("--attempt", min=1, help="This attempt [default: the latest]")
    ] = None,
    stream: Annotated[
        LogStream | None, typer.Option("--stream", help="Only this stream's lines")
    ] = None,
    outage_grace: OutageGraceOption = OUTAGE_GRACE_S,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Print a job's log lines. With --json, a list of lines (one line object a line with -f).

    On a terminal, stderr lines are marked `stderr|`; piped, every line is printed as is.
    """
    marked = sys.stdout.isatty()
    with connect(ctx, profile, outage_grace_s=outage_grace) as client:
        lines = (
            line
            for line in client.logs(job_id, attempt=attempt, follow=follow)
            if stream is None or line.data.get("stream") == stream.value
        )
        if as_json and not follow:
            print_json([line.data for line in lines])
            return
        for line in lines:
            if as_json:
                typer.echo(json.dumps(line.data, ensure_ascii=False))
            elif marked and line.data.get("stream") == "stderr":
                typer.echo(typer.style("stderr| ", dim=True) + line.data.get("text", ""))
            else:
                typer.echo(line.data.get("text", ""))


@job_app.command("artifacts")
@user_errors
def job_artifacts(
    ctx: typer.Context,
    job_id: JobIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """A job's artifacts, every attempt's: name, size and whether each is complete."""
    with connect(ctx, profile) as client:
        found = client.artifacts(job_id)
    if as_json:
        print_json([artifact.data for artifact in found])
    else:
        print_table(("attempt", "name", "size", "complete"), (a.data for a in found))


@job_app.command("download")
@user_errors
def job_download(
    ctx: typer.Context,
    job_id: JobIdArgument,
    name: Annotated[str, typer.Argument(help="The artifact's name")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write it here ('-' for stdout) [default: NAME]"),
    ] = None,
    attempt: Annotated[
        int | None, typer.Option("--attempt", min=1, help="This attempt [default: the latest]")
    ] = None,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
) -> None:
    """Download a complete artifact of a job, streamed to a file."""
    with connect(ctx, profile) as client:
        if output == Path("-"):
            client.download(job_id, name, sys.stdout.buffer, attempt=attempt)
            sys.stdout.buffer.flush()
            return
        target = output if output is not None else Path(name)
        written = client.download(job_id, name, target, attempt=attempt)
    typer.echo(f"{target}: {written} bytes", err=True)


# -- endpoints, users, servers -------------------------------------------------------------

endpoint_app = typer.Typer(no_args_is_help=True, help="Create and list endpoints (hosts).")
user_app = typer.Typer(no_args_is_help=True, help="Create, list and manage users' access.")
user_token_app = typer.Typer(no_args_is_help=True, help="Manage a user's API token.")
user_app.add_typer(user_token_app, name="token")
server_app = typer.Typer(no_args_is_help=True, help="Create, list and administer servers.")
server_admin_app = typer.Typer(no_args_is_help=True, help="Give or take a server's administration.")
server_app.add_typer(server_admin_app, name="admin")


@endpoint_app.command("create")
@user_errors
def endpoint_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The endpoint's name, e.g. the host's")],
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Create an endpoint and print its one-time join token (shown only this once)."""
    platform, token = credentials(ctx, profile)
    with Client(platform, token) as client:
        endpoint, join_token = client.create_endpoint(name)
    if as_json:
        print_json({"endpoint": endpoint.data, "join_token": join_token})
        return
    print_fields(endpoint.data, ("id", "name"))
    typer.echo(f"join token (shown once): {join_token}")
    typer.echo("On the host, run:")
    typer.echo(
        f"  moonrun run join --platform {platform} --token {join_token} --data-dir {RUN_DATA_DIR}"
    )


@endpoint_app.command("list")
@user_errors
def endpoint_list(
    ctx: typer.Context,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Every endpoint and whether its Run is online (platform admins)."""
    with connect(ctx, profile) as client:
        endpoints = client.endpoints()
    if as_json:
        print_json([endpoint.data for endpoint in endpoints])
    else:
        print_table(
            (
                "id",
                "name",
                "online",
                "draining",
                "generation",
                "capacity",
                "last_seen_at",
                "labels",
            ),
            (endpoint.data for endpoint in endpoints),
        )


EndpointIdArgument = Annotated[str, typer.Argument(help="The endpoint's id or name")]


LabelChanges = Annotated[
    list[str] | None,
    typer.Argument(
        help="KEY=VALUE sets a label, KEY- removes one; the others are kept unless --replace",
        show_default=False,
    ),
]
ReplaceOption = Annotated[
    bool,
    typer.Option("--replace", help="Set exactly the labels given (none given: clear them)"),
]


@endpoint_app.command("label")
@user_errors
def endpoint_label(
    ctx: typer.Context,
    endpoint_id: EndpointIdArgument,
    changes: LabelChanges = None,
    replace: ReplaceOption = False,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Set or remove the endpoint's labels; with no change, print them (platform admins)."""
    with connect(ctx, profile) as client:
        endpoint_id = endpoint_named(client, endpoint_id)
        current = next((e for e in client.endpoints() if e.id == endpoint_id), None)
        if current is None:
            raise NotFound(f"no endpoint {endpoint_id}")
        endpoint = current
        if changes or replace:
            labels = apply_changes(current.labels, changes or [], replace=replace)
            with naming_labels(labels):
                endpoint = client.set_endpoint_labels(endpoint_id, labels)
    if as_json:
        print_json(endpoint.data)
    else:
        typer.echo(labels_text(endpoint.labels))


@endpoint_app.command("drain")
@user_errors
def endpoint_drain(
    ctx: typer.Context,
    endpoint_id: EndpointIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Grant the endpoint no new jobs; its running ones finish (platform admins)."""
    with connect(ctx, profile) as client:
        endpoint_id = endpoint_named(client, endpoint_id)
        record = client.drain_endpoint(endpoint_id)
    if as_json:
        print_json(record.data)
    else:
        typer.echo(f"endpoint {endpoint_id} is draining")


@endpoint_app.command("undrain")
@user_errors
def endpoint_undrain(
    ctx: typer.Context,
    endpoint_id: EndpointIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Grant the endpoint jobs again (platform admins)."""
    with connect(ctx, profile) as client:
        endpoint_id = endpoint_named(client, endpoint_id)
        record = client.undrain_endpoint(endpoint_id)
    if as_json:
        print_json(record.data)
    else:
        typer.echo(f"endpoint {endpoint_id} takes jobs again")


@endpoint_app.command("remove")
@user_errors
def endpoint_remove(
    ctx: typer.Context,
    endpoint_id: EndpointIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Remove an endpoint no server points at; its Run is refused (platform admins)."""
    with connect(ctx, profile) as client:
        endpoint_id = endpoint_named(client, endpoint_id)
        record = client.remove_endpoint(endpoint_id)
    if as_json:
        print_json(record.data)
    else:
        typer.echo(f"endpoint {endpoint_id} removed")


@user_app.command("create")
@user_errors
def user_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The user's name")],
    password_stdin: Annotated[
        bool,
        typer.Option("--password-stdin", help="Read a console password from stdin's first line"),
    ] = False,
    platform_admin: Annotated[
        bool, typer.Option("--platform-admin", help="Make the user a platform admin")
    ] = False,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Create a user and print its API token (shown only this once)."""
    password = sys.stdin.readline().rstrip("\r\n") if password_stdin else None
    if password_stdin and not password:
        raise typer.BadParameter("--password-stdin read no password")
    with connect(ctx, profile) as client:
        user, api_token = client.create_user(name, password=password, platform_admin=platform_admin)
    if as_json:
        print_json({"user": user.data, "api_token": api_token})
        return
    print_fields(user.data, ("id", "name", "platform_admin"))
    typer.echo(f"API token (shown once): {api_token}")


@user_app.command("list")
@user_errors
def user_list(
    ctx: typer.Context,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Every user (platform admins)."""
    with connect(ctx, profile) as client:
        users = client.users()
    if as_json:
        print_json([user.data for user in users])
    else:
        print_table(
            ("id", "name", "platform_admin", "disabled", "created_at"), (u.data for u in users)
        )


@user_app.command("disable")
@user_errors
def user_disable(
    ctx: typer.Context,
    user_id: Annotated[str, typer.Argument(help="The user's id or name")],
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Disable a user: their API tokens and console sessions stop working (platform admins)."""
    with connect(ctx, profile) as client:
        user_id = user_named(client, user_id)
        record = client.disable_user(user_id)
    if as_json:
        print_json(record.data)
    else:
        typer.echo(f"user {user_id} is disabled")


@user_app.command("enable")
@user_errors
def user_enable(
    ctx: typer.Context,
    user_id: Annotated[str, typer.Argument(help="The user's id or name")],
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Enable a disabled user again (platform admins)."""
    with connect(ctx, profile) as client:
        user_id = user_named(client, user_id)
        record = client.enable_user(user_id)
    if as_json:
        print_json(record.data)
    else:
        typer.echo(f"user {user_id} is enabled")


@user_token_app.command("rotate")
@user_errors
def user_token_rotate(
    ctx: typer.Context,
    user_id: Annotated[str | None, typer.Argument(help="The user's id (default: you)")] = None,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Give a user a new API token, shown only this once; their old ones stop working (your
    own, or anyone's for platform admins). A rotated profile token must be saved again with
    `moonrun login`."""
    with connect(ctx, profile) as client:
        user, api_token = client.rotate_token(user_id)
    if as_json:
        print_json({"user": user.data, "api_token": api_token})
        return
    print_fields(user.data, ("id", "name"))
    typer.echo(f"API token (shown once): {api_token}")


@user_app.command("password")
@user_errors
def user_password(
    ctx: typer.Context,
    user_id: Annotated[str | None, typer.Argument(help="The user's id (default: you)")] = None,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
) -> None:
    """Set a console password, read from a hidden prompt or stdin's first line (your own, or
    anyone's for platform admins)."""
    password = _read_secret("Password")
    with connect(ctx, profile) as client:
        user = client.set_password(password, user_id)
    typer.echo(f"password of {user.name} is set")


SERVER_FIELDS: Final = (
    "id",
    "name",
    "endpoint_id",
    "endpoint_online",
    "owner_id",
    "admin_ids",
    "created_at",
    "labels",
)


@server_app.command("create")
@user_errors
def server_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The server's name")],
    endpoint: Annotated[str, typer.Option("--endpoint", help="The endpoint's id or name")],
    owner: Annotated[str, typer.Option("--owner", help="The owning user's id or name")],
    label: Annotated[
        list[str] | None,
        typer.Option("--label", help="KEY=VALUE: a label of the server (repeatable)"),
    ] = None,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Create a server on an endpoint, owned by a user (platform admins)."""
    labels = parse_pairs(label or [], "--label")
    with connect(ctx, profile) as client, naming_labels(labels):
        endpoint_id, owner_id = endpoint_named(client, endpoint), user_named(client, owner)
        server = client.create_server(name, endpoint_id, owner_id, labels or None)
    if as_json:
        print_json(server.data)
    else:
        print_fields(server.data, SERVER_FIELDS)


@server_app.command("list")
@user_errors
def server_list(
    ctx: typer.Context,
    selector: Annotated[
        str | None,
        typer.Option(
            "--selector",
            "-l",
            help="Only servers whose labels (over their endpoint's) match, e.g. "
            "'role=web,env in (prod,staging),!canary'",
        ),
    ] = None,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """The servers you own or administer (every server for platform admins)."""
    with connect(ctx, profile) as client:
        servers = client.servers(selector)
    if as_json:
        print_json([server.data for server in servers])
    else:
        print_table(SERVER_FIELDS, (server.data for server in servers))


ServerIdArgument = Annotated[
    str, typer.Argument(help="The server's id, or its name where no other you see has it")
]
UserIdArgument = Annotated[str, typer.Argument(help="The user's id")]


@server_app.command("remove")
@user_errors
def server_remove(
    ctx: typer.Context,
    server_id: ServerIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Remove a server none of whose jobs is waiting or running (its owner or a platform
    admin)."""
    with connect(ctx, profile) as client:
        server_id = server_named(client, server_id)
        record = client.remove_server(server_id)
    if as_json:
        print_json(record.data)
    else:
        typer.echo(f"server {server_id} removed")


@server_app.command("show")
@user_errors
def server_show(
    ctx: typer.Context,
    server_id: ServerIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """One server."""
    with connect(ctx, profile) as client:
        server_id = server_named(client, server_id)
        server = client.server(server_id)
    if as_json:
        print_json(server.data)
    else:
        print_fields(server.data, SERVER_FIELDS)


@server_app.command("label")
@user_errors
def server_label(
    ctx: typer.Context,
    server_id: ServerIdArgument,
    changes: LabelChanges = None,
    replace: ReplaceOption = False,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """Set or remove the server's labels; with no change, print them (its owner, its
    administrators or a platform admin)."""
    with connect(ctx, profile) as client:
        server_id = server_named(client, server_id)
        server = client.server(server_id)
        if changes or replace:
            labels = apply_changes(server.labels, changes or [], replace=replace)
            with naming_labels(labels):
                server = client.set_server_labels(server_id, labels)
    if as_json:
        print_json(server.data)
    else:
        typer.echo(labels_text(server.labels))


@server_app.command("kinds")
@user_errors
def server_kinds(
    ctx: typer.Context,
    server_id: ServerIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
    as_json: JsonOption = False,
) -> None:
    """The job kinds the server's Run runs, with each payload's fields (--json: the schemas)."""
    with connect(ctx, profile) as client:
        server_id = server_named(client, server_id)
        kinds = client.kinds(server_id)
    if as_json:
        print_json(kinds.data)
        return
    if not kinds.advertised:
        typer.echo("the server's Run has not said which kinds it runs; every kind is accepted")
        return
    print_table(
        ("kind", "fields", "required"),
        (
            {
                "kind": kind,
                "fields": ", ".join(sorted(_schema_part(schema, "properties"))) or "-",
                "required": ", ".join(_schema_part(schema, "required")) or "-",
            }
            for kind, schema in kinds.schemas.items()
        ),
    )


def _schema_part(schema: Any, name: str) -> list[str]:
    """A top-level `properties` (their names) or `required` of a payload schema, if any."""
    part = schema.get(name) if isinstance(schema, dict) else None
    if isinstance(part, dict):
        return [str(key) for key in part]
    if isinstance(part, list):
        return [str(item) for item in part]
    return []


@server_admin_app.command("add")
@user_errors
def server_admin_add(
    ctx: typer.Context,
    server_id: ServerIdArgument,
    user_id: UserIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
) -> None:
    """Make a user an administrator of the server (its owner or a platform admin)."""
    with connect(ctx, profile) as client:
        server_id = server_named(client, server_id)
        client.add_server_admin(server_id, user_id)
    typer.echo(f"{user_id} administers server {server_id}")


@server_admin_app.command("remove")
@user_errors
def server_admin_remove(
    ctx: typer.Context,
    server_id: ServerIdArgument,
    user_id: UserIdArgument,
    profile: ProfileOption = profiles.DEFAULT_PROFILE,
) -> None:
    """Take a user's administration of the server away (its owner or a platform admin)."""
    with connect(ctx, profile) as client:
        server_id = server_named(client, server_id)
        client.remove_server_admin(server_id, user_id)
    typer.echo(f"{user_id} no longer administers server {server_id}")


def register(app: typer.Typer) -> None:
    """Add the user verbs to the `moonrun` command."""
    app.command("login")(login)
    app.command("logout")(logout)
    app.command("whoami")(whoami)
    app.add_typer(job_app, name="job")
    app.add_typer(endpoint_app, name="endpoint")
    app.add_typer(user_app, name="user")
    app.add_typer(server_app, name="server")
