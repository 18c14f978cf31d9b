"""`moonrun store backup`: a file store copied while it is written, with its logs, artifacts and
secret (docs/operations.md, "Backups")."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from typer.testing import CliRunner

from moonrun.artifacts.file import FileArtifactStore
from moonrun.cli import app
from moonrun.logs.file import FileLogStore
from moonrun.logs.protocol import LogLine
from moonrun.store.file import FileStore
from moonrun.wiring.backup import backup
from moonrun.wiring.settings import PlatformConfig
from tests.support.harness import World
from tests.support.stores import file_factory

TS = "2026-12-03T11:00:00.000000Z"


def _config(data: Path) -> PlatformConfig:
    return PlatformConfig(store_url=f"file:{data / 'platform.db'}")


def test_a_backup_taken_while_jobs_are_created_holds_every_job_acknowledged_before_it_began(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    world = World(file_factory(lambda: data))
    created: list[str] = []
    stop = threading.Event()

    def keep_creating() -> None:
        while not stop.is_set():
            created.append(world.service.create_job(world.owner, world.server.id, kind="noop").id)

    writer = threading.Thread(target=keep_creating)
    writer.start()
    try:
        while len(created) < 200:
            threading.Event().wait(0.01)
        acknowledged = list(created)
        report = backup(_config(data), tmp_path / "copy")
        while len(created) < len(acknowledged) + 50:  # still writing after the copy
            threading.Event().wait(0.01)
    finally:
        stop.set()
        writer.join()
        world.store.close()

    copy = FileStore(report.target / "platform.db")
    try:
        held = {job_id for job_id in acknowledged if copy.get_job(job_id) is not None}
    finally:
        copy.close()
    assert held == set(acknowledged)
    assert os.stat(report.target / "platform.db").st_mode & 0o777 == 0o600
    checked = CliRunner().invoke(
        app, ["store", "check", "--store", f"file:{report.target / 'platform.db'}"]
    )
    assert checked.exit_code == 0, checked.output
    assert "is ready" in checked.output


def test_a_backup_copies_logs_artifacts_and_the_secret_and_leaves_unfinished_writes_behind(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    FileStore(data / "platform.db").close()
    logs = FileLogStore(data / "logs")
    lines = [LogLine(0, TS, "stdout", "hello"), LogLine(0, TS, "stderr", "x")]
    logs.append("job-1", 1, 1, lines)
    artifacts = FileArtifactStore(data / "artifacts")
    artifacts.put_chunk("job-1", 1, "report.txt", 0, b"chunk-0", final=True)
    (data / "platform.secret").write_text("ab" * 32)
    (data / "logs" / "job-1" / "2.tmp").write_text("a rewrite that never finished")
    (data / "artifacts" / "job-1" / "1" / "report.txt" / ".000001.tmp").write_bytes(b"half")
    with open(data / "logs" / "job-1" / "1.jsonl", "ab") as cut:
        cut.write(b'{"seq": 2, "lines": [[3.0, "stdout", "cut sh')  # a record mid-append

    report = backup(_config(data), tmp_path / "copy")

    assert (report.log_files, report.artifact_files, report.secret) == (1, 2, True)
    copy = report.target
    assert not (copy / "logs" / "job-1" / "2.tmp").exists()
    assert not (copy / "artifacts" / "job-1" / "1" / "report.txt" / ".000001.tmp").exists()
    assert (copy / "platform.secret").read_text() == "ab" * 32
    page = FileLogStore(copy / "logs").read("job-1", 1, after_seq=0)
    read_back = [(line.stream, line.text) for line in page.lines]
    assert read_back == [("stdout", "hello"), ("stderr", "x")]
    restored = FileArtifactStore(copy / "artifacts")
    assert restored.read_chunk("job-1", 1, "report.txt", 0) == b"chunk-0"
    assert [info.complete for info in restored.artifacts("job-1")] == [True]
    for path in copy.rglob("*"):
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), path


def test_store_backup_refuses_a_store_that_is_not_a_file_and_a_folder_that_holds_files(
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    for url in ("memory://", "mysql://root@127.0.0.1:3306/moonrun"):
        result = runner.invoke(app, ["store", "backup", str(tmp_path / "copy"), "--store", url])
        assert result.exit_code == 2, result.output
        assert "mariadb-dump --single-transaction" in result.output
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "something").write_text("mine")
    store = f"file:{tmp_path / 'data' / 'platform.db'}"
    result = runner.invoke(app, ["store", "backup", str(busy), "--store", store])
    assert result.exit_code == 2, result.output
    assert "not an empty folder" in result.output
    assert (busy / "something").read_text() == "mine"


def test_store_backup_prints_its_report_as_json(tmp_path: Path) -> None:
    data = tmp_path / "data"
    FileStore(data / "platform.db").close()
    store = f"file:{data / 'platform.db'}"
    result = CliRunner().invoke(
        app, ["store", "backup", str(tmp_path / "copy"), "--store", store, "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["target"] == str(tmp_path / "copy")
    assert report["database_bytes"] > 0
    assert (report["log_files"], report["artifact_files"], report["secret"]) == (0, 0, False)
