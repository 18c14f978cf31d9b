"""`job submit --follow` on a terminal: log lines above one live status line that says the
state, the progress or (with none) the time since it started, and each retry as it happens
(docs/cli.md, "job submit")."""

from __future__ import annotations

from typing import Any

from moonrun.client.library import Job
from moonrun.client.verbs import retry_note, status_line, status_percent


def job(state: str, **fields: Any) -> Job:
    data = {
        "id": "job_1",
        "server_id": "srv_1",
        "kind": "command",
        "state": state,
        "attempt": 1,
        "max_attempts": 3,
        "created_at": "2026-12-03T12:00:00Z",
        "updated_at": "2026-12-03T12:00:05.000Z",
        **fields,
    }
    return Job.of(data)


def test_a_job_that_reports_no_progress_gets_no_bar_rather_than_zero_percent() -> None:
    assert status_percent(job("running")) is None
    assert status_percent(job("running", progress={"percent": None, "message": "x"})) is None
    assert status_percent(job("running", progress={"percent": 42.5, "message": None})) == 42.5
    assert status_percent(job("succeeded")) == 100.0


def test_the_status_line_carries_the_progress_message_only_while_the_job_runs() -> None:
    progress = {"percent": 40, "message": "copying"}
    assert status_line(job("running", progress=progress)) == "job_1 running copying"
    assert status_line(job("succeeded", progress=progress)) == "job_1 succeeded"


def test_a_retry_is_said_with_why_the_attempt_failed_and_when_the_next_one_starts() -> None:
    retry = {
        "next_eligible_at": "2026-12-03T12:00:07.000Z",
        "last_failure": {
            "reason": "failed",
            "code": "exit_status",
            "attempt": 1,
            "at": "2026-12-03T12:00:05.000Z",
            "message": "sh exited with status 3",
        },
    }
    said = retry_note(job("retrying", attempt=1, retry=retry))
    assert said == "attempt 1 failed: exit_status: sh exited with status 3; retry in 2 s"
    assert retry_note(job("running", attempt=2, retry=retry)) is None
