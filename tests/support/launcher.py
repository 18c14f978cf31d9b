"""Real `moonrun` processes, started one way for every suite and bench that needs them.

`Process` is one command, restartable, whose output (every start's) is appended to one log
file; `PlatformProcess` is `moonrun platform serve` on a free loopback port, started when its
`/healthz` answers 200; `RunProcess` is `moonrun run join` once and `moonrun run start` as
often as wanted. The real-process tests (tests/process/) build on these with their own helpers
over the user API (tests/support/e2e.py, tests/support/faults.py), and so do the benches
(bench/kit.py). Every wait is bounded and polls: these are real processes on the real clock,
and a bound here guards against a hang, it never judges speed.

Nothing here imports pytest, so `bench/` (which runs as plain scripts) imports it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "mra_" + secrets.token_urlsafe(32)
"""The bootstrap admin token of every platform started here (one per test session)."""
STARTUP_TIMEOUT_S = 30.0
WAIT_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.05
LOG_TAIL_LINES = 60

T = TypeVar("T")


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def command_env(admin_token: str | None = ADMIN_TOKEN) -> dict[str, str]:
    """The environment of a child `moonrun` process: this checkout's code, the bootstrap
    admin token (when given), unbuffered output, and none of the caller's other MOONRUN_*
    settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOONRUN_")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    if admin_token is not None:
        env["MOONRUN_BOOTSTRAP_ADMIN_TOKEN"] = admin_token
    return env


def moonrun(*arguments: str) -> list[str]:
    """The command line of `moonrun ...` from this checkout."""
    return [sys.executable, "-m", "moonrun", *arguments]


def serve_command(store_url: str, port: int, secret_file: Path, data_dir: Path) -> list[str]:
    """`moonrun platform serve` on loopback `port`."""
    return moonrun(
        "platform",
        "serve",
        "--store",
        store_url,
        "--listen",
        f"127.0.0.1:{port}",
        "--secret-file",
        str(secret_file),
        "--data-dir",
        str(data_dir),
    )


@dataclass(frozen=True)
class Timings:
    """The platform's timing flags: short, so that the real-process suites are fast."""

    lease_ttl_s: float = 8
    ack_timeout_s: float = 3
    heartbeat_interval_s: float = 1
    session_ttl_s: float = 6
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 2
    sweep_interval_s: float = 0.2

    def flags(self) -> list[str]:
        return [
            f"--lease-ttl-s={self.lease_ttl_s}",
            f"--ack-timeout-s={self.ack_timeout_s}",
            f"--heartbeat-interval-s={self.heartbeat_interval_s}",
            f"--session-ttl-s={self.session_ttl_s}",
            f"--backoff-initial-s={self.backoff_initial_s}",
            f"--backoff-max-s={self.backoff_max_s}",
            f"--sweep-interval-s={self.sweep_interval_s}",
        ]


def wait_for(
    probe: Callable[[], T | None],
    what: str,
    *,
    timeout_s: float = WAIT_TIMEOUT_S,
    every_s: float = POLL_INTERVAL_S,
) -> T:
    """Poll `probe` until it returns something truthy (returned); fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


def read_events(path: Path) -> list[dict[str, Any]]:
    """The JSON log lines of a process's output file (other lines are skipped)."""
    events = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                events.append(event)
    return events


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (an orphan's zombie may linger)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


class Process:
    """One command at a time, restartable; every start appends its output to `log`."""

    def __init__(
        self, name: str, workdir: Path, log: Path | None = None, *, piped: bool = False
    ) -> None:
        self.name = name
        self.workdir = workdir
        """The command's working directory."""
        self.log = log or workdir / f"{name}.log"
        self.piped = piped
        """Output through a pipe that a thread copies to `log`, rather than straight into the
        file: a child whose file size is limited (RLIMIT_FSIZE) can still write it."""
        self.starts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.copier: threading.Thread | None = None

    def spawn(
        self,
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        """Start `command` with `env` (by default `command_env()`) and `extra_env` on top."""
        assert self.process is None, f"{self.name} is already running"
        self.starts += 1
        with self.log.open("ab") as log:
            log.write(f"--- {self.name} start {self.starts}: {' '.join(command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command,
                cwd=self.workdir,
                env={**(command_env() if env is None else env), **(extra_env or {})},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if self.piped else log,
                stderr=subprocess.STDOUT,
            )
        if self.piped:
            self.copier = threading.Thread(target=self._copy, args=(self.process,), daemon=True)
            self.copier.start()

    def _copy(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        with self.log.open("ab") as log:
            for line in process.stdout:
                log.write(line)
                log.flush()

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} is not running"
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        """Fail, saying so, when the process has exited."""
        assert self.process is not None, f"{self.name} is not running"
        code = self.process.poll()
        if code is not None:
            raise AssertionError(f"{self.name} exited with code {code}")

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL (after SIGCONT, in case it was paused; no graceful shutdown) and reap."""
        if self.process is None:
            return
        if self.process.poll() is None:
            for signum in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(self.process.pid, signum)
                except ProcessLookupError:
                    break
        self.process.wait(timeout=30)
        if self.copier is not None:
            self.copier.join(timeout=30)
            self.copier = None
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None

    def terminate(self) -> None:
        """SIGTERM, without waiting."""
        self.signal(signal.SIGTERM)

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        """Wait with a bound for the process to exit, and reap; returns the exit code (raises
        `subprocess.TimeoutExpired` past the bound, the process killed)."""
        assert self.process is not None, f"{self.name} is not running"
        try:
            code = self.process.wait(timeout=timeout_s)
        finally:
            self.kill()
        return code

    def stop(self, grace_s: float = 30.0) -> int:
        """SIGTERM (a graceful shutdown), then `wait_exit`; returns the exit code."""
        self.terminate()
        return self.wait_exit(grace_s)

    def close(self) -> None:
        """Kill the process (if running) and release what it holds."""
        self.kill()

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(text[-lines:]) or "(empty)"

    def events(self, message: str | None = None) -> list[dict[str, Any]]:
        """The JSON log lines across every start, optionally only those with `message`."""
        events = read_events(self.log)
        return [e for e in events if message is None or e.get("msg") == message]


def wait_healthy(process: Process, url: str, path: str = "/healthz") -> None:
    """Wait, with a bound, until `url + path` answers 200; fail if the process exits first."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        process.check_alive()
        try:
            response = httpx.get(url + path, timeout=1.0)
        except httpx.TransportError as error:
            last = repr(error)
        else:
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text}"
        time.sleep(POLL_INTERVAL_S)
    raise AssertionError(f"{process.name} did not answer {path} in {STARTUP_TIMEOUT_S} s: {last}")


class PlatformProcess(Process):
    """`moonrun platform serve` on one free port, store, secret file and data directory, with
    `flags` after the command; under `ulimit -n open_files` when given. `client` speaks to it
    as the bootstrap admin."""

    def __init__(
        self,
        workdir: Path,
        store_url: str | None = None,
        *,
        flags: tuple[str, ...] | list[str] = (),
        open_files: int | None = None,
        piped: bool = False,
        admin_token: str = ADMIN_TOKEN,
        secret_file: Path | None = None,
        name: str = "the platform",
    ) -> None:
        super().__init__(name, workdir, workdir / "platform.log", piped=piped)
        self.store_url = store_url or f"file:{workdir / 'platform.db'}"
        self.flags = list(flags)
        self.open_files = open_files
        self.admin_token = admin_token
        self.secret_file = secret_file or workdir / "platform.secret"
        self.data_dir = workdir / "platform-data"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        admin = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.client = httpx.Client(base_url=self.url, timeout=10.0, headers=admin)

    def command(self) -> list[str]:
        command = [
            *serve_command(self.store_url, self.port, self.secret_file, self.data_dir),
            *self.flags,
        ]
        if self.open_files is not None:
            command = ["sh", "-c", f'ulimit -n {self.open_files} && exec "$@"', "sh", *command]
        return command

    def start(self) -> None:
        """Start an instance and wait, with a bound, until /healthz answers 200."""
        self.spawn(self.command(), env=command_env(self.admin_token))
        wait_healthy(self, self.url)

    def restart(self) -> None:
        """SIGKILL and start again on the same store, secret, data directory and port."""
        self.kill()
        self.start()

    def close(self) -> None:
        super().close()
        self.client.close()


class RunProcess(Process):
    """`moonrun run join` once, then `moonrun run start` as often as wanted, on one data
    directory."""

    def __init__(
        self, name: str, workdir: Path, data_dir: Path, log: Path, capacity: int = 4
    ) -> None:
        super().__init__(name, workdir, log)
        self.data_dir = data_dir
        self.capacity = capacity

    def join(self, platform_url: str, token: str) -> str:
        """`moonrun run join` with a one-time join token; returns what it printed."""
        self.data_dir.mkdir(exist_ok=True)
        joined = subprocess.run(
            moonrun(
                "run",
                "join",
                "--platform",
                platform_url,
                "--token",
                token,
                "--data-dir",
                str(self.data_dir),
            ),
            cwd=self.workdir,
            env=command_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert joined.returncode == 0, f"run join failed: {joined.stdout}{joined.stderr}"
        return joined.stdout

    def start_command(
        self, platform_url: str, *, cancel_grace_s: float = 2.0, options: tuple[str, ...] = ()
    ) -> list[str]:
        return moonrun(
            "run",
            "start",
            "--platform",
            platform_url,
            "--data-dir",
            str(self.data_dir),
            "--capacity",
            str(self.capacity),
            "--cancel-grace-s",
            str(cancel_grace_s),
            *options,
        )

    def start(
        self,
        platform_url: str,
        *,
        cancel_grace_s: float = 2.0,
        options: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        """Start Run (with more `options` and environment variables, if given); returns at
        once (the callers wait for what they need: a registration, an endpoint online)."""
        command = self.start_command(platform_url, cancel_grace_s=cancel_grace_s, options=options)
        self.spawn(command, extra_env=extra_env)
