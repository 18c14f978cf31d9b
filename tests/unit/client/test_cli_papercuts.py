"""The user verbs as a Nomad or Buildkite CLI user expects them (docs/cli.md): `-h`, a
platform given without its scheme, a cancel that came too late, several states, --limit,
one stream of the logs. The CLI runs in-process against a platform served on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.console_kit import serve
from tests.support.http_harness import http_world
from tests.support.stores import memory_factory
from tests.support.terminal import Terminal


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        yield Terminal(cast, served.url, tmp_path)


def submit(terminal: Terminal, **body: Any) -> str:
    """A job of the owner's on the cast's server (`body` as the API takes it)."""
    cast = terminal.cast
    job_id: str = cast.world.submit(cast.server_id, cast.owner[1], **body)["id"]
    return job_id


def test_dash_h_is_help_everywhere(terminal: Terminal) -> None:
    for args in (["-h"], ["job", "-h"], ["job", "list", "-h"], ["store", "backup", "-h"]):
        shown = terminal(*args)
        assert (shown.exit_code, "Usage:" in shown.output) == (0, True), args


def test_login_with_a_platform_without_its_scheme_is_a_usage_error_naming_the_fix(
    terminal: Terminal,
) -> None:
    result = terminal("login", "--platform", "127.0.0.1:8470", stdin="token\n")
    assert result.exit_code == 2
    said = " ".join(result.output.replace("│", " ").split())  # as typed, out of rich's box
    assert "did you mean http://127.0.0.1:8470" in said


def test_cancelling_a_job_that_had_already_ended_says_so(terminal: Terminal) -> None:
    job_id = submit(terminal)
    run = terminal.cast.run.start()
    attempt = run.run_to_running(job_id)
    assert run.result(job_id, attempt, "succeeded").status_code == 200
    result = terminal("job", "cancel", job_id)
    assert result.exit_code == 0
    assert result.output.strip() == f"job {job_id} had already ended (succeeded): nothing to cancel"


def test_a_repeated_state_lists_jobs_in_any_of_them_newest_first_and_limit_keeps_the_newest(
    terminal: Terminal,
) -> None:
    first, second, third = submit(terminal), submit(terminal), submit(terminal)
    assert terminal("job", "cancel", second).exit_code == 0
    run = terminal.cast.run.start()
    assert run.run_to_running(first) == 1
    listed = terminal("job", "list", "--state", "running", "--state", "cancelled", "--json")
    assert [job["id"] for job in json.loads(listed.output)] == [second, first]
    newest = terminal("job", "list", "--limit", "2", "--json")
    assert [job["id"] for job in json.loads(newest.output)] == [third, second]


def test_job_logs_prints_one_stream_when_asked(terminal: Terminal) -> None:
    job_id = submit(terminal)
    run = terminal.cast.run.start()
    attempt = run.run_to_running(job_id)
    lines = [
        {"ts": "2026-12-03T11:00:00.000Z", "stream": "stdout", "text": "out-1"},
        {"ts": "2026-12-03T11:00:00.000Z", "stream": "stderr", "text": "err-1"},
        {"ts": "2026-12-03T11:00:00.000Z", "stream": "stdout", "text": "out-2"},
    ]
    body = {**run.evidence(job_id, attempt), "job_id": job_id, "seq": 1, "lines": lines}
    assert run.post("/run/v1/logs", body).status_code == 202
    assert terminal("job", "logs", job_id, "--stream", "stderr").output == "err-1\n"
    assert terminal("job", "logs", job_id).output == "out-1\nerr-1\nout-2\n"
    assert terminal("job", "logs", job_id, "--stream", "both").exit_code == 2
