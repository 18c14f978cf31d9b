"""The `moonrun` command: wiring at the edge (flags and environment in, implementations out)."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

import typer

from moonrun import __version__
from moonrun.errors import InvalidRequest, JoinUnconfirmed, MoonrunError
from moonrun.store import DEFAULT_STORE_URL

if TYPE_CHECKING:  # imported where used: `moonrun run start` starts without the rest
    from moonrun.run.confinement import CommandUser, Confinement
    from moonrun.run.journal import Journal

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Every command's context inherits these from the top one: `moonrun job list -h` too.
    context_settings={"help_option_names": ["-h", "--help"]},
    help="moonrun: durable job scheduling for fleets of hosts.",
)
store_app = typer.Typer(no_args_is_help=True, help="Open, migrate and inspect a platform store.")
app.add_typer(store_app, name="store")
platform_app = typer.Typer(no_args_is_help=True, help="Run the moonrun platform.")
app.add_typer(platform_app, name="platform")
run_app = typer.Typer(no_args_is_help=True, help="Run, the agent on each host.")
app.add_typer(run_app, name="run")
admin_app = typer.Typer(no_args_is_help=True, help="Platform administration on the store itself.")
app.add_typer(admin_app, name="admin")
SERVICE_GROUPS = frozenset({"store", "platform", "run", "admin"})
"""The verbs that run moonrun's own processes. `main` loads the user verbs (moonrun.client.verbs,
and httpx under it) only for other command lines, so `moonrun run start` and `moonrun
platform serve` start without them (docs/benchmarks.md, "After the layout")."""

StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        envvar="MOONRUN_STORE",
        help="memory://, file:PATH or mysql://USER:PASS@HOST:PORT/DB",
        show_default=True,
    ),
]


USAGE_EXIT_CODE = 2
BOOTSTRAP_HINT = "moonrun admin bootstrap --store URL [--name admin] [--password-stdin]"


def usage_error(message: str) -> typer.Exit:
    """One `moonrun: error:` line and the usage exit code (a value the operator must change)."""
    typer.echo(f"moonrun: error: {message}", err=True)
    return typer.Exit(USAGE_EXIT_CODE)


def one_line_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Report moonrun's own errors as one line on stderr, `moonrun: error: <code>: <message>`
    as the user verbs do (docs/cli.md, "Exit codes"), and exit 1, never a traceback."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except MoonrunError as error:
            typer.echo(f"moonrun: error: {error.code}: {error.message}", err=True)
            raise typer.Exit(1) from None

    return run


@app.command()
def version() -> None:
    """Print moonrun's version."""
    typer.echo(__version__)


@store_app.command("check")
@one_line_errors
def store_check(
    store: StoreOption = DEFAULT_STORE_URL,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print one JSON document: {"store", "schema_version", "counts", "jobs"}',
        ),
    ] = False,
) -> None:
    """Open the store (creating and migrating it when needed) and print what it holds: how
    many users, endpoints, servers and schedules, and how many jobs in each state."""
    from moonrun.scheduling.jobs import JobState
    from moonrun.store import open_store
    from moonrun.store.sql import SqlStore

    opened = open_store(store)
    try:
        held = opened.job_counts()
        jobs = {state.value: held.get(state, 0) for state in JobState}
        counts = {
            "users": len(opened.list_users()),
            "endpoints": len(opened.list_endpoints()),
            "servers": len(opened.list_servers()),
            "schedules": len(opened.list_schedules()),
            "jobs": sum(jobs.values()),
        }
        where = opened.description if isinstance(opened, SqlStore) else store
        version = opened.schema_version() if isinstance(opened, SqlStore) else None
    finally:
        opened.close()
    if as_json:
        document = {"store": where, "schema_version": version, "counts": counts, "jobs": jobs}
        typer.echo(json.dumps(document, indent=2))
        return
    schema = f", schema version {version}" if version is not None else ""
    typer.echo(f"store {where} is ready{schema}")
    typer.echo("  ".join(f"{name} {count}" for name, count in counts.items()))
    by_state = ", ".join(f"{state} {count}" for state, count in jobs.items() if count)
    typer.echo(f"jobs by state: {by_state or 'none'}")


@store_app.command("backup")
@one_line_errors
def store_backup(
    target: Annotated[Path, typer.Argument(help="A new or empty folder to copy into")],
    store: StoreOption = DEFAULT_STORE_URL,
    secret_file: Annotated[
        Path | None,
        typer.Option(
            "--secret-file",
            envvar="MOONRUN_SECRET_FILE",
            help="the platform's secret [default: platform.secret beside the store]",
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            envvar="MOONRUN_DATA_DIR",
            help="the platform's logs and artifacts [default: beside the store]",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON")] = False,
) -> None:
    """Copy a file store with its logs, artifacts and secret while the platform serves.

    The copy holds every job acknowledged before the backup began and is a data directory
    that `moonrun platform serve --store file:TARGET/platform.db` serves as it is
    (docs/operations.md, Backups). Exit codes: 0 copied; 1 an error; 2 bad usage (not a file
    store, or TARGET holds files).
    """
    from moonrun.wiring.backup import backup
    from moonrun.wiring.settings import PlatformConfig

    config = PlatformConfig(store_url=store, secret_file=secret_file, data_dir=data_dir)
    if config.store_path is None:
        raise usage_error(
            "moonrun store backup copies a file: store; for MySQL use mariadb-dump "
            "--single-transaction (docs/operations.md, Backups)"
        )
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise usage_error(f"{target} exists and is not an empty folder")
    report = backup(config, target)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "target": str(report.target),
                    "database_bytes": report.database_bytes,
                    "log_files": report.log_files,
                    "artifact_files": report.artifact_files,
                    "secret": report.secret,
                }
            )
        )
    else:
        typer.echo(
            f"backed up {store} to {report.target}: database {report.database_bytes} bytes, "
            f"{report.log_files} log files, {report.artifact_files} artifact files"
            + (", the secret" if report.secret else "")
        )


@store_app.command("compact")
@one_line_errors
def store_compact(
    store: StoreOption = DEFAULT_STORE_URL,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help='Print one JSON document: {"store", "before_bytes", "after_bytes"}'
        ),
    ] = False,
) -> None:
    """Give a file store's free space back to the file system now (SQLite's VACUUM).

    It also turns on incremental vacuum for a file made before it, after which the sweeper
    gives pruned space back by itself. It holds the store's write lock while it rewrites the
    file: run it while the platform is stopped or quiet (docs/operations.md, Retention).
    Exit codes: 0 compacted; 1 an error; 2 bad usage (not a file store).
    """
    from moonrun.store import open_store
    from moonrun.store.compact import compact_database
    from moonrun.wiring.settings import PlatformConfig

    path = PlatformConfig(store_url=store).store_path
    if path is None:
        raise usage_error(
            "moonrun store compact compacts a file: store; MySQL gives space back with "
            "OPTIMIZE TABLE (docs/operations.md, Retention)"
        )
    open_store(store).close()  # a file that is a moonrun store, migrated
    done = compact_database(path)
    if as_json:
        document = {
            "store": store,
            "before_bytes": done.before_bytes,
            "after_bytes": done.after_bytes,
        }
        typer.echo(json.dumps(document, indent=2))
        return
    typer.echo(f"compacted {store}: {done.before_bytes} bytes before, {done.after_bytes} after")


def _bytes(name: str, default: int, text: str) -> Any:
    return typer.Option(
        default,
        f"--{name}",
        envvar=f"MOONRUN_{name.upper().replace('-', '_')}",
        help=text,
        min=1,
    )


def _seconds(name: str, default: float, text: str) -> Any:
    return typer.Option(
        default,
        f"--{name}",
        envvar=f"MOONRUN_{name.upper().replace('-', '_')}",
        help=text,
        min=0.001,
    )


@platform_app.command("serve")
@one_line_errors
def platform_serve(
    store: StoreOption = DEFAULT_STORE_URL,
    listen: Annotated[
        str, typer.Option("--listen", envvar="MOONRUN_LISTEN", help="HOST:PORT to serve on")
    ] = "127.0.0.1:8470",
    secret_file: Annotated[
        Path | None,
        typer.Option(
            "--secret-file",
            envvar="MOONRUN_SECRET_FILE",
            help="64 hex characters, mode 0600; created when missing "
            "[default: platform.secret beside a file store, else .moonrun/platform.secret]",
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            envvar="MOONRUN_DATA_DIR",
            help="where artifacts and log lines are kept "
            "[default: beside a file store, else .moonrun]",
        ),
    ] = None,
    ack_timeout_s: float = _seconds("ack-timeout-s", 30, "Ack deadline after a claim"),
    lease_ttl_s: float = _seconds("lease-ttl-s", 40, "Execution lease, renewed by progress"),
    session_ttl_s: float = _seconds("session-ttl-s", 50, "Session lifetime after its last request"),
    heartbeat_interval_s: float = _seconds("heartbeat-interval-s", 10, "Run's heartbeat cadence"),
    max_heartbeats_per_s: Annotated[
        float,
        typer.Option(
            "--max-heartbeats-per-s",
            envvar="MOONRUN_MAX_HEARTBEATS_PER_S",
            min=0,
            help="Heartbeats a second this process asks of its Runs at most: past it, the "
            "heartbeat interval and session TTL stretch with the fleet (0: never)",
        ),
    ] = 100.0,
    sweep_interval_s: float = _seconds("sweep-interval-s", 1, "How often the sweeper runs"),
    retain_finished: Annotated[
        str,
        typer.Option(
            "--retain-finished",
            envvar="MOONRUN_RETAIN_FINISHED",
            help="How long finished jobs are kept, with their logs and artifacts "
            "(30d, 12h, 90m, 45s; 0 keeps them forever)",
        ),
    ] = "30d",
    join_token_ttl_s: float = _seconds("join-token-ttl-s", 900, "Lifetime of join tokens"),
    max_attempts: Annotated[
        int, typer.Option("--max-attempts", envvar="MOONRUN_MAX_ATTEMPTS", min=1, max=1000)
    ] = 5,
    backoff_initial_s: Annotated[
        float, typer.Option("--backoff-initial-s", envvar="MOONRUN_BACKOFF_INITIAL_S", min=0)
    ] = 1,
    backoff_multiplier: Annotated[
        float, typer.Option("--backoff-multiplier", envvar="MOONRUN_BACKOFF_MULTIPLIER", min=1)
    ] = 2,
    backoff_max_s: Annotated[
        float, typer.Option("--backoff-max-s", envvar="MOONRUN_BACKOFF_MAX_S", min=0)
    ] = 300,
    header_timeout_s: float = _seconds(
        "header-timeout-s",
        10,
        "A request head must arrive within this long, or the connection closes",
    ),
    body_timeout_s: float = _seconds(
        "body-timeout-s",
        10,
        "A request body must arrive within this long of its head, plus 1 s per "
        "--min-body-rate bytes that did arrive, or the connection closes",
    ),
    min_body_rate: int = _bytes(
        "min-body-rate",
        16_384,
        "Bytes a second a body must average once --body-timeout-s has passed",
    ),
    max_head_bytes: int = _bytes(
        "max-head-bytes",
        65_536,
        "A request head (request line and headers) over this is refused with 431",
    ),
    keep_alive_s: Annotated[
        int,
        typer.Option(
            "--keep-alive-s",
            envvar="MOONRUN_KEEP_ALIVE_S",
            min=1,
            help="An idle connection closes after this long (keep it above Run's heartbeat "
            "interval, so that heartbeats reuse their connection)",
        ),
    ] = 20,
    max_connections: Annotated[
        int | None,
        typer.Option(
            "--max-connections",
            envvar="MOONRUN_MAX_CONNECTIONS",
            min=1,
            help="Open connections at most; one more evicts the one waiting longest for its "
            "request (head, or a body nobody vouched for) [default: the open-files limit less "
            "128]",
        ),
    ] = None,
    trusted_proxy: Annotated[
        list[str] | None,
        typer.Option(
            "--trusted-proxy",
            envvar="MOONRUN_TRUSTED_PROXY",
            help="Address (or CIDR) of a reverse proxy whose X-Forwarded-For and "
            "X-Forwarded-Proto are believed; repeatable [default: none]",
        ),
    ] = None,
    api_docs: Annotated[
        bool,
        typer.Option(
            "--api-docs",
            envvar="MOONRUN_API_DOCS",
            help="Serve /docs and /redoc (their pages load scripts from a CDN)",
        ),
    ] = False,
    log_line_bytes: int = _bytes("log-line-bytes", 16_384, "Longer log lines are cut to this"),
    log_attempt_bytes: int = _bytes(
        "log-attempt-bytes", 4_194_304, "Log text kept per attempt (its newest lines)"
    ),
    log_total_bytes: int = _bytes(
        "log-total-bytes", 268_435_456, "Log store size; oldest attempts' lines go first"
    ),
    artifact_attempt_bytes: int = _bytes(
        "artifact-attempt-bytes",
        2_147_483_648,
        "Artifact bytes an attempt may store, over all its artifacts",
    ),
    log_level: Annotated[str, typer.Option("--log-level", envvar="MOONRUN_LOG_LEVEL")] = "info",
) -> None:
    """Serve the Run API, the user API, /healthz and /metrics, and run the sweeper.

    MOONRUN_BOOTSTRAP_ADMIN_TOKEN=<token> (at least 32 characters after an optional `mra_`)
    makes platform admin `admin` hold that token at start: it is created, or its API token is
    rotated to this one (the old one stops working).
    """
    import ipaddress
    import logging
    import resource

    from moonrun import jsonlog
    from moonrun.artifacts.protocol import ArtifactLimits
    from moonrun.http.edge import (
        EdgeLimits,
        ServeSettings,
        default_max_connections,
        server_config,
        stopping_server,
    )
    from moonrun.logs.protocol import LogLimits
    from moonrun.service.config import SchedulingSettings
    from moonrun.service.directory import check_bootstrap_token
    from moonrun.wiring.app import create_app
    from moonrun.wiring.collector import tune_for_serving
    from moonrun.wiring.settings import (
        PlatformConfig,
        build_platform,
        parse_retention,
        secret_created_notice,
    )

    try:  # before the logs are configured: a usage error changes nothing
        retain_finished_s = parse_retention(retain_finished)
    except ValueError as error:
        raise usage_error(str(error)) from None
    jsonlog.configure(log_level)
    bootstrap_token = os.environ.get("MOONRUN_BOOTSTRAP_ADMIN_TOKEN") or None
    if bootstrap_token is not None:
        try:
            check_bootstrap_token(bootstrap_token)
        except InvalidRequest as error:
            raise usage_error(f"MOONRUN_BOOTSTRAP_ADMIN_TOKEN: {error.message}") from None
    config = PlatformConfig(
        store_url=store,
        listen=listen,
        secret_file=secret_file,
        data_dir=data_dir,
        bootstrap_admin_token=bootstrap_token,
        scheduling=SchedulingSettings(
            ack_timeout_s=ack_timeout_s,
            lease_ttl_s=lease_ttl_s,
            session_ttl_s=session_ttl_s,
            heartbeat_interval_s=heartbeat_interval_s,
            max_heartbeats_per_s=max_heartbeats_per_s,
            join_token_ttl_s=join_token_ttl_s,
            max_attempts=max_attempts,
            backoff_initial_s=backoff_initial_s,
            backoff_multiplier=backoff_multiplier,
            backoff_max_s=backoff_max_s,
            retain_finished_s=retain_finished_s,
        ),
        sweep_interval_s=sweep_interval_s,
        logs=LogLimits(
            line_bytes=log_line_bytes,
            attempt_bytes=log_attempt_bytes,
            total_bytes=log_total_bytes,
        ),
        artifacts=ArtifactLimits(attempt_bytes=artifact_attempt_bytes),
    )
    try:
        host, port = config.host_and_port
    except ValueError as error:
        raise InvalidRequest(str(error)) from None
    if max_connections is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        max_connections = default_max_connections(-1 if soft == resource.RLIM_INFINITY else soft)
    for proxy in trusted_proxy or ():
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            raise InvalidRequest(
                f"--trusted-proxy must be an IP address or network, not {proxy!r}"
            ) from None
    serving = ServeSettings(
        limits=EdgeLimits(
            header_timeout_s,
            max_connections,
            body_timeout_s=body_timeout_s,
            min_body_rate=min_body_rate,
            max_head_bytes=max_head_bytes,
        ),
        keep_alive_s=keep_alive_s,
        trusted_proxies=tuple(trusted_proxy or ()),
    )
    secret_is_new = not config.secret_path.exists()
    platform = build_platform(config)
    try:
        if secret_is_new:
            # Said once, the start that made it: a secret made without a word (by default in
            # ./.moonrun) is one an operator will not back up or copy to the next replica.
            notice = secret_created_notice(config)
            typer.echo(f"moonrun: note: {notice}", err=True)
            logging.getLogger("moonrun.platform").info(notice)
        if not platform.directory.has_platform_admin():
            warning = (
                "the store has no platform admin, so nobody can manage this platform; make one "
                f"with: {BOOTSTRAP_HINT} (or set MOONRUN_BOOTSTRAP_ADMIN_TOKEN)"
            )
            typer.echo(f"moonrun: warning: {warning}", err=True)
            logging.getLogger("moonrun.platform").warning(warning)
        app = create_app(platform, api_docs=api_docs)
        server = stopping_server(
            server_config(app, host, port, serving), on_stop=platform.service.waiters.stop
        )
        tune_for_serving()
        server.run()
    finally:
        platform.close()
        platform.release()


@admin_app.command("bootstrap")
@one_line_errors
def admin_bootstrap(
    store: StoreOption = DEFAULT_STORE_URL,
    name: Annotated[
        str, typer.Option("--name", help="The platform admin to create or give a new token")
    ] = "admin",
    password_stdin: Annotated[
        bool,
        typer.Option(
            "--password-stdin",
            help="Also set the admin's console password, read from the first line of stdin",
        ),
    ] = False,
) -> None:
    """Create a platform admin, or rotate its API token, directly in the store (no platform
    needs to run); print the new API token once.

    Exit codes: 0 done; 1 an error (e.g. the store cannot be opened); 2 bad usage (a bad name
    or password, a name held by a user who is not a platform admin, a memory:// store).
    """
    from moonrun.clock import SystemClock
    from moonrun.security.tokens import API_PREFIX, SystemTokenSource
    from moonrun.service.directory import Directory
    from moonrun.store import open_store
    from moonrun.store.sql import SqlStore
    from moonrun.wiring.settings import PlatformConfig

    if store.startswith("memory:"):
        raise usage_error("a memory:// store is gone when this command exits; give --store")
    password = None
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise usage_error("--password-stdin: stdin's first line is empty")
    path = PlatformConfig(store_url=store).store_path
    made_here = path is not None and not path.exists()
    opened = open_store(store)
    where = opened.description if isinstance(opened, SqlStore) else store
    try:
        tokens = SystemTokenSource()
        directory = Directory(opened, SystemClock(), tokens)
        api_token = tokens.token(API_PREFIX)
        try:
            admin, outcome = directory.bootstrap_admin(api_token, name, password)
        except InvalidRequest as error:
            raise usage_error(error.message) from None
    finally:
        opened.close()
    said = {"created": "created", "rotated": "has a new API token", "unchanged": "is unchanged"}
    signs_in = "; it can sign in to the console" if password is not None else ""
    if made_here and path is not None:
        # A mistyped or forgotten --store (the default is ./.moonrun/platform.db) would else
        # give a token for a store no platform serves, without a word.
        typer.echo(
            f"moonrun: warning: there was no store at {path.absolute()}: this command created it; "
            "a platform serving another store does not know this admin (give --store)",
            err=True,
        )
    typer.echo(
        f"platform admin {admin.name} ({admin.id}) {said[outcome.value]} in {where}{signs_in}",
        err=True,
    )
    typer.echo(api_token)


PlatformOption = Annotated[
    str,
    typer.Option("--platform", envvar="MOONRUN_PLATFORM", help="The platform's base URL"),
]
DataDirOption = Annotated[
    Path,
    typer.Option("--data-dir", envvar="MOONRUN_RUN_DATA_DIR", help="Run's data directory"),
]


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"--platform must be an http:// or https:// URL, not {url!r}")
    return url.rstrip("/")


@run_app.command("join")
@one_line_errors
def run_join(
    platform: PlatformOption,
    token: Annotated[
        str, typer.Option("--token", envvar="MOONRUN_JOIN_TOKEN", help="The one-time join token")
    ],
    data_dir: DataDirOption,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            help="KEY=VALUE: a label this Run proposes for its endpoint (repeatable); labels "
            "an admin set win, and an admin may change them later",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help='Print {"platform", "endpoint_id"} as JSON')
    ] = False,
) -> None:
    """Join a platform once: create the identity key (0600) and burn the join token (tried
    again with backoff when no answer comes; the same token and key again are the same join)."""
    import asyncio

    from moonrun.client.labelargs import naming_labels, parse_pairs
    from moonrun.run import client, identity
    from moonrun.scheduling.labels import check_labels
    from moonrun.security.tokens import b64url

    url = _check_url(platform)
    # Checked here too, so a bad label is said before a key is made or a token is sent.
    labels = None
    if label:
        proposed = parse_pairs(label, "--label")
        with naming_labels(proposed):
            labels = dict(check_labels(proposed))
    key = identity.join_key(data_dir)
    public = key.public_key().public_bytes_raw()
    try:
        endpoint_id = asyncio.run(client.join(url, token, b64url(public), labels=labels))
    except JoinUnconfirmed:
        raise  # the key stays: the same command again re-presents it (the same join)
    except BaseException:
        identity.forget_key(data_dir)
        raise
    identity.save_endpoint(data_dir, endpoint_id, url)
    if as_json:
        typer.echo(json.dumps({"platform": url, "endpoint_id": endpoint_id}))
    else:
        typer.echo(f"joined {url} as endpoint {endpoint_id}")


@run_app.command("start")
@one_line_errors
def run_start(
    platform: PlatformOption,
    data_dir: DataDirOption,
    capacity: Annotated[
        int,
        typer.Option(
            "--capacity",
            envvar="MOONRUN_CAPACITY",
            min=1,
            max=1024,
            help="How many attempts to hold at once",
        ),
    ] = 4,
    cancel_grace_s: Annotated[
        float,
        typer.Option(
            "--cancel-grace-s",
            envvar="MOONRUN_CANCEL_GRACE_S",
            min=0,
            help="SIGTERM-to-SIGKILL grace for cancelled commands",
        ),
    ] = 10.0,
    grace_s: Annotated[
        float,
        typer.Option(
            "--grace",
            envvar="MOONRUN_GRACE_S",
            min=0,
            help="On SIGTERM, seconds held attempts may take to finish before they are stopped "
            "(a second SIGTERM stops at once)",
        ),
    ] = 30.0,
    max_artifact_bytes: int = _bytes(
        "max-artifact-bytes",
        1_073_741_824,
        "A bigger artifact is not uploaded (its job's log says so)",
    ),
    run_as: Annotated[
        str | None,
        typer.Option(
            "--run-as",
            envvar="MOONRUN_RUN_AS",
            help="Run commands as this user (name or uid) and its groups; needs Run as root",
        ),
    ] = None,
    run_as_range: Annotated[
        str | None,
        typer.Option(
            "--run-as-range",
            envvar="MOONRUN_RUN_AS_RANGE",
            help="FIRST-LAST: run each owner's commands under a uid (and group) of its own from "
            "this range, mapped on first use; with a private /tmp and PID view per attempt "
            "where the host allows; needs Run as root",
        ),
    ] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            "--work-dir",
            envvar="MOONRUN_RUN_WORK_DIR",
            help="Where attempts' working directories are made (0711, Run's own) "
            "[default: <data dir>-work]",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", envvar="MOONRUN_LOG_LEVEL")] = "info",
) -> None:
    """Run the agent: register, reconcile the journal, then claim and execute jobs."""
    import asyncio
    import logging
    import signal

    from moonrun import jsonlog
    from moonrun.run import identity
    from moonrun.run.agent import Agent, RunConfig
    from moonrun.run.confinement import (
        CommandUser,
        child_environment,
        command_user_warning,
    )
    from moonrun.run.handlers import load_handlers
    from moonrun.run.journal import Journal
    from moonrun.run.owners import parse_range

    url = _check_url(platform)
    jsonlog.configure(log_level)
    euid = os.geteuid()
    user = CommandUser.named(run_as) if run_as else CommandUser.effective()
    if user.uid != euid and euid != 0:
        raise InvalidRequest(f"--run-as {run_as} needs Run to run as root (it changes uids)")
    owner_range = parse_range(run_as_range) if run_as_range else None
    if owner_range is not None and euid != 0:
        raise InvalidRequest(f"--run-as-range {run_as_range} needs Run to run as root")
    switch = user if user.uid != euid else None
    identity.make_private(data_dir)
    held = identity.load(data_dir)
    lock = identity.hold_lock(data_dir)
    journal = Journal.open(data_dir)
    confinement = _confinement(
        data_dir,
        work_dir,
        switch,
        child_environment(os.environ, user),
        owner_range,
        cancel_grace_s,
        journal,
    )
    config = RunConfig(
        url,
        data_dir,
        capacity,
        cancel_grace_s=cancel_grace_s,
        grace_s=grace_s,
        max_artifact_bytes=max_artifact_bytes,
        owner_uids=owner_range is not None,
    )
    agent = Agent(config, held, journal, load_handlers(confinement))
    if owner_range is None and (warning := command_user_warning(user, euid)):
        if user.uid == 0:
            typer.echo(f"moonrun: warning: {warning}", err=True)
        logging.getLogger("moonrun.run").warning(
            warning, extra={"fields": {"command_user": user.name, "uid": user.uid}}
        )

    async def serve() -> None:
        stop, drain = asyncio.Event(), asyncio.Event()

        def on_signal() -> None:
            # The first signal drains (held attempts may finish); a second one stops at once.
            (stop if drain.is_set() else drain).set()

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal)
        await agent.run(stop, drain)

    try:
        _event_loop_run(serve())
    finally:
        lock.close()


def _confinement(
    data_dir: Path,
    work_dir: Path | None,
    switch: CommandUser | None,
    environment: dict[str, str],
    owner_range: tuple[int, int] | None,
    grace_s: float,
    journal: Journal,
) -> Confinement:
    """How commands are confined on this host, from the flags and what the host allows;
    what attempts of a previous Run process left behind is stopped and removed first."""
    import logging
    import subprocess

    from moonrun.run import leftovers
    from moonrun.run.cgroups import Cgroups
    from moonrun.run.confinement import Confinement, default_work_root, make_work_root
    from moonrun.run.owners import OwnerIds
    from moonrun.run.supervisor import command_line

    said = logging.getLogger("moonrun.run")
    work_root = (work_dir or default_work_root(data_dir)).absolute()
    data = data_dir.resolve()
    if work_root.resolve() == data or data in work_root.resolve().parents:
        raise InvalidRequest(f"--work-dir {work_root} must not lie in the data directory")
    make_work_root(work_root)
    cgroups = Cgroups.of_this_process(data_dir)
    why_not = "no cgroup2 hierarchy" if cgroups is None else cgroups.usable()
    if why_not is not None:
        cgroups = None
    owner_ids = OwnerIds(data_dir, *owner_range) if owner_range is not None else None
    namespaces = False
    if owner_ids is not None:
        probe = subprocess.run(
            command_line("--probe-namespaces"),
            capture_output=True,
            text=True,
            env={},
            timeout=30,
        )
        namespaces = probe.returncode == 0
        if not namespaces:
            said.warning(
                "attempts get no private /tmp and PID view: this host does not allow new "
                "namespaces; owners are kept apart by their uids alone",
                extra={"fields": {"why": probe.stderr.strip()[:200]}},
            )
    found = leftovers.sweep(
        [entry.process for entry in journal.entries.values() if entry.process],
        work_root,
        cgroups,
        owner_ids.uids() if owner_ids is not None else set(),
        grace_s,
    )
    if any(found.values()):
        said.warning("stopped and removed what a previous Run left", extra={"fields": found})
    said.info(
        "command confinement",
        extra={
            "fields": {
                "work_root": str(work_root),
                "cgroups": str(cgroups.parent) if cgroups is not None else None,
                "no_cgroups_because": why_not,
                "owner_uids": list(owner_range) if owner_range is not None else None,
                "namespaces": namespaces,
            }
        },
    )
    return Confinement(switch, environment, work_root, cgroups, owner_ids, namespaces)


def _event_loop_run(main: Any, *, uvloop_allowed: bool = True) -> None:
    """Run a coroutine to completion on uvloop where it is installed (and allowed), else on
    asyncio."""
    import asyncio

    try:
        import uvloop
    except ImportError:
        uvloop_allowed = False
    if not uvloop_allowed:
        asyncio.run(main)
        return
    uvloop.run(main)


def with_user_verbs() -> Any:
    """Add the user verbs to `app`; returns what they read from the environment."""
    from moonrun.client import group_verbs, schedule_verbs, verbs

    verbs.register(app)
    app.add_typer(group_verbs.group_app, name="group")
    app.add_typer(schedule_verbs.schedule_app, name="schedule")
    # The user verbs read MOONRUN_PLATFORM, MOONRUN_TOKEN and the config location from here.
    return verbs.Environment.of(os.environ)


def main() -> None:
    service_verb = len(sys.argv) > 1 and sys.argv[1] in SERVICE_GROUPS
    try:
        app(obj=None if service_verb else with_user_verbs())
    except KeyboardInterrupt:
        sys.exit(130)
