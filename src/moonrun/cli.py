"""The `moonrun` command: wiring at the edge (flags and environment in, implementations out)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Annotated, ParamSpec, TypeVar

import typer

from moonrun import __version__
from moonrun.errors import MoonrunError
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


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
