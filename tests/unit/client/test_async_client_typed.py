"""A user's asyncio script on `AsyncClient` passes `mypy --strict` (issue 28, point 11): its
methods are typed coroutines and async iterators over the same records as `Client`'s."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

USER_SCRIPT = """
import asyncio
import os

from moonrun.client import AsyncClient, Job, JobState, LogLine
from moonrun.errors import NotFound


async def outcome(client: AsyncClient, server_id: str) -> tuple[bool, list[str]]:
    job: Job = await client.submit(server_id, "command", {"argv": ["echo", "hi"]})
    ended: Job = await client.wait(job.id, timeout_s=60, logs=True)
    lines: list[LogLine] = [line async for line in client.logs(job.id, follow=True)]
    return ended.state is JobState.SUCCEEDED, [line.text for line in lines]


async def main() -> None:
    async with AsyncClient.from_env(os.environ) as client:
        both = await asyncio.gather(outcome(client, "srv_a"), outcome(client, "srv_b"))
        try:
            await client.cancel("job_x")
        except NotFound as error:
            print(error.code)
        async for job in client.jobs(state="queued"):
            print(job.id, job.state)
        print(both)


asyncio.run(main())
"""


def test_a_users_asyncio_script_passes_mypy_strict(tmp_path: Path) -> None:
    script = tmp_path / "user_async_script.py"
    script.write_text(USER_SCRIPT)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # away from this repository's own mypy settings
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
