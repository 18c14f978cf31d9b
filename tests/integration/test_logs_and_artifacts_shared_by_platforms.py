"""Several platform processes share one directory of logs and artifacts (docs/operations.md,
"Several platforms"): what a Run sent through one platform is read through any other, a batch
or chunk sent again through another is stored once, and the bounds hold over what all of them
stored. Two store objects over one directory stand for two platform processes; the races run
in real processes, each with its own store object, writing the same attempt at once.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from moonrun.artifacts.file import FileArtifactStore
from moonrun.errors import ArtifactTooLarge
from moonrun.logs import file as log_files
from moonrun.logs.file import FileLogStore
from moonrun.logs.protocol import LogLine, LogPage

TS = "2026-12-03T00:00:00.000Z"


def lines(seq: int, *texts: str) -> list[LogLine]:
    return [LogLine(seq, TS, "stdout", text) for text in texts]


def texts(page: LogPage) -> list[str]:
    return [line.text for line in page.lines]


def test_lines_sent_through_one_platform_are_read_through_another(tmp_path: Path) -> None:
    """B has read the attempt (empty) before A stores its batches: B's next read has them, and
    says the attempt's logs are complete once A stored the final batch."""
    a, b = FileLogStore(tmp_path, shared=True), FileLogStore(tmp_path, shared=True)
    assert (texts(b.read("job", 1, -1)), b.complete("job", 1), b.attempts("job")) == ([], False, [])

    a.append("job", 1, 0, lines(0, "zero"))
    a.append("job", 1, 1, lines(1, "one"), final=True)

    assert texts(b.read("job", 1, -1)) == ["zero", "one"]
    assert texts(b.tail("job", 1, 1)) == ["one"]
    assert (b.complete("job", 1), b.attempts("job")) == (True, [1])


def test_a_batch_sent_again_through_another_platform_is_stored_once(tmp_path: Path) -> None:
    """Run's answer from A was lost and it sends the batch again, through B: stored once, and
    B's next batch follows A's in both views."""
    a, b = FileLogStore(tmp_path, shared=True), FileLogStore(tmp_path, shared=True)
    b.read("job", 1, -1)
    assert a.append("job", 1, 0, lines(0, "zero")) == 0
    assert b.append("job", 1, 0, lines(0, "zero")) == 0
    assert b.append("job", 1, 1, lines(1, "one")) == 1
    assert a.append("job", 2, 0, lines(0, "retried")) == 0

    assert texts(a.read("job", 1, -1)) == texts(b.read("job", 1, -1)) == ["zero", "one"]
    assert a.attempts("job") == b.attempts("job") == [1, 2]
    assert texts(FileLogStore(tmp_path, shared=True).read("job", 1, -1)) == ["zero", "one"]


def test_an_attempts_bound_counts_the_lines_every_platform_stored(tmp_path: Path) -> None:
    """Three lines an attempt: two through A and two through B keep the newest three, with one
    dropped, however the reader."""
    a, b = (
        FileLogStore(tmp_path, shared=True, attempt_lines=3),
        FileLogStore(tmp_path, shared=True, attempt_lines=3),
    )
    b.read("job", 1, -1)
    a.append("job", 1, 0, lines(0, "a1", "a2"))
    b.append("job", 1, 1, lines(1, "b1", "b2"))

    for store in (a, b, FileLogStore(tmp_path, shared=True, attempt_lines=3)):
        page = store.read("job", 1, -1)
        assert (texts(page), page.dropped_lines) == (["a2", "b1", "b2"], 1)


def test_a_file_another_platform_rewrote_is_read_again_from_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rewrites the attempt's file to its kept lines (a new file at the path) while B holds
    the old one in memory: both then read the same lines, and B's next batch lands in the new
    file."""
    monkeypatch.setattr(log_files, "COMPACT_SLACK", 0)
    a, b = (
        FileLogStore(tmp_path, shared=True, attempt_lines=4),
        FileLogStore(tmp_path, shared=True, attempt_lines=4),
    )
    a.append("job", 1, 0, lines(0, "first"))
    assert texts(b.read("job", 1, -1)) == ["first"]
    for seq in range(1, 12):
        a.append("job", 1, seq, lines(seq, f"a{seq}"))
    b.append("job", 1, 12, lines(12, "from b"))

    expected = ["a9", "a10", "a11", "from b"]
    for store in (a, b, FileLogStore(tmp_path, shared=True, attempt_lines=4)):
        page = store.read("job", 1, -1)
        assert (texts(page), page.dropped_lines) == (expected, 9)


def test_the_store_wide_bound_counts_the_attempts_another_platform_wrote(tmp_path: Path) -> None:
    """Room for three lines in all: B, which listed the directory before A wrote an attempt,
    lists it again before its next batch (every `rescan_s`, here at once), finds four lines,
    and drops the oldest of the least recently written attempt, A's, for every reader."""
    tight = 3 * (100 + 4)
    a = FileLogStore(tmp_path, shared=True, total_bytes=tight, rescan_s=0)
    b = FileLogStore(tmp_path, shared=True, total_bytes=tight, rescan_s=0)
    b.read("new", 1, -1)
    a.append("old", 1, 1, lines(1, "o1..", "o2.."))
    b.append("new", 1, 1, lines(1, "n1..", "n2.."))

    for store in (a, b, FileLogStore(tmp_path, shared=True)):
        old, new = store.read("old", 1, -1), store.read("new", 1, -1)
        assert (texts(old), old.dropped_lines, texts(new)) == (["o2.."], 1, ["n1..", "n2.."])


def test_a_job_one_platform_deleted_is_gone_through_another(tmp_path: Path) -> None:
    a, b = FileLogStore(tmp_path, shared=True), FileLogStore(tmp_path, shared=True)
    a.append("job", 1, 0, lines(0, "zero"))
    assert texts(b.read("job", 1, -1)) == ["zero"]
    a.delete_job("job", 1)
    assert (texts(b.read("job", 1, -1)), b.attempts("job")) == ([], [])


def test_a_shared_directory_that_is_away_leaves_reads_answering_what_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A network file system that does not answer (EIO) fails no read: B answers the lines it
    holds."""
    a, b = FileLogStore(tmp_path, shared=True), FileLogStore(tmp_path, shared=True)
    a.append("job", 1, 0, lines(0, "zero"))
    assert texts(b.read("job", 1, -1)) == ["zero"]
    real_open = os.open

    def away(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).startswith(str(tmp_path)):
            raise OSError(errno.EIO, "Input/output error")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", away)
    assert (texts(b.read("job", 1, -1)), b.complete("job", 1)) == (["zero"], False)


def _append_from_a_process(root: str, first: int, count: int, start: Any) -> None:
    log_files.COMPACT_SLACK = 0  # every few batches a rewrite, racing the other process's
    store = FileLogStore(Path(root), shared=True, attempt_lines=10_000)
    start.wait()
    for seq in range(first, first + count):
        store.append("job", 1, seq, lines(seq, f"line {seq}"))


def test_two_processes_appending_to_one_attempt_at_once_lose_no_batch(tmp_path: Path) -> None:
    """Two platform processes store one attempt's batches at once (a Run's batches spread by a
    load balancer), each rewriting the file as it grows: every batch is stored once, in seq
    order, as a fresh store reads the directory."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    children = [
        context.Process(target=_append_from_a_process, args=(str(tmp_path), first, 150, start))
        for first in (0, 150)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=120)
    assert [child.exitcode for child in children] == [0, 0]

    page = FileLogStore(tmp_path, shared=True).read("job", 1, -1, limit=1000)
    assert texts(page) == [f"line {seq}" for seq in range(300)]


def test_an_attempts_artifact_bound_holds_over_every_platforms_chunks(tmp_path: Path) -> None:
    """100 bytes an attempt: B counted the attempt's 10 bytes, then A stored 80 more; B's next
    chunk of 20 is past the bound, and refused."""
    a = FileArtifactStore(tmp_path, attempt_bytes=100)
    b = FileArtifactStore(tmp_path, attempt_bytes=100)
    b.put_chunk("job", 1, "x", 0, b"x" * 10, True)
    a.put_chunk("job", 1, "y", 0, b"y" * 80, True)

    with pytest.raises(ArtifactTooLarge):
        b.put_chunk("job", 1, "z", 0, b"z" * 20, True)
    b.put_chunk("job", 1, "z", 0, b"z" * 10, True)
    assert [(info.name, info.size, info.complete) for info in a.artifacts("job")] == [
        ("x", 10, True),
        ("y", 80, True),
        ("z", 10, True),
    ]


def _chunks_from_a_process(root: str, name: str, start: Any) -> None:
    store = FileArtifactStore(Path(root), attempt_bytes=250)
    start.wait()
    for index in range(20):
        try:
            store.put_chunk("job", 1, name, index, bytes([index]) * 10, index == 19)
        except ArtifactTooLarge:
            continue


def test_two_processes_storing_one_attempts_chunks_at_once_keep_its_bound(
    tmp_path: Path,
) -> None:
    """Two processes store 20 chunks of 10 bytes each into one attempt bounded at 250 bytes:
    25 chunks are stored, never more, whatever the interleaving."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    children = [
        context.Process(target=_chunks_from_a_process, args=(str(tmp_path), name, start))
        for name in ("left", "right")
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=120)
    assert [child.exitcode for child in children] == [0, 0]

    stored = FileArtifactStore(tmp_path).artifacts("job")
    assert sum(info.size for info in stored) == 250
