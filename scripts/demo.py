"""`make demo`: one platform, one Run, four jobs, end to end on this machine.

Starts `moonrun platform serve` over a FileStore in `.moonrun-demo/` (made afresh every run),
and through `moonrun.client` (the user API's Python client) creates an endpoint, joins and
starts one Run, creates a server and its owner, submits a `noop`, a `sleep`, a `sleep` that
fails retryably (and is retried once) and a `command`, and prints each job's JobView as it
ends. Exits 0 when every job ended as expected, 1 with the reason otherwise. Both processes
are stopped at the end, whatever happened.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moonrun.client import Client
from moonrun.errors import MoonrunError

ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = ROOT / ".moonrun-demo"
STARTUP_TIMEOUT_S = 30.0
JOBS_TIMEOUT_S = 45.0
STOP_GRACE_S = 10.0
TERMINAL = {"succeeded", "failed", "cancelled"}

# Short platform timings, so that the whole demo takes seconds (the defaults suit real hosts).
PLATFORM_TIMINGS = [
    "--heartbeat-interval-s", "1",
    "--session-ttl-s", "10",
    "--ack-timeout-s", "10",
    "--lease-ttl-s", "8",
    "--sweep-interval-s", "0.2",
    "--backoff-initial-s", "0.5",
    "--backoff-max-s", "2",
]  # fmt: skip


class DemoFailed(Exception):
    """Something in the demo did not go as expected; the message says what."""


@dataclass
class Expected:
    """A job to submit and how it must end."""

    label: str
    request: dict[str, Any]
    state: str
    attempts: int
    error_code: str | None = None


JOBS = [
    Expected("noop", {"kind": "noop"}, "succeeded", 1),
    Expected("sleep 2 s", {"kind": "sleep", "payload": {"seconds": 2}}, "succeeded", 1),
    Expected(
        "sleep that fails (retryable, 2 attempts)",
        {
            "kind": "sleep",
            "payload": {"seconds": 0.5, "fail": "retryable"},
            "max_attempts": 2,
            "backoff": {"initial_s": 0.5, "multiplier": 1, "max_s": 0.5},
        },
        "failed",
        2,
        error_code="sleep_failed",
    ),
    Expected(
        "command",
        {"kind": "command", "payload": {"argv": ["sh", "-c", "echo hello from moonrun"]}},
        "succeeded",
        1,
    ),
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def exit_status(code: int) -> str:
    """`exit N`, or the signal that ended the process (uvicorn re-raises the SIGTERM it
    handled once its graceful shutdown is done)."""
    return f"exit {code}" if code >= 0 else f"on {signal.Signals(-code).name}"


def moonrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "moonrun", *args]


class Process:
    """A moonrun process writing to a log file in the demo directory."""

    def __init__(self, name: str, command: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.log = DEMO_DIR / f"{name}.log"
        with self.log.open("wb") as log:
            self.popen = subprocess.Popen(
                command,
                cwd=DEMO_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def check_alive(self) -> None:
        code = self.popen.poll()
        if code is not None:
            raise DemoFailed(f"{self.name} exited with status {code}\n{self.tail()}")

    def tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(f"    {self.name}| {line}" for line in text) or "    (no output)"

    def stop(self) -> str:
        """SIGTERM, then SIGKILL after a grace; says how it ended."""
        if self.popen.poll() is not None:
            return f"{self.name} had already exited ({exit_status(self.popen.returncode)})"
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            return f"{self.name} did not stop within {STOP_GRACE_S:.0f} s; killed"
        return f"{self.name} stopped ({exit_status(self.popen.returncode)})"


def wait_healthy(platform: Process, base_url: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        platform.check_alive()
        try:
            with urllib.request.urlopen(base_url + "/healthz", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise DemoFailed(f"the platform did not become healthy in {STARTUP_TIMEOUT_S:.0f} s")


def prune(value: Any) -> Any:
    """The value without nulls and empty containers (a compact view to print)."""
    if isinstance(value, dict):
        kept = {key: prune(item) for key, item in value.items()}
        return {key: item for key, item in kept.items() if item not in (None, {}, [])}
    if isinstance(value, list):
        return [prune(item) for item in value]
    return value


def show(expected: Expected, view: dict[str, Any], seconds: float, log_lines: list[str]) -> None:
    mark = "ok" if problem(expected, view) is None else "UNEXPECTED"
    print(
        f"\n[{mark}] {expected.label}: {view['state']} after {view['attempt']} of "
        f"{view['max_attempts']} attempt(s), {seconds:.1f} s after submission"
    )
    for key, value in prune(view).items():
        text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
        print(f"    {key}: {text}")
    for line in log_lines:
        print(f"    log| {line}")


def problem(expected: Expected, view: dict[str, Any]) -> str | None:
    terminal = view.get("terminal") or {}
    code = (terminal.get("error") or {}).get("code")
    if (view["state"], view["attempt"]) != (expected.state, expected.attempts):
        return (
            f"{expected.label} ended {view['state']} after {view['attempt']} attempt(s); "
            f"expected {expected.state} after {expected.attempts}"
        )
    if expected.error_code is not None and code != expected.error_code:
        return f"{expected.label} failed with code {code}; expected {expected.error_code}"
    return None


def log_lines(client: Client, job_id: str, wait_s: float) -> list[str]:
    """The job's log lines; Run ships them about once a second, so wait a little for them."""
    deadline = time.monotonic() + wait_s
    while True:
        lines = list(client.logs(job_id))
        if lines or time.monotonic() > deadline:
            return [f"{line.stream}: {line.text}" for line in lines]
        time.sleep(0.2)


def demo(processes: list[Process]) -> list[str]:
    """The demo itself; returns the problems found (none when all went as expected)."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    admin_token = "mra_" + secrets.token_urlsafe(32)
    env = {**os.environ, "MOONRUN_BOOTSTRAP_ADMIN_TOKEN": admin_token}
    env.pop("MOONRUN_PLATFORM", None)

    print(f"== platform: moonrun platform serve on {base_url}, store {DEMO_DIR.name}/platform.db")
    platform = Process(
        "platform",
        moonrun(
            "platform",
            "serve",
            "--store",
            f"file:{DEMO_DIR / 'platform.db'}",
            "--listen",
            f"127.0.0.1:{port}",
            *PLATFORM_TIMINGS,
        ),
        env,
    )
    processes.append(platform)
    wait_healthy(platform, base_url)
    admin = Client(base_url, admin_token)

    endpoint, join_token = admin.create_endpoint("demo-host")
    endpoint_id = endpoint.id
    print(f"== endpoint demo-host created ({endpoint_id}); joining Run with its one-time token")
    run_dir = DEMO_DIR / "run"
    run_dir.mkdir(mode=0o700)
    run_env = {key: value for key, value in env.items() if key != "MOONRUN_BOOTSTRAP_ADMIN_TOKEN"}
    joined = subprocess.run(
        moonrun(
            "run",
            "join",
            "--platform",
            base_url,
            "--token",
            join_token,
            "--data-dir",
            str(run_dir),
        ),
        env=run_env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if joined.returncode != 0:
        raise DemoFailed(f"moonrun run join failed: {joined.stderr.strip()}")
    print(f"   {joined.stdout.strip()}")

    print(f"== Run: moonrun run start --data-dir {DEMO_DIR.name}/run --capacity 4")
    run = Process(
        "run",
        moonrun(
            "run",
            "start",
            "--platform",
            base_url,
            "--data-dir",
            str(run_dir),
            "--capacity",
            "4",
            "--cancel-grace-s",
            "2",
        ),
        run_env,
    )
    processes.append(run)

    owner, owner_token = admin.create_user("demo-owner")
    server = admin.create_server("demo-server", endpoint_id, owner.id)
    admin.close()
    print(f"== server demo-server ({server.id}) owned by demo-owner; submitting as the owner")
    client = Client(base_url, owner_token)

    submitted: dict[str, tuple[Expected, float]] = {}
    for expected in JOBS:
        request = expected.request
        job = client.submit(
            server.id,
            request["kind"],
            request.get("payload"),
            max_attempts=request.get("max_attempts"),
            backoff=request.get("backoff"),
        )
        submitted[job.id] = (expected, time.monotonic())
        print(f"   submitted {expected.label}: {job.id} ({job.state})")

    problems: list[str] = []
    deadline = time.monotonic() + JOBS_TIMEOUT_S
    while submitted:
        platform.check_alive()
        run.check_alive()
        if time.monotonic() > deadline:
            for job_id, (expected, _) in submitted.items():
                view = client.job(job_id).data
                problems.append(
                    f"{expected.label} did not end within {JOBS_TIMEOUT_S:.0f} s "
                    f"(still {view['state']}, attempt {view['attempt']})"
                )
            break
        for job_id, (expected, since) in list(submitted.items()):
            view = client.job(job_id).data
            if view["state"] not in TERMINAL:
                continue
            seconds = time.monotonic() - since
            del submitted[job_id]
            lines = log_lines(client, job_id, 3.0 if expected.request["kind"] == "command" else 0)
            show(expected, view, seconds, lines)
            found = problem(expected, view)
            if found is not None:
                problems.append(found)
            if expected.request["kind"] == "command" and "stdout: hello from moonrun" not in lines:
                problems.append("the command's output did not reach the platform's logs")
        time.sleep(0.2)
    client.close()
    return problems


def on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, on_sigterm)
    shutil.rmtree(DEMO_DIR, ignore_errors=True)
    DEMO_DIR.mkdir(mode=0o700)
    processes: list[Process] = []
    began = time.monotonic()
    problems: list[str] = []
    try:
        problems = demo(processes)
    except DemoFailed as error:
        problems = [str(error)]
    except MoonrunError as error:  # the user API refused or could not be reached
        problems = [f"{error.code}: {error}"]
    except KeyboardInterrupt:
        problems = ["interrupted"]
    finally:
        print("\n== stopping")
        for process in reversed(processes):  # Run first, then the platform it talks to
            print(f"   {process.stop()}")
    if problems:
        print("\ndemo FAILED:", file=sys.stderr)
        for found in problems:
            print(f"  - {found}", file=sys.stderr)
        for process in processes:
            print(f"  last lines of {process.log.relative_to(ROOT)}:", file=sys.stderr)
            print(process.tail(), file=sys.stderr)
        return 1
    took = time.monotonic() - began
    print(f"\ndemo OK in {took:.1f} s: every job ended as expected; logs in {DEMO_DIR.name}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
