"""A page read without a limit holds at most 1,000 lines (whole batches), a tail after a seq
only newer lines, on both log stores; and the FileLogStore keeps a job whose id is not a plain
name under a safe directory name of its own, reads it back after a restart, and passes over
directories it did not make (`lost+found`, stray files) without missing any of its own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from moonrun.logs.file import FileLogStore
from moonrun.logs.memory import MemoryLogStore
from moonrun.logs.protocol import LogLine, LogStore

TS = "2026-11-30T00:00:00.000Z"

MakeStore = Callable[[], LogStore]


def lines(seq: int, *texts: str) -> list[LogLine]:
    return [LogLine(seq, TS, "stdout", text) for text in texts]


@pytest.fixture(params=["memory", "file"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> MakeStore:
    if request.param == "memory":
        return MemoryLogStore
    return lambda: FileLogStore(tmp_path / "logs")


def test_a_read_without_a_limit_answers_at_most_a_thousand_lines(make_store: MakeStore) -> None:
    store = make_store()
    store.append("job", 1, 1, lines(1, *(f"l{n}" for n in range(1000))))
    store.append("job", 1, 2, lines(2, "one more"))
    page = store.read("job", 1, -1)
    assert (len(page.lines), page.next_after_seq, page.more) == (1000, 1, True)


def test_a_tail_after_a_seq_answers_only_newer_lines(make_store: MakeStore) -> None:
    store = make_store()
    store.append("job", 1, 1, lines(1, "a1", "a2"))
    store.append("job", 1, 2, lines(2, "b1"))
    tail = store.tail("job", 1, 5, after_seq=1)
    assert ([ln.text for ln in tail.lines], tail.next_after_seq) == (["b1"], 2)


@pytest.mark.parametrize("job_id", ["job/../../escape", "~7e", "a job", "é"])
def test_a_job_id_that_is_not_a_plain_name_is_kept_under_the_root_and_read_back(
    tmp_path: Path, job_id: str
) -> None:
    root = tmp_path / "logs"
    FileLogStore(root).append(job_id, 1, 1, lines(1, "kept"))
    again = FileLogStore(root)
    assert ([ln.text for ln in again.read(job_id, 1, -1).lines], again.attempts(job_id)) == (
        ["kept"],
        [1],
    )
    assert [path.parent.parent for path in tmp_path.rglob("*.jsonl")] == [root]
    assert [path.name for path in root.iterdir()] == ["~" + job_id.encode().hex()]


def test_directories_the_store_did_not_make_are_passed_over(tmp_path: Path) -> None:
    """Whatever order the directory lists them in, every attempt of the store's own is read
    back, and a stray `1.jsonl` in `lost+found` is no job's."""
    jobs = [f"job_{n}" for n in range(12)]
    store = FileLogStore(tmp_path)
    for job_id in jobs:
        store.append(job_id, 1, 1, lines(1, job_id))
    for stray in ("lost+found", ".hidden", "-x"):
        (tmp_path / stray).mkdir()
        (tmp_path / stray / "1.jsonl").write_bytes(b'{"seq":1,"lines":[]}\n')
    (tmp_path / "notes.txt").write_text("not a job\n")

    again = FileLogStore(tmp_path, total_bytes=sum(100 + len(job_id) for job_id in jobs))

    assert [[ln.text for ln in again.read(job_id, 1, -1).lines] for job_id in jobs] == [
        [job_id] for job_id in jobs
    ]
    again.append("job_new", 1, 1, lines(1, "new.."))  # one line over: the oldest job's goes
    assert again.read("job_0", 1, -1).dropped_lines == 1
