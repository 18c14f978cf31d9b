"""What the benches share: free ports, server subprocesses, temporary MySQL databases.

The processes are the tests' launcher's (tests/support/launcher.py): one way to start a
platform for the suites and the benches alike.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # a bench runs as a script from bench/: the launcher is in tests/

from tests.support import launcher  # noqa: E402
from tests.support.launcher import free_port  # noqa: E402
from tests.support.round_robin_proxy import RoundRobinProxy  # noqa: E402

__all__ = [
    "ROOT",
    "Process",
    "RoundRobinProxy",
    "Served",
    "child_env",
    "cpu_seconds",
    "free_port",
    "platform_command",
]


TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time (user and system) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def child_env(admin_token: str | None = None) -> dict[str, str]:
    """This checkout's code, and none of the caller's MOONRUN_* settings (output buffered as
    a bench's platform always ran: the figures are measured so)."""
    env = launcher.command_env(admin_token)
    del env["PYTHONUNBUFFERED"]
    return env


class Process(launcher.Process):
    """A child process, started at once, whose output goes to `<name>.log` in `workdir`."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        workdir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(name, workdir)
        self.spawn(list(command), env=env or child_env())

    def stop(self, grace_s: float = 15) -> int | None:  # type: ignore[override]
        """SIGTERM, then SIGKILL after `grace_s`; the exit code, or None when killed."""
        if not self.running:
            self.kill()
            return None
        try:
            return super().stop(grace_s)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, lines: int = 20) -> str:
        return super().tail(lines)


class Served(Process):
    """A server subprocess on `port`."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        port: int,
        workdir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(name, command, workdir, env)
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self, path: str = "/healthz") -> None:
        """Block until `path` answers 200 (the process must not exit meanwhile)."""
        launcher.wait_healthy(self, self.url, path)


def platform_command(
    store_url: str, port: int, workdir: Path, *extra: str, log_level: str | None = "warning"
) -> list[str]:
    """`moonrun platform serve` on 127.0.0.1:`port`, with its secret and data in `workdir`
    (at `log_level`, or the platform's own when None)."""
    command = launcher.serve_command(store_url, port, workdir / "platform.secret", workdir / "data")
    levels = ["--log-level", log_level] if log_level is not None else []
    return [*command, *levels, *extra]


MYSQL_URL = os.environ.get("MOONRUN_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/")


def mysql_connect(url: str = MYSQL_URL, database: str | None = None, driver: str = "pymysql"):  # type: ignore[no-untyped-def]
    module = importlib.import_module(driver)
    parts = urlsplit(url)
    return module.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=database,
        autocommit=True,
        connect_timeout=3,
    )


@contextlib.contextmanager
def mysql_database(prefix: str = "moonrun_bench") -> Iterator[str | None]:
    """A fresh database on MOONRUN_BENCH_MYSQL_URL, dropped afterwards; None when unreachable."""
    import pymysql

    try:
        admin = mysql_connect()
    except pymysql.err.MySQLError as error:
        print(f"mysql: skipped ({error})")
        yield None
        return
    name = f"{prefix}_{secrets.token_hex(4)}"
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    parts = urlsplit(MYSQL_URL)
    try:
        yield f"{parts.scheme}://{parts.netloc}/{name}"
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


PG_URL = os.environ.get("MOONRUN_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432")


@contextlib.contextmanager
def postgres_database() -> Iterator[str | None]:
    """A fresh database on MOONRUN_BENCH_PG_URL, dropped afterwards; None when unreachable."""
    import psycopg

    name = f"moonrun_bench_{secrets.token_hex(4)}"
    try:
        with psycopg.connect(f"{PG_URL}/postgres", autocommit=True, connect_timeout=3) as admin:
            admin.execute(f"CREATE DATABASE {name}")
    except psycopg.Error as error:
        print(f"postgres: skipped ({error})")
        yield None
        return
    parts = urlsplit(PG_URL)
    try:
        yield f"{parts.scheme}://{parts.netloc}/{name}"
    finally:
        with psycopg.connect(f"{PG_URL}/postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
