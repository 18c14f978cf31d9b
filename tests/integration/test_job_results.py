"""What a job did, at a glance: every handler's bounded result lands in the ended job's view
(docs/kinds.md, "Results"); the payload only when asked for, redacted
(tests/integration/test_job_payload_shown.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moonrun.client import verbs
from moonrun.client.library import Job
from moonrun.run.handlers import RESULT_BYTES, HandlerResult, JobContext
from moonrun.run.handlers.command import CommandHandler
from moonrun.run.handlers.noop import NoopHandler
from moonrun.scheduling.views import job_view
from tests.support.console_kit import cheap_passwords, console
from tests.support.harness import World
from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory

HANG_GUARD_S = 30.0


def context_for(kind: str, payload: Any, lines: list[tuple[str, str]]) -> JobContext:
    async def remember(record: Any) -> None:
        return None

    return JobContext(
        job_id="job_1",
        attempt=1,
        kind=kind,
        payload=payload,
        started_at_ms=int(time.time() * 1000),
        now_ms=lambda: int(time.time() * 1000),
        log_line=lambda stream, text: lines.append((stream, text)),
        upload=lambda source, name: None,
        remember_process=remember,
        grace_s=2.0,
    )


async def run_command(script: str) -> HandlerResult:
    lines: list[tuple[str, str]] = []
    context = context_for("command", {"argv": ["sh", "-c", script]}, lines)
    result: HandlerResult = await asyncio.wait_for(CommandHandler().run(context), HANG_GUARD_S)
    return result


# -- what handlers return ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_command_that_succeeds_reports_its_exit_code_duration_and_bytes() -> None:
    result = await run_command("printf 'hello\\n'; printf 'oops' >&2")
    assert result.outcome == "succeeded"
    output = result.output
    assert isinstance(output, dict)
    assert output["duration_s"] >= 0
    assert {k: v for k, v in output.items() if k != "duration_s"} == {
        "exit_code": 0,
        "signal": None,
        "stdout_bytes": 6,
        "stderr_bytes": 4,
    }


@pytest.mark.anyio
async def test_a_command_that_fails_reports_its_exit_code_in_the_result_too() -> None:
    result = await run_command("echo partial; exit 3")
    assert (result.outcome, result.error and result.error["code"]) == ("failed", "exit_status")
    assert (result.output["exit_code"], result.output["stdout_bytes"]) == (3, 8)


@pytest.mark.anyio
async def test_a_command_ended_by_a_signal_reports_the_signal_not_an_exit_code() -> None:
    result = await run_command("kill -TERM $$")
    assert result.outcome == "failed"
    assert (result.output["exit_code"], result.output["signal"]) == (None, 15)


@pytest.mark.anyio
async def test_noop_returns_an_empty_result() -> None:
    result = await NoopHandler().run(context_for("noop", {}, []))
    assert result == HandlerResult("succeeded", output={})


def test_a_result_larger_than_the_platform_keeps_fails_the_attempt_saying_so() -> None:
    big = HandlerResult("succeeded", output={"blob": "x" * RESULT_BYTES})
    bounded = big.bounded()
    assert (bounded.outcome, bounded.retryable) == ("failed", False)
    assert bounded.error is not None
    assert bounded.error["code"] == "result_too_large"
    assert str(RESULT_BYTES) in bounded.error["message"]
    fits = HandlerResult("succeeded", output={"blob": "x" * (RESULT_BYTES - 100)})
    assert fits.bounded() is fits


def test_a_result_that_is_not_json_fails_the_attempt_saying_so() -> None:
    bounded = HandlerResult("succeeded", output={"when": object()}).bounded()
    assert bounded.error is not None
    assert bounded.error["code"] == "result_invalid"


# -- the view --------------------------------------------------------------------------------------


@pytest.fixture
def world() -> Iterator[World]:
    world = World(memory_factory())
    yield world
    world.store.close()


def test_the_view_of_a_job_that_ended_on_a_result_carries_that_result(world: World) -> None:
    job = world.submit(payload={"argv": ["true"]})
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    error = {"code": "exit_status", "message": "true exited with status 3"}
    run.result(job.id, attempt, "failed", error=error, output={"exit_code": 3})
    view = job_view(world.job(job.id))
    assert view["terminal"] is not None
    assert view["terminal"]["result"] == {"exit_code": 3}
    assert "payload" not in view


def test_a_job_the_platform_ended_has_no_result(world: World) -> None:
    job = world.submit()
    world.service.cancel_job(world.owner, job.id)
    view = job_view(world.job(job.id))
    assert view["terminal"] is not None
    assert view["terminal"]["result"] is None


# -- over HTTP and the CLI -------------------------------------------------------------------------


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def test_a_job_read_carries_the_result_but_not_the_payload_unless_asked(cast: Cast) -> None:
    """A plain read shows no payload (`?include=payload` asks for it, redacted)."""
    world = cast.world
    secret = {"password_ref": "vault:kv/db", "path": "/srv/host-data"}
    job = world.submit(cast.server_id, cast.owner[1], payload=secret)
    run = cast.run.start()
    attempt = run.run_to_running(job["id"])
    assert run.result(job["id"], attempt, "succeeded", output={"rows": 3}).status_code == 200
    path = f"/api/v1/jobs/{job['id']}"
    read = world.api("GET", path, token=cast.owner[1])
    assert read.json()["terminal"]["result"] == {"rows": 3}
    assert "vault:kv/db" not in read.text
    assert "/srv/host-data" not in read.text
    asked = world.api("GET", path, token=cast.owner[1], params={"include": "payload"})
    assert asked.json()["payload"] == {"password_ref": "[redacted]", "path": "/srv/host-data"}


def test_the_console_job_page_shows_the_result_as_text_and_no_payload_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as con:
        job_id = con.submit(payload={"api_token": "vault:kv/never-shown"})
        run = con.run.start()
        run.run_to_running(job_id)
        attempt = con.world.stored(job_id).attempt
        output = {"exit_code": 0, "said": "<img src=x onerror=alert(2)>"}
        ended = run.result(job_id, attempt, "succeeded", output=output)
        assert ended.status_code == 200, ended.text
        page = con.client("olive").get(f"/jobs/{job_id}")
        assert page.status_code == 200
        assert "vault:kv/never-shown" not in page.text
        assert 'data-testid="result"' in page.text
        assert "&lt;img src=x onerror=alert(2)&gt;" in page.text
        assert "<img src=x" not in page.text


def test_job_show_prints_the_result_on_a_line_of_its_own() -> None:
    view = {
        "id": "job_1",
        "server_id": "srv_1",
        "kind": "command",
        "state": "failed",
        "attempt": 1,
        "max_attempts": 1,
        "created_at": "2026-12-03T11:00:00Z",
        "progress": None,
        "terminal": {"outcome": "failed", "error": None, "result": {"exit_code": 3}},
    }
    fields = verbs.job_fields(Job.of(view))
    assert fields["result"] == '{"exit_code":3}'
    assert "result" in verbs.JOB_FIELDS


@pytest.mark.parametrize(
    ("progress", "ended", "shown"),
    [
        (
            {"percent": 86.43636363636364, "message": "3.0 s left"},
            True,
            "86% 3.0 s left (last report before it ended)",
        ),
        ({"percent": 40.4, "message": "copying"}, False, "40% copying"),
        ({"percent": None, "message": "working"}, False, "working"),
        ({"percent": None, "message": None}, True, "(last report before it ended)"),
    ],
)
def test_progress_is_shown_rounded_never_as_none_and_marked_once_the_job_ended(
    progress: dict[str, Any], ended: bool, shown: str
) -> None:
    assert verbs.progress_text(progress, ended=ended) == shown
