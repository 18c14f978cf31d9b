"""Artifacts out, end to end: a real `command` job's file, uploaded by a real Run, comes back
byte-identical through `moonrun.client` and through `moonrun job download`."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from moonrun.client import Client
from tests.support.e2e import cluster
from tests.support.launcher import ADMIN_TOKEN, command_env, moonrun, wait_for

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes

COMMAND_TIMEOUT_S = 90


def test_a_commands_artifact_downloads_byte_identical_through_the_client_and_the_cli(
    tmp_path: Path,
) -> None:
    """A job writes result.txt (bytes of every value, over Run's 1 MiB chunk size); the client
    lists it complete and downloads it to a path and to a stream, the CLI to a file."""
    script = "python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 5000)' > out.bin"
    expected = bytes(range(256)) * 5000
    with cluster(tmp_path) as cl:
        run = cl.add_run()
        server = cl.create_server("web-1", run.endpoint_id)
        artifacts = [{"path": "out.bin", "name": "result.txt"}]
        job = cl.submit(server, "command", {"argv": ["sh", "-c", script], "artifacts": artifacts})
        with Client(cl.platform.url, ADMIN_TOKEN) as client:
            assert client.wait(job["id"], 60).state == "succeeded"
            listed = wait_for(
                lambda: [a for a in client.artifacts(job["id"]) if a.complete],
                "result.txt to be complete",
            )
            to_path, to_stream = tmp_path / "via-client.txt", io.BytesIO()
            client.download(job["id"], "result.txt", to_path)
            client.download(job["id"], "result.txt", to_stream, attempt=1)
        env = {**command_env(ADMIN_TOKEN), "HOME": str(tmp_path), "MOONRUN_TOKEN": ADMIN_TOKEN}
        env["MOONRUN_PLATFORM"] = cl.platform.url
        env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
        via_cli = tmp_path / "via-cli.txt"
        downloaded = subprocess.run(
            moonrun("job", "download", job["id"], "result.txt", "-o", str(via_cli)),
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        listed_by_cli = subprocess.run(
            moonrun("job", "artifacts", job["id"], "--json"),
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    assert [(a.attempt, a.name, a.size) for a in listed] == [(1, "result.txt", len(expected))]
    assert to_path.read_bytes() == expected
    assert to_stream.getvalue() == expected
    assert downloaded.returncode == 0, downloaded.stderr
    assert via_cli.read_bytes() == expected
    assert json.loads(listed_by_cli.stdout) == [
        {"attempt": 1, "name": "result.txt", "size": len(expected), "complete": True}
    ]
