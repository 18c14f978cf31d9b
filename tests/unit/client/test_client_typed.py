"""The Python client as a typed library: `py.typed` ships, a user's script passes
`mypy --strict`, states are a str enum, and a client comes from a profile or the environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import moonrun
from moonrun.client import Client, Job, JobState, profiles
from moonrun.errors import Unauthenticated

USER_SCRIPT = """
import os

from moonrun.client import Client, Job, JobState


def succeeded(client: Client, job_id: str) -> bool:
    job: Job = client.wait(job_id, timeout_s=60)
    exit_code: object = job.result["exit_code"] if isinstance(job.result, dict) else None
    return job.state is JobState.SUCCEEDED and exit_code == 0


with Client.from_env(os.environ) as client:
    print(succeeded(client, "job_x"))
"""


def test_the_package_ships_a_py_typed_marker() -> None:
    assert (Path(moonrun.__file__).parent / "py.typed").is_file()


def test_a_users_script_passes_mypy_strict(tmp_path: Path) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(USER_SCRIPT)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # away from this repository's own mypy settings
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_job_states_are_a_str_enum_equal_to_their_names() -> None:
    job = Job.of(
        {
            "id": "job_1",
            "server_id": "srv_1",
            "kind": "noop",
            "state": "retrying",
            "attempt": 1,
            "max_attempts": 3,
            "created_at": "2026-12-03T12:00:00Z",
        }
    )
    assert job.state is JobState.RETRYING
    assert job.state == "retrying"
    assert [state.value for state in JobState] == [
        "queued",
        "accepted",
        "running",
        "retrying",
        "succeeded",
        "failed",
        "cancelled",
    ]


def test_a_client_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {"MOONRUN_PLATFORM": "http://127.0.0.1:8470", "MOONRUN_TOKEN": "mru_x"}
    with Client.from_env(environ, timeout_s=5) as client:
        assert (client.platform, client.timeout_s) == ("http://127.0.0.1:8470", 5)
    with pytest.raises(Unauthenticated, match="MOONRUN_PLATFORM and MOONRUN_TOKEN"):
        Client.from_env({"MOONRUN_PLATFORM": "http://127.0.0.1:8470"})


def test_a_client_comes_from_a_saved_profile(tmp_path: Path) -> None:
    environ = {"XDG_CONFIG_HOME": str(tmp_path)}
    path = profiles.config_path(profiles.config_home(environ))
    profiles.save(path, {"ci": profiles.Profile("https://moonrun.example", "mru_ci")})
    with Client.from_profile("ci", environ=environ) as client:
        assert client.platform == "https://moonrun.example"
        assert "mru_ci" not in repr(client)
    with pytest.raises(Unauthenticated, match="no profile 'default'"):
        Client.from_profile(environ=environ)
