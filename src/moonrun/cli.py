"""The `moonrun` command: wiring at the edge (flags and environment in, implementations out)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer

from moonrun import __version__
from moonrun.errors import InvalidRequest, MoonrunError
from moonrun.store import DEFAULT_STORE_URL, open_store
from moonrun.store.sql import SqlStore

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    help="moonrun: durable job scheduling for fleets of hosts.",
)
store_app = typer.Typer(no_args_is_help=True, help="Open, migrate and inspect a platform store.")
app.add_typer(store_app, name="store")
platform_app = typer.Typer(no_args_is_help=True, help="Run the moonrun platform.")
app.add_typer(platform_app, name="platform")

StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        envvar="MOONRUN_STORE",
        help="memory://, file:PATH or mysql://USER:PASS@HOST:PORT/DB",
        show_default=True,
    ),
]


def one_line_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Report moonrun's own errors as one line on stderr and exit 1, never a traceback."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except MoonrunError as error:
            typer.echo(f"moonrun: error: {error.message}", err=True)
            raise typer.Exit(1) from None

    return run


@app.command()
def version() -> None:
    """Print moonrun's version."""
    typer.echo(__version__)


@store_app.command("check")
@one_line_errors
def store_check(store: StoreOption = DEFAULT_STORE_URL) -> None:
    """Open the store (creating and migrating it when needed) and print what it holds."""
    opened = open_store(store)
    try:
        counts = opened.job_counts()
        where = opened.description if isinstance(opened, SqlStore) else store
        schema = (
            f", schema version {opened.schema_version()}" if isinstance(opened, SqlStore) else ""
        )
        jobs = ", ".join(f"{state}={count}" for state, count in sorted(counts.items())) or "none"
        typer.echo(f"store {where} is ready{schema}; jobs: {jobs}")
    finally:
        opened.close()


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
            help="where artifacts are kept [default: beside a file store, else .moonrun]",
        ),
    ] = None,
    ack_timeout_s: float = _seconds("ack-timeout-s", 30, "Ack deadline after a claim"),
    lease_ttl_s: float = _seconds("lease-ttl-s", 40, "Execution lease, renewed by progress"),
    session_ttl_s: float = _seconds("session-ttl-s", 50, "Session lifetime after its last request"),
    heartbeat_interval_s: float = _seconds("heartbeat-interval-s", 10, "Run's heartbeat cadence"),
    sweep_interval_s: float = _seconds("sweep-interval-s", 1, "How often the sweeper runs"),
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
    log_level: Annotated[str, typer.Option("--log-level", envvar="MOONRUN_LOG_LEVEL")] = "info",
) -> None:
    """Serve the Run API, the user API, /healthz and /metrics, and run the sweeper.

    MOONRUN_BOOTSTRAP_ADMIN_TOKEN=<token> creates a platform admin named `admin` holding that
    token at start, unless some user already holds it.
    """
    import uvicorn

    from moonrun import jsonlog
    from moonrun.platform.app import create_app
    from moonrun.platform.config import SchedulingSettings
    from moonrun.settings import PlatformConfig, build_platform

    jsonlog.configure(log_level)
    config = PlatformConfig(
        store_url=store,
        listen=listen,
        secret_file=secret_file,
        data_dir=data_dir,
        bootstrap_admin_token=os.environ.get("MOONRUN_BOOTSTRAP_ADMIN_TOKEN") or None,
        scheduling=SchedulingSettings(
            ack_timeout_s=ack_timeout_s,
            lease_ttl_s=lease_ttl_s,
            session_ttl_s=session_ttl_s,
            heartbeat_interval_s=heartbeat_interval_s,
            join_token_ttl_s=join_token_ttl_s,
            max_attempts=max_attempts,
            backoff_initial_s=backoff_initial_s,
            backoff_multiplier=backoff_multiplier,
            backoff_max_s=backoff_max_s,
        ),
        sweep_interval_s=sweep_interval_s,
    )
    try:
        host, port = config.host_and_port
    except ValueError as error:
        raise InvalidRequest(str(error)) from None
    platform = build_platform(config)
    try:
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(platform),
                host=host,
                port=port,
                log_config=None,
                access_log=False,
                timeout_graceful_shutdown=10,
            )
        )
        server.run()
    finally:
        platform.store.close()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
