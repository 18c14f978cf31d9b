"""One owner's artifacts never slow, break or reveal another's: Run streams an artifact a chunk
at a time under a cap, opens it before the attempt's working directory goes (no symlinks, the
command user's regular files only), and the platform caps an attempt's artifact bytes."""

from __future__ import annotations

import asyncio
import io
import os
import pwd
import shutil
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest
import typer

from moonrun import errors
from moonrun.artifacts.file import FileArtifactStore
from moonrun.artifacts.protocol import ArtifactLimits
from moonrun.backoff import Backoff
from moonrun.cli import app
from moonrun.run.confinement import CommandUser, Confinement
from moonrun.run.handlers import HandlerResult, JobContext
from moonrun.run.handlers.command import CommandHandler
from moonrun.run.transfers import CHUNK_BYTES, ArtifactUploader, Attempt
from moonrun.wiring.settings import PlatformConfig, build_platform
from tests.support import needs
from tests.support.http_harness import Cast, http_world
from tests.support.run_kit import FakeRunClient
from tests.support.stores import memory_factory

LEASE = "mrl_" + "l" * 43
ATTEMPT = Attempt("job_1", 1, LEASE)
HANG_GUARD_S = 10.0
GIB = 1024**3


# -- Run: streaming and the Run-side cap ---------------------------------------------------------


@dataclass
class JobLog:
    """The job logs the uploader wrote to."""

    lines: list[tuple[Attempt, str, str]] = field(default_factory=list)

    def __call__(self, attempt: Attempt, stream: str, text: str) -> None:
        self.lines.append((attempt, stream, text))


class CountingFile(io.FileIO):
    """A file that remembers how many bytes each read asked for."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, "rb")
        self.reads: list[int] = []

    def read(self, size: int | None = -1, /) -> bytes:
        self.reads.append(-1 if size is None else size)
        return super().read(size)


async def run_uploader(uploader: ArtifactUploader, done: Callable[[], bool]) -> None:
    """Run the uploader until `done()`, then stop it."""
    stop = asyncio.Event()
    task = asyncio.create_task(uploader.run(stop))
    deadline = time.monotonic() + HANG_GUARD_S
    while not done():
        assert time.monotonic() < deadline, "the uploader did not finish"
        assert not task.done(), "the uploader stopped on its own"
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD_S)


def sparse(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk (`truncate -s`)."""
    path.touch()
    os.truncate(path, size)
    return path


@pytest.mark.anyio
async def test_a_large_artifact_is_read_one_chunk_at_a_time(tmp_path: Path) -> None:
    """A 64 MiB artifact: 64 chunks of 1 MiB, final last, and the uploader's memory never
    holds more than a few chunks (never the whole file at once)."""
    path = sparse(tmp_path / "big.bin", 64 * CHUNK_BYTES)
    client = FakeRunClient(keep_bytes=False)
    uploader = ArtifactUploader(client)  # type: ignore[arg-type]

    tracemalloc.start()
    try:
        uploader.add(ATTEMPT, str(path), "big.bin")
        await run_uploader(uploader, lambda: uploader.uploaded + uploader.dropped > 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert (uploader.uploaded, uploader.dropped) == (1, 0)
    assert client.chunks == [("big.bin", i, CHUNK_BYTES, i == 63) for i in range(64)]
    assert peak < 8 * CHUNK_BYTES


@pytest.mark.anyio
async def test_an_open_artifact_is_read_in_reads_of_one_chunk_and_closed(tmp_path: Path) -> None:
    """An open file handed over: every read asks for at most one chunk, a chunk kept for a
    retry is sent again unchanged, and the file is closed once uploaded."""
    path = sparse(tmp_path / "out.bin", 2 * CHUNK_BYTES + 10)
    handle = CountingFile(path)
    client = FakeRunClient(keep_bytes=False, chunk_errors={1: errors.PlatformUnreachable()})
    uploader = ArtifactUploader(client, backoff=Backoff(initial_s=0.01, max_s=0.01))  # type: ignore[arg-type]

    uploader.add(ATTEMPT, cast(BinaryIO, handle), "out.bin")
    await run_uploader(uploader, lambda: uploader.uploaded > 0)

    assert [size for size in handle.reads if size > CHUNK_BYTES or size < 0] == []
    assert client.chunks == [
        ("out.bin", 0, CHUNK_BYTES, False),
        ("out.bin", 1, CHUNK_BYTES, False),
        ("out.bin", 1, CHUNK_BYTES, False),
        ("out.bin", 2, 10, True),
    ]
    assert handle.closed is True


@pytest.mark.anyio
async def test_an_artifact_over_runs_cap_is_skipped_with_a_line_in_the_jobs_logs(
    tmp_path: Path,
) -> None:
    """A 3 GiB (sparse) artifact under the default 1 GiB cap: nothing read or sent, dropped and
    counted, and the job's stderr says why; the next artifact still goes."""
    huge = sparse(tmp_path / "result.txt", 3 * GIB)
    small = tmp_path / "small.txt"
    small.write_bytes(b"fine")
    client, job_log = FakeRunClient(keep_bytes=False), JobLog()
    uploader = ArtifactUploader(client, job_log=job_log)  # type: ignore[arg-type]

    uploader.add(ATTEMPT, str(huge), "result.txt")
    uploader.add(ATTEMPT, str(small), "small.txt")
    await run_uploader(uploader, lambda: uploader.uploaded + uploader.dropped == 2)

    assert (uploader.uploaded, uploader.dropped) == (1, 1)
    assert client.chunks == [("small.txt", 0, 4, True)]
    assert job_log.lines == [
        (
            ATTEMPT,
            "stderr",
            "artifact result.txt not uploaded: 3221225472 bytes is over the 1073741824-byte cap",
        )
    ]


@pytest.mark.anyio
async def test_runs_cap_is_a_setting(tmp_path: Path) -> None:
    """max_bytes=3 MiB: a 3 MiB artifact goes, one byte more does not."""
    at_cap = sparse(tmp_path / "at-cap", 3 * CHUNK_BYTES)
    over = sparse(tmp_path / "over", 3 * CHUNK_BYTES + 1)
    client, job_log = FakeRunClient(keep_bytes=False), JobLog()
    uploader = ArtifactUploader(client, max_bytes=3 * CHUNK_BYTES, job_log=job_log)  # type: ignore[arg-type]

    uploader.add(ATTEMPT, str(at_cap), "at-cap")
    uploader.add(ATTEMPT, str(over), "over")
    await run_uploader(uploader, lambda: uploader.uploaded + uploader.dropped == 2)

    assert (uploader.uploaded, uploader.dropped) == (1, 1)
    assert [name for name, *_ in client.chunks] == ["at-cap"] * 3
    assert [text for *_, text in job_log.lines] == [
        f"artifact over not uploaded: {3 * CHUNK_BYTES + 1} bytes is over the "
        f"{3 * CHUNK_BYTES}-byte cap"
    ]


@pytest.mark.anyio
async def test_an_artifact_the_platform_finds_too_large_is_dropped_not_retried(
    tmp_path: Path,
) -> None:
    """413 artifact_too_large on chunk 1: no retry, no further chunk, dropped and counted, a
    line in the job's logs; the next artifact still goes."""
    path = sparse(tmp_path / "big.bin", 3 * CHUNK_BYTES)
    small = tmp_path / "small.txt"
    small.write_bytes(b"fine")
    client = FakeRunClient(keep_bytes=False, chunk_errors={1: errors.ArtifactTooLarge()})
    job_log = JobLog()
    uploader = ArtifactUploader(client, job_log=job_log)  # type: ignore[arg-type]

    uploader.add(ATTEMPT, str(path), "big.bin")
    uploader.add(ATTEMPT, str(small), "small.txt")
    await run_uploader(uploader, lambda: uploader.uploaded + uploader.dropped == 2)

    assert (uploader.uploaded, uploader.dropped) == (1, 1)
    assert [(name, index) for name, index, *_ in client.chunks] == [
        ("big.bin", 0),
        ("big.bin", 1),
        ("small.txt", 0),
    ]
    assert [(stream, text.split(":")[0]) for _, stream, text in job_log.lines] == [
        ("stderr", "artifact big.bin not uploaded")
    ]


def test_a_dropped_open_artifact_is_closed(tmp_path: Path) -> None:
    """A full queue drops the new upload at once, and closes the file it was handed."""
    path = tmp_path / "out"
    path.write_bytes(b"x")
    uploader = ArtifactUploader(FakeRunClient(keep_bytes=False), queue_size=1)  # type: ignore[arg-type]
    kept, dropped = path.open("rb"), path.open("rb")

    uploader.add(ATTEMPT, kept, "kept")
    uploader.add(ATTEMPT, dropped, "dropped")

    assert (uploader.dropped, kept.closed, dropped.closed) == (1, False, True)
    kept.close()


# -- Run: the command handler opens its artifacts itself -------------------------------------------


@dataclass
class Sink:
    """What a handler handed back: log lines and uploads (each upload's bytes read at once)."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    uploads: list[tuple[str, bytes]] = field(default_factory=list)

    def log_line(self, stream: str, text: str) -> None:
        self.lines.append((stream, text))

    def upload(self, source: Any, name: str) -> None:
        with source:
            self.uploads.append((name, source.read()))

    async def remember_process(self, pid: int) -> None:
        pass


def context(payload: Any, sink: Sink) -> JobContext:
    return JobContext(
        job_id="job_1",
        attempt=1,
        kind="command",
        payload=payload,
        started_at_ms=0,
        now_ms=lambda: 0,
        log_line=sink.log_line,
        upload=sink.upload,
        remember_process=sink.remember_process,
    )


async def finished(handler: CommandHandler, job: JobContext) -> HandlerResult:
    return await asyncio.wait_for(handler.run(job), HANG_GUARD_S)


def as_myself() -> CommandUser:
    """--run-as naming Run's own user: the same checks as for another user, no uid change."""
    return CommandUser("me", os.geteuid(), os.getegid(), (), "/")


@pytest.mark.anyio
async def test_an_artifact_at_a_relative_path_in_the_working_directory_is_uploaded(
    tmp_path: Path,
) -> None:
    """`"path": "result.txt"` names the file in the attempt's working directory: its bytes
    arrive although that directory is gone once the attempt ended."""
    handler = CommandHandler(Confinement(as_myself(), work_root=tmp_path))
    payload = {
        "argv": ["sh", "-c", "echo done > result.txt"],
        "artifacts": [{"path": "result.txt", "name": "result.txt"}],
    }
    sink = Sink()

    result = await finished(handler, context(payload, sink))

    assert result.outcome == "succeeded"
    assert sink.uploads == [("result.txt", b"done\n")]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("make", "why"),
    [
        ("ln -s {key} stolen", "a symbolic link"),
        ("mkdir stolen", "not a regular file"),
        ("mkfifo stolen", "not a regular file"),
    ],
    ids=["symlink", "directory", "fifo"],
)
async def test_an_artifact_that_is_not_a_regular_file_is_refused(
    tmp_path: Path, make: str, why: str
) -> None:
    """A symlink to Run's identity key, a directory or a FIFO named as an artifact: nothing
    uploaded, the command still succeeds, and the job's stderr says why."""
    key = tmp_path / "identity.key"
    key.write_text("the identity key")
    work = tmp_path / "work"
    work.mkdir()
    handler = CommandHandler(Confinement(as_myself(), work_root=work))
    payload = {
        "argv": ["sh", "-c", make.format(key=key)],
        "artifacts": [{"path": "stolen", "name": "stolen.key"}],
    }
    sink = Sink()

    result = await finished(handler, context(payload, sink))

    assert result.outcome == "succeeded"
    assert sink.uploads == []
    assert sink.lines == [("stderr", f"artifact stolen.key not uploaded: {why}")]


def test_with_run_as_only_the_command_users_own_files_are_opened(tmp_path: Path) -> None:
    """--run-as: Run (which may read more) opens an artifact only if the command user owns it;
    without --run-as the command could read the file itself, so any regular file goes."""
    owned = tmp_path / "report.txt"
    owned.write_text("done")
    other = CommandUser("other", os.geteuid() + 1, os.getegid(), (), "/")

    refused = Confinement(other).open_artifact(tmp_path, "report.txt")
    opened = Confinement(as_myself()).open_artifact(tmp_path, "report.txt")
    unconfined = Confinement().open_artifact(tmp_path, str(owned))

    assert refused == "not owned by the command user"
    for handle in (opened, unconfined):
        assert not isinstance(handle, str)
        with handle:
            assert handle.read() == b"done"


@pytest.fixture
def open_work_root() -> Iterator[Path]:
    """A work root another user may traverse (pytest's own directories are private)."""
    path = Path(tempfile.mkdtemp(prefix="moonrun-art-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.anyio
async def test_run_as_nobody_uploads_its_relative_artifact_and_not_roots_files(
    open_work_root: Path,
) -> None:
    """--run-as nobody: a file nobody wrote in its working directory is uploaded; a symlink to
    a root-owned file is refused."""
    needs.root("--run-as another user needs Run to run as root")
    secret = open_work_root / "secret"
    secret.write_text("root's")
    handler = CommandHandler(Confinement(CommandUser.named("nobody"), work_root=open_work_root))
    payload = {
        "argv": ["sh", "-c", f"id -u > mine.txt; ln -s {secret} theirs.txt"],
        "artifacts": [
            {"path": "mine.txt", "name": "mine.txt"},
            {"path": "theirs.txt", "name": "theirs.txt"},
        ],
    }
    sink = Sink()

    result = await finished(handler, context(payload, sink))

    assert result.outcome == "succeeded"
    assert sink.uploads == [("mine.txt", f"{pwd.getpwnam('nobody').pw_uid}\n".encode())]
    assert sink.lines == [("stderr", "artifact theirs.txt not uploaded: a symbolic link")]


# -- platform: a cap on an attempt's artifact bytes ---------------------------------------------


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Cast]:
    store = FileArtifactStore(tmp_path / "artifacts", attempt_bytes=10)
    with http_world(memory_factory(), tmp_path, artifacts=store) as cast:
        yield cast


def running_job(cast: Cast) -> tuple[str, int]:
    job_id: str = cast.world.submit(cast.server_id, cast.owner[1], kind="noop")["id"]
    return job_id, cast.run.run_to_running(job_id)


def test_a_chunk_past_the_attempts_artifact_cap_is_refused_413(capped: Cast) -> None:
    """Cap 10 bytes per attempt, over all its artifacts: 6 + 4 bytes are stored, one byte more
    (in any artifact of the attempt) is 413 artifact_too_large, and storing a chunk again with
    the same bytes does not count twice."""
    run = capped.run.start()
    job_id, attempt = running_job(capped)

    statuses = [
        run.put_chunk(job_id, attempt, "a.txt", 0, b"x" * 6).status_code,
        run.put_chunk(job_id, attempt, "a.txt", 0, b"x" * 6).status_code,
        run.put_chunk(job_id, attempt, "a.txt", 1, b"y" * 5, final=True).status_code,
        run.put_chunk(job_id, attempt, "a.txt", 1, b"y" * 4, final=True).status_code,
    ]
    refused = run.put_chunk(job_id, attempt, "b.txt", 0, b"z", final=True)

    assert statuses == [202, 202, 413, 202]
    assert (refused.status_code, refused.json()["error"]["code"]) == (413, "artifact_too_large")
    assert set(refused.json()) == {"error"}


def test_the_attempt_cap_counts_what_is_already_on_disk(tmp_path: Path) -> None:
    """A platform restarted over stored chunks counts them: the cap is not reset by a restart,
    and another attempt has a cap of its own."""
    FileArtifactStore(tmp_path, attempt_bytes=10).put_chunk("job_1", 1, "a", 0, b"x" * 8, False)
    restarted = FileArtifactStore(tmp_path, attempt_bytes=10)

    with pytest.raises(errors.ArtifactTooLarge):
        restarted.put_chunk("job_1", 1, "b", 0, b"x" * 3, True)
    restarted.put_chunk("job_1", 1, "b", 0, b"x" * 2, True)
    restarted.put_chunk("job_1", 2, "a", 0, b"x" * 10, True)


def test_the_platforms_attempt_cap_is_a_setting(tmp_path: Path) -> None:
    """PlatformConfig.artifacts.attempt_bytes (`--artifact-attempt-bytes`) caps the store the
    platform serves."""
    config = PlatformConfig(
        store_url="memory://",
        secret_file=tmp_path / "platform.secret",
        data_dir=tmp_path,
        artifacts=ArtifactLimits(attempt_bytes=4),
    )
    platform = build_platform(config)
    try:
        platform.artifacts.put_chunk("job_1", 1, "a", 0, b"x" * 4, False)
        with pytest.raises(errors.ArtifactTooLarge):
            platform.artifacts.put_chunk("job_1", 1, "a", 1, b"x", True)
    finally:
        platform.close()
        platform.release()


@pytest.mark.parametrize(
    ("command", "option", "variable"),
    [
        (["platform", "serve"], "--artifact-attempt-bytes", "MOONRUN_ARTIFACT_ATTEMPT_BYTES"),
        (["run", "start"], "--max-artifact-bytes", "MOONRUN_MAX_ARTIFACT_BYTES"),
    ],
)
def test_the_artifact_caps_are_command_line_options(
    command: list[str], option: str, variable: str
) -> None:
    """Both caps are flags with an environment variable, like the other bounds."""
    found: Any = typer.main.get_command(app)
    for name in command:
        found = found.get_command(None, name)
    options = {param.opts[0]: param.envvar for param in found.params}

    assert options.get(option) == variable
