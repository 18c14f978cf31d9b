"""What the file-backed log and artifact stores keep on disk: artifact chunks read back byte
for byte, and an attempt the log store forgets (past `max_attempts`) leaves no file behind
to come back after a restart."""

from __future__ import annotations

from pathlib import Path

from moonrun.artifacts.file import FileArtifactStore
from moonrun.logs.file import FileLogStore
from moonrun.logs.protocol import LogLine

TS = "2026-11-30T00:00:00.000Z"


def test_artifact_chunks_read_back_byte_for_byte(tmp_path: Path) -> None:
    store = FileArtifactStore(tmp_path)
    store.put_chunk("job_1", 2, "out.bin", 0, b"\x00first", False)
    store.put_chunk("job_1", 2, "out.bin", 1, b"second\xff", True)
    store.put_chunk("job_1", 3, "out.bin", 0, b"other attempt", True)
    assert [store.read_chunk("job_1", 2, "out.bin", i) for i in (0, 1)] == [
        b"\x00first",
        b"second\xff",
    ]
    assert store.read_chunk("job_1", 3, "out.bin", 0) == b"other attempt"


def test_an_attempt_the_log_store_forgets_leaves_no_file_to_come_back(tmp_path: Path) -> None:
    store = FileLogStore(tmp_path, max_attempts=2)
    for job_id in ("job_a", "job_b", "job_c"):
        store.append(job_id, 1, 1, [LogLine(1, TS, "stdout", f"{job_id} says hi")])

    again = FileLogStore(tmp_path, max_attempts=10)

    assert sorted(p.parent.name for p in tmp_path.glob("*/*.jsonl")) == ["job_b", "job_c"]
    assert [again.attempts(job) for job in ("job_a", "job_b", "job_c")] == [[], [1], [1]]
    assert [line.text for line in again.read("job_b", 1, -1).lines] == ["job_b says hi"]
