"""Run's journal: an append-only log with a checksum per line, group commit, compaction, torn
tails, damage, and the carrying over of an older Run's `journal.json`.

Every test works on a real file in a temporary data directory; fsyncs are counted (or held,
or failed) by wrapping `os.fsync`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import threading
import zlib
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from moonrun.run.journal import (
    FILE_NAME,
    OLD_FILE_NAME,
    Assignment,
    Journal,
    JournalCorrupt,
)

T0_MS = 1_795_000_000_000
LEASE = "mrl_" + "l" * 43
HANG_GUARD_S = 10.0
"""Only a guard against a hang; every wait below is expected to end well before it."""


def assignment(job_id: str = "job_1", **changes: Any) -> Assignment:
    fields: dict[str, Any] = {
        "job_id": job_id,
        "attempt": 2,
        "lease": LEASE,
        "kind": "sleep",
        "payload": {"seconds": 5, "note": "ünïcode"},
        "server_id": "srv_1",
    }
    fields.update(changes)
    return Assignment(**fields)


def written_journal(data_dir: Path, *entries: Assignment) -> Path:
    journal = Journal(data_dir, {entry.job_id: entry for entry in entries})
    journal.rewrite()
    return journal.path


def records(path: Path) -> list[dict[str, Any]]:
    """The log's lines, checksums stripped."""
    return [json.loads(line.split(b" ", 1)[1]) for line in path.read_bytes().splitlines()]


def old_journal(data_dir: Path, *entries: Assignment) -> Path:
    """`journal.json` exactly as an older Run wrote it: all entries, one checksum."""
    items = [asdict(entry) for entry in entries]
    canonical = json.dumps(items, sort_keys=True, separators=(",", ":")).encode()
    document = {
        "format": "moonrun-journal/1",
        "entries": items,
        "sha256": hashlib.sha256(canonical).hexdigest(),
    }
    path = data_dir / OLD_FILE_NAME
    path.write_bytes(json.dumps(document, separators=(",", ":")).encode())
    return path


async def durable(future: asyncio.Future[None]) -> None:
    async with asyncio.timeout(HANG_GUARD_S):
        await future


class Fsyncs:
    """Counts `os.fsync` calls; can hold the next one until released, or fail it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.fail_next: OSError | None = None
        self.hold_next = False
        self.holding = threading.Event()
        self.release = threading.Event()
        real = os.fsync

        def fsync(descriptor: int) -> None:
            self.calls += 1
            if self.fail_next is not None:
                error, self.fail_next = self.fail_next, None
                raise error
            if self.hold_next:
                self.hold_next = False
                self.holding.set()
                self.release.wait(HANG_GUARD_S)
            real(descriptor)

        monkeypatch.setattr(os, "fsync", fsync)


# -- reading and rewriting ------------------------------------------------------------------


def test_journal_round_trips_its_assignments(tmp_path: Path) -> None:
    """What is written is what the next open reads, field for field."""
    held = {
        "job_1": assignment("job_1"),
        "job_2": assignment(
            "job_2",
            kind="command",
            payload={"argv": ["true"]},
            state="finished",
            started_at_ms=T0_MS,
            progress_seq=7,
            result={"outcome": "failed", "retryable": True, "error": {"code": "x", "message": ""}},
            process={"pgid": 4242, "started": 17},
            notes=["resumed"],
        ),
    }
    written_journal(tmp_path, *held.values())

    assert Journal.open(tmp_path).entries == held


def test_a_missing_journal_opens_empty_and_creates_nothing(tmp_path: Path) -> None:
    """No file means no assignments held; opening does not write one."""
    journal = Journal.open(tmp_path)

    assert (journal.entries, list(tmp_path.iterdir())) == ({}, [])


def test_a_rewrite_leaves_only_the_log_readable_by_run_alone(tmp_path: Path) -> None:
    """The temporary file is renamed over the log: only journal.log remains, mode 0600."""
    (tmp_path / (FILE_NAME + ".tmp")).write_bytes(b"left by a crash mid-rewrite")
    path = written_journal(tmp_path, assignment("job_1"))
    written_journal(tmp_path, assignment("job_1"), assignment("job_2"))

    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert set(Journal.open(tmp_path).entries) == {"job_1", "job_2"}


def test_an_empty_journal_round_trips(tmp_path: Path) -> None:
    """A log without entries opens empty."""
    written_journal(tmp_path)

    assert Journal.open(tmp_path).entries == {}


# -- appending and group commit ---------------------------------------------------------------


@pytest.mark.anyio
async def test_each_change_appends_one_line(tmp_path: Path) -> None:
    """After the first write (a fresh log), a put or a drop is one more line, whatever is held."""
    journal = Journal.open(tmp_path)
    first, second = assignment("job_1"), assignment("job_2")
    await durable(journal.put(first))
    await durable(journal.put(second))
    second.progress_seq = 1
    await durable(journal.put(second))
    await durable(journal.drop("job_1"))
    await journal.close()

    expected = [
        {"format": "moonrun-journal/2"},
        {"put": asdict(assignment("job_1"))},
        {"put": asdict(assignment("job_2"))},
        {"put": asdict(assignment("job_2", progress_seq=1))},
        {"drop": "job_1"},
    ]
    assert expected == records(journal.path)
    assert {"job_2": second} == Journal.open(tmp_path).entries


@pytest.mark.anyio
async def test_changes_asked_for_in_one_turn_share_one_write_and_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten puts without an await in between: one fsync, ten lines."""
    journal = Journal.open(tmp_path)
    await durable(journal.put(assignment("job_0")))
    fsyncs = Fsyncs(monkeypatch)

    futures = [journal.put(assignment(f"job_{n}", progress_seq=1)) for n in range(1, 11)]
    await durable(asyncio.gather(*futures))
    await journal.close()

    one_fsync_ten_lines_more = (1, 12)
    assert one_fsync_ten_lines_more == (fsyncs.calls, len(records(journal.path)))


@pytest.mark.anyio
async def test_changes_asked_for_during_a_write_share_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one write is on its way, later changes wait and then share a single fsync."""
    journal = Journal.open(tmp_path)
    await durable(journal.put(assignment("job_0")))
    fsyncs = Fsyncs(monkeypatch)
    fsyncs.hold_next = True

    first = journal.put(assignment("job_1"))
    async with asyncio.timeout(HANG_GUARD_S):
        await asyncio.to_thread(fsyncs.holding.wait)
    later = [journal.put(assignment("job_2")), journal.drop("job_0")]
    fsyncs.release.set()
    await durable(asyncio.gather(first, *later))
    await journal.close()

    one_for_the_first_one_for_the_rest = 2
    assert one_for_the_first_one_for_the_rest == fsyncs.calls
    assert {"job_1", "job_2"} == set(Journal.open(tmp_path).entries)


@pytest.mark.anyio
async def test_closing_writes_the_changes_nobody_waited_for(tmp_path: Path) -> None:
    """A drop that was not awaited (a result already accepted) still reaches the disk."""
    journal = Journal.open(tmp_path)
    await durable(journal.put(assignment("job_1"), assignment("job_2")))

    journal.drop("job_1")
    await journal.close()

    assert {"job_2"} == set(Journal.open(tmp_path).entries)


@pytest.mark.anyio
async def test_a_failed_write_is_followed_by_a_fresh_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append whose fsync failed may be torn: the next write rewrites, never appends."""
    journal = Journal.open(tmp_path)
    await durable(journal.put(assignment("job_1")))
    fsyncs = Fsyncs(monkeypatch)
    fsyncs.fail_next = OSError(5, "Input/output error")

    with pytest.raises(OSError, match="Input/output error"):
        await durable(journal.put(assignment("job_2")))
    with (journal.path).open("ab") as log:
        log.write(b"0000dead torn")  # what the failed append might have left behind
    await durable(journal.put(assignment("job_3")))
    await journal.close()

    fresh_log = ["format", "put", "put", "put"]
    assert fresh_log == [next(iter(r)) for r in records(journal.path)]
    assert {"job_1", "job_2", "job_3"} == set(Journal.open(tmp_path).entries)


# -- compaction ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_compaction_keeps_exactly_the_live_entries(tmp_path: Path) -> None:
    """Once the log holds many more lines than live entries, it is rewritten with just those."""
    journal = Journal.open(tmp_path, compact_min=4)
    kept = assignment("job_1")
    await durable(journal.put(kept, assignment("job_2")))
    await durable(journal.drop("job_2"))
    lengths = []
    for seq in range(1, 6):
        kept.progress_seq = seq
        await durable(journal.put(kept))
        lengths.append(len(records(journal.path)))
        if lengths[-1] == 2:
            compacted = records(journal.path)
    await journal.close()

    rewritten_once_past_the_bound = [5, 2, 3, 4, 5]
    only_the_live_entry = [
        {"format": "moonrun-journal/2"},
        {"put": asdict(assignment(progress_seq=2))},
    ]
    assert rewritten_once_past_the_bound == lengths
    assert only_the_live_entry == compacted
    assert {"job_1": kept} == Journal.open(tmp_path).entries


# -- torn tails and damage ---------------------------------------------------------------------


def appended_log(tmp_path: Path) -> Path:
    """A log of a header and three puts (job_1, job_2, job_1 again), as Run appends them."""
    journal = Journal.open(tmp_path)

    async def append() -> None:
        await durable(journal.put(assignment("job_1")))  # the first write of a process: fresh
        await durable(journal.put(assignment("job_2")))
        await durable(journal.put(assignment("job_1", progress_seq=1)))
        await journal.close()

    asyncio.run(append())
    assert len(records(journal.path)) == 4, "a header and three puts"
    return journal.path


@pytest.mark.parametrize(
    "tear",
    [
        lambda data: data[:-1],  # the newline missing
        lambda data: data[: len(data) - 20],  # in the middle of the JSON
        lambda data: data[: data.rindex(b"\n", 0, -1) + 5],  # in the middle of the checksum
        lambda data: data[: data.rindex(b"\n", 0, -1) + 1] + b"\0" * 300,  # zeros, unwritten
    ],
    ids=["newline", "json", "checksum", "zeros"],
)
def test_a_torn_last_line_is_ignored_and_left_alone(
    tmp_path: Path, tear: Callable[[bytes], bytes]
) -> None:
    """A crash in the middle of an append: the last change was never acknowledged, so it is
    not held; opening leaves the file as it is, and the next write starts a fresh log."""
    path = appended_log(tmp_path)
    torn = tear(path.read_bytes())
    path.write_bytes(torn)

    journal = Journal.open(tmp_path)
    opened, untouched = set(journal.entries), path.read_bytes()

    async def append() -> None:
        await durable(journal.put(assignment("job_3")))
        await journal.close()

    asyncio.run(append())

    assert ({"job_1", "job_2"}, torn) == (opened, untouched)
    assert {"job_1", "job_2", "job_3"} == set(Journal.open(tmp_path).entries)


def edit_middle_line(data: bytes) -> bytes:
    lines = data.split(b"\n")
    lines[1] = lines[1].replace(b'"attempt":2', b'"attempt":3')  # the checksum no longer fits
    return b"\n".join(lines)


def merge_middle_lines(data: bytes) -> bytes:
    first = data.index(b"\n")
    second = data.index(b"\n", first + 1)
    return data[:second] + data[second + 1 :]


def wrong_header(data: bytes) -> bytes:
    header = json.dumps({"format": "moonrun-journal/99"}).encode()
    return b"%08x %s\n" % (zlib.crc32(header), header) + data.split(b"\n", 1)[1]


@pytest.mark.parametrize(
    "damage",
    [
        edit_middle_line,
        merge_middle_lines,
        wrong_header,
        lambda data: b"",
        lambda data: b'["some", "other", "json"]\n',
        lambda data: b"\xff\xfe" + data,
    ],
    ids=["edited_line", "merged_lines", "wrong_format", "emptied", "not_a_journal", "not_utf8"],
)
def test_damage_before_the_last_line_is_reported_and_left_untouched(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    """Edited or merged lines, a foreign header or file: JournalCorrupt in one line, the file
    never emptied or rewritten."""
    path = appended_log(tmp_path)
    damaged = damage(path.read_bytes())
    path.write_bytes(damaged)

    with pytest.raises(JournalCorrupt, match="left untouched") as raised:
        Journal.open(tmp_path)

    assert str(path) in raised.value.message
    assert "\n" not in raised.value.message
    assert path.read_bytes() == damaged
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]


# -- an older Run's journal.json --------------------------------------------------------------


@pytest.mark.anyio
async def test_an_old_journal_json_is_carried_over_then_removed(tmp_path: Path) -> None:
    """An upgrade loses no held attempt: journal.json is read, then replaced by the log."""
    held = {"job_1": assignment("job_1"), "job_2": assignment("job_2", state="running")}
    old_journal(tmp_path, *held.values())

    journal = Journal.open(tmp_path)
    opened = dict(journal.entries)
    await durable(journal.sync())
    await journal.close()

    assert held == opened
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]
    assert held == Journal.open(tmp_path).entries


@pytest.mark.anyio
async def test_a_log_beside_an_old_journal_json_wins(tmp_path: Path) -> None:
    """Both files: the carrying over was interrupted after the log was in place; it is used."""
    written_journal(tmp_path, assignment("job_2"))
    old_journal(tmp_path, assignment("job_1"))

    journal = Journal.open(tmp_path)
    opened = set(journal.entries)
    await durable(journal.sync())
    await journal.close()

    assert ({"job_2"}, [FILE_NAME]) == (opened, sorted(p.name for p in tmp_path.iterdir()))


def torn(document: bytes) -> bytes:
    return document[: len(document) // 2]


def edited(document: bytes) -> bytes:
    parsed = json.loads(document)
    parsed["entries"][0]["attempt"] = 3  # the stored checksum no longer fits
    return json.dumps(parsed).encode()


def old_wrong_format(document: bytes) -> bytes:
    parsed = json.loads(document)
    parsed["format"] = "moonrun-journal/99"
    return json.dumps(parsed).encode()


@pytest.mark.parametrize(
    "damage",
    [
        torn,
        lambda document: b"",
        edited,
        old_wrong_format,
        lambda document: b'["some", "other", "json"]',
        lambda document: b"\xff\xfe" + document,
    ],
    ids=["torn", "emptied", "edited", "wrong_format", "not_a_journal", "not_utf8"],
)
def test_a_damaged_old_journal_is_reported_and_left_untouched(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    """Torn, edited or foreign journal.json files raise JournalCorrupt and are kept as they are."""
    path = old_journal(tmp_path, assignment("job_1"))
    damaged = damage(path.read_bytes())
    path.write_bytes(damaged)

    with pytest.raises(JournalCorrupt, match="left untouched") as raised:
        Journal.open(tmp_path)

    assert str(path) in raised.value.message
    assert path.read_bytes() == damaged
    assert sorted(p.name for p in tmp_path.iterdir()) == [OLD_FILE_NAME]
