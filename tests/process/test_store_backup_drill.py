"""The restore drill of docs/operations.md ("Backup and restore"), with real processes: back up
a serving platform, serve the copy, and find every job and every log line that was
acknowledged before the backup began."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support.e2e import Platform, cluster
from tests.support.launcher import Timings, moonrun, wait_for

LATER = (datetime.now(UTC) + timedelta(days=300)).strftime("%Y-%m-%dT%H:%M:%SZ")
"""A job queued until then is still queued in the copy."""

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes


def test_a_backup_of_a_serving_platform_serves_every_job_and_log_line_it_held(
    tmp_path: Path,
) -> None:
    (tmp_path / "live").mkdir()
    with cluster(tmp_path / "live") as cl:
        run = cl.add_run("host-1")
        server = cl.create_server("server-1", run.endpoint_id)
        script = "for i in 1 2 3; do echo line-$i; done"
        with cl.explained():
            jobs = [cl.submit(server, "command", {"argv": ["sh", "-c", script]}) for _ in range(3)]
            done = [cl.wait_state(job["id"], "succeeded") for job in jobs]
            for job in jobs:
                wait_for(lambda job=job: len(cl.logs(job["id"])) == 3, "a job's 3 log lines")
            logs = {job["id"]: [line["text"] for line in cl.logs(job["id"])] for job in jobs}
            queued = cl.submit(server, "noop", not_before=LATER)
        live = cl.platform
        backed_up = subprocess.run(
            moonrun(
                "store",
                "backup",
                str(tmp_path / "copy"),
                "--store",
                live.store_url,
                "--secret-file",
                str(live.secret_file),
                "--data-dir",
                str(live.workdir / "platform-data"),
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert backed_up.returncode == 0, backed_up.stderr
        assert live.running  # backed up while it served

    copy = tmp_path / "copy"
    checked = subprocess.run(
        moonrun("store", "check", "--store", f"file:{copy / 'platform.db'}"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    restored = Platform(
        copy, f"file:{copy / 'platform.db'}", Timings(), flags=("--data-dir", str(copy))
    )
    restored.start()
    try:
        assert restored.client is not None
        for job in done:
            view = restored.client.get(f"/api/v1/jobs/{job['id']}").json()
            assert (view["state"], view["attempt"]) == ("succeeded", job["attempt"])
            page = restored.client.get(f"/api/v1/jobs/{job['id']}/logs?after_seq=-1").json()
            lines = page["lines"]
            assert [line["text"] for line in lines] == logs[job["id"]]
        assert restored.client.get(f"/api/v1/jobs/{queued['id']}").json()["state"] == "queued"
    finally:
        restored.stop()
