"""Retention over HTTP: `DELETE /api/v1/jobs/{id}` deletes a finished job now, with its logs and
artifacts; the sweeper prunes finished jobs past `--retain-finished` and `/metrics` counts them
(`moonrun_jobs_pruned_total`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from fastapi.testclient import TestClient

from moonrun.http.platform import HttpSettings
from moonrun.logs.file import FileLogStore
from moonrun.wiring.app import create_app
from tests.support.harness import SETTINGS
from tests.support.http_harness import Cast, http_world
from tests.support.launcher import wait_for
from tests.support.stores import memory_factory

DAY_S = 24 * 3600


def finished_with_data(cast: Cast) -> str:
    """A job of web-1 that ran, wrote a log line and an artifact, and succeeded."""
    job = cast.world.submit(cast.server_id, cast.owner[1])
    run = cast.run if cast.run.session_id else cast.run.start()
    attempt = run.run_to_running(job["id"])
    assert run.send_logs(job["id"], attempt, 0, "hello").status_code == 202
    assert run.put_chunk(job["id"], attempt, "out.txt", 0, b"data", True).status_code == 202
    assert run.result(job["id"], attempt).status_code == 200
    return str(job["id"])


def test_delete_answers_the_finished_job_and_deletes_its_logs_and_artifacts(
    tmp_path: Path,
) -> None:
    logs = FileLogStore(tmp_path / "logs")
    with http_world(memory_factory(), tmp_path, logs=logs) as cast:
        job_id = finished_with_data(cast)
        world, token = cast.world, cast.owner[1]
        had = (tmp_path / "logs" / job_id).is_dir(), (tmp_path / "artifacts" / job_id).is_dir()

        deleted = world.api("DELETE", f"/api/v1/jobs/{job_id}", token=token)
        read = world.api("GET", f"/api/v1/jobs/{job_id}", token=token)
        again = world.api("DELETE", f"/api/v1/jobs/{job_id}", token=token)

    assert had == (True, True)
    assert (deleted.status_code, deleted.json()["id"], deleted.json()["state"]) == (
        200,
        job_id,
        "succeeded",
    )
    assert (read.status_code, again.status_code) == (404, 404)
    assert not (tmp_path / "logs" / job_id).exists()
    assert not (tmp_path / "artifacts" / job_id).exists()
    assert logs.attempts(job_id) == []


def test_delete_of_a_job_that_has_not_ended_is_409_and_keeps_it(tmp_path: Path) -> None:
    with http_world(memory_factory(), tmp_path) as cast:
        job = cast.world.submit(cast.server_id, cast.owner[1])
        refused = cast.world.api("DELETE", f"/api/v1/jobs/{job['id']}", token=cast.owner[1])
        kept = cast.world.stored(job["id"])

    assert refused.status_code == 409
    assert refused.json()["error"] == {
        "code": "job_not_finished",
        "message": "That job has not ended yet; only a finished job can be deleted.",
    }
    assert kept.state.value == "queued"


def test_delete_of_another_owners_job_is_404_as_for_no_job_and_keeps_it(tmp_path: Path) -> None:
    with http_world(memory_factory(), tmp_path) as cast:
        job_id = finished_with_data(cast)
        refused = cast.world.api("DELETE", f"/api/v1/jobs/{job_id}", token=cast.stranger[1])
        missing = cast.world.api("DELETE", "/api/v1/jobs/job_nosuchjob000", token=cast.stranger[1])
        kept = cast.world.stored(job_id)

    assert refused.status_code == 404
    assert refused.json() == missing.json()
    assert kept.state.value == "succeeded"
    assert (tmp_path / "artifacts" / job_id).is_dir()


def test_the_sweeper_prunes_old_finished_jobs_and_metrics_count_them(tmp_path: Path) -> None:
    settings = replace(SETTINGS, retain_finished_s=DAY_S, prune_batch=2)
    with http_world(memory_factory(), tmp_path, settings=settings) as cast:
        world = cast.world
        finished = [finished_with_data(cast) for _ in range(3)]
        world.clock.advance(1000)
        young = finished_with_data(cast)  # ends a second after the others: kept
        waiting = world.submit(cast.server_id, cast.owner[1])
        world.clock.advance(DAY_S * 1000 - 500)
        platform = replace(world.platform, http=HttpSettings(sweep_interval_s=0.01))
        with TestClient(create_app(platform, sweep=True)) as client:
            counted = wait_for(
                lambda: "moonrun_jobs_pruned_total 3.0" in client.get("/metrics").text,
                "three jobs counted pruned",
                timeout_s=10,
            )
        gone = world.store.get_jobs(finished)
        kept = sorted(world.store.get_jobs([young, waiting["id"]]))

    assert (counted, gone) == (True, {})
    assert kept == sorted([young, waiting["id"]])
    assert not any((tmp_path / "artifacts" / job_id).exists() for job_id in finished)
