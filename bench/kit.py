"""What the benches share: free ports, server subprocesses, temporary MySQL databases."""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def child_env(admin_token: str | None = None) -> dict[str, str]:
    """This checkout's code, and none of the caller's MOONRUN_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOONRUN_")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + str(ROOT)
    if admin_token is not None:
        env["MOONRUN_BOOTSTRAP_ADMIN_TOKEN"] = admin_token
    return env


class Process:
    """A child process whose output goes to a log file in `workdir`."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        workdir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log = workdir / f"{name}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                list(command),
                cwd=workdir,
                env=env or child_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace_s: float = 15) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait()


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
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.name} exited at start:\n{self.tail()}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(self.url + path, timeout=2) as answer,
            ):
                if answer.status == 200:
                    return
            time.sleep(0.05)
        raise SystemExit(f"{self.name} did not answer {path} in {STARTUP_TIMEOUT_S} s")


def platform_command(store_url: str, port: int, workdir: Path, *extra: str) -> list[str]:
    """`moonrun platform serve` on 127.0.0.1:`port`, with its secret and data in `workdir`."""
    return [
        sys.executable,
        "-m",
        "moonrun",
        "platform",
        "serve",
        "--store",
        store_url,
        "--listen",
        f"127.0.0.1:{port}",
        "--secret-file",
        str(workdir / "platform.secret"),
        "--data-dir",
        str(workdir / "data"),
        "--log-level",
        "warning",
        *extra,
    ]


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
