"""Run's journal: what its refusals say (the damaged line, the file, what to do), which lines
a crash may tear, drops of jobs the log never held, compaction relative to the live entries
and the bound given at open, and write errors nobody awaited."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from moonrun.run import journal as journal_module
from moonrun.run.journal import COMPACT_RATIO, FILE_NAME, OLD_FILE_NAME, Journal, JournalCorrupt
from tests.unit.run.test_journal import appended_log, assignment, durable, records


def line(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def refusal(tmp_path: Path) -> str:
    with pytest.raises(JournalCorrupt) as raised:
        Journal.open(tmp_path)
    return raised.value.message


# -- what a refusal says -------------------------------------------------------------------------


def test_a_damaged_line_is_named_by_its_number_and_the_lines_there_are(tmp_path: Path) -> None:
    path = appended_log(tmp_path)
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"attempt":2', b'"attempt":3')
    path.write_bytes(b"\n".join(lines))

    message = refusal(tmp_path)

    assert f"journal {path} is damaged (line 2 of 4 fails its checksum)" in message
    assert message.endswith(
        "it was left untouched. Move it aside to start afresh: the platform will retry the "
        "jobs it held."
    )


def test_a_log_of_another_format_is_said_to_be_no_journal(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_bytes(line({"format": "moonrun-journal/99"}))
    assert "is damaged (not a moonrun journal log)" in refusal(tmp_path)


def test_a_damaged_first_line_is_damage_not_a_torn_append(tmp_path: Path) -> None:
    """Only a change line can be a torn append: a header that fails is reported as such."""
    (tmp_path / FILE_NAME).write_bytes(b"0000dead {}\n")
    assert "is damaged (line 1 of 1 fails its checksum)" in refusal(tmp_path)


def test_an_old_journal_that_fails_its_checksum_says_so(tmp_path: Path) -> None:
    items = [asdict(assignment("job_1"))]
    document = {"format": "moonrun-journal/1", "entries": items, "sha256": "0" * 64}
    path = tmp_path / OLD_FILE_NAME
    path.write_bytes(json.dumps(document).encode())
    message = refusal(tmp_path)
    assert f"journal {path} is damaged (checksum or format mismatch)" in message


# -- torn appends ----------------------------------------------------------------------------------


def test_a_last_change_line_that_fails_with_its_newline_written_is_a_torn_append(
    tmp_path: Path,
) -> None:
    """The bytes of the last line garbled but its newline there: not acknowledged, ignored,
    the first change line included."""
    header = line({"format": "moonrun-journal/2"})
    put = line({"put": asdict(assignment("job_1"))})
    (tmp_path / FILE_NAME).write_bytes(header + b"0000dead " + put[9:])
    first_change_torn = set(Journal.open(tmp_path).entries)
    (tmp_path / FILE_NAME).write_bytes(header + put + b"\0" * 40 + b"\n")
    later_change_torn = set(Journal.open(tmp_path).entries)
    assert (first_change_torn, later_change_torn) == (set(), {"job_1"})


# -- drops -----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_job_put_and_dropped_in_one_write_leaves_a_drop_the_log_can_be_read_with(
    tmp_path: Path,
) -> None:
    """Put and dropped before the write: the log gets only the drop, of a job it never held."""
    journal = Journal.open(tmp_path)
    await durable(journal.put(assignment("job_1")))
    journal.put(assignment("job_2"))
    await durable(journal.drop("job_2"))
    await journal.close()

    assert [next(iter(r)) for r in records(journal.path)] == ["format", "put", "drop"]
    assert set(Journal.open(tmp_path).entries) == {"job_1"}


@pytest.mark.anyio
async def test_dropping_a_job_the_journal_does_not_hold_changes_nothing(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path)
    await durable(journal.put(assignment("job_1")))
    await durable(journal.drop("job_9"))
    await journal.close()
    assert [next(iter(r)) for r in records(journal.path)] == ["format", "put"]


# -- compaction ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_log_is_not_compacted_while_it_holds_at_most_ratio_lines_per_live_entry(
    tmp_path: Path,
) -> None:
    """With ten live entries, up to ten times the ratio lines are appended; one more rewrites."""
    journal = Journal.open(tmp_path, compact_min=1)
    held = [assignment(f"job_{n}") for n in range(10)]
    await durable(journal.put(*held))
    lengths = []
    for seq in range(1, 10 * COMPACT_RATIO - 10 + 2):
        held[0].progress_seq = seq
        await durable(journal.put(held[0]))
        lengths.append(len(records(journal.path)) - 1)
    await journal.close()
    assert lengths[-2:] == [10 * COMPACT_RATIO, 10]
    assert lengths[:-1] == list(range(11, 10 * COMPACT_RATIO + 1))


def test_a_journal_opened_again_compacts_at_the_bound_it_was_opened_with(
    tmp_path: Path,
) -> None:
    """Two live entries, a bound of 10 lines: the tenth change line is the last appended."""
    appended_log(tmp_path)
    journal = Journal.open(tmp_path, compact_min=10)
    kept = journal.entries["job_1"]
    lengths = []

    async def change() -> None:
        for seq in range(2, 12):
            kept.progress_seq = seq
            await durable(journal.put(kept))
            lengths.append(len(records(journal.path)) - 1)
        await journal.close()

    asyncio.run(change())
    assert lengths == [2, 3, 4, 5, 6, 7, 8, 9, 10, 2]


# -- write errors nobody awaited -------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_failed_write_nobody_awaited_is_not_reported_as_never_retrieved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A drop left unawaited may be lost (the next write rewrites the log): its write error
    is marked seen, not logged by asyncio as an exception never retrieved."""
    journal = Journal.open(tmp_path)
    await durable(journal.put(assignment("job_1")))

    def failing_write(descriptor: int, data: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal_module.os, "write", failing_write)
    journal.drop("job_1")
    with pytest.raises(OSError, match="No space"):
        await durable(journal.sync())
    monkeypatch.undo()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
        await asyncio.sleep(0)
    await journal.close()
    assert [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()] == []


# -- the line format ---------------------------------------------------------------------------


def test_a_line_with_a_valid_checksum_that_is_not_a_record_is_said_to_be_one(
    tmp_path: Path,
) -> None:
    body = b'["some", "list"]'
    (tmp_path / FILE_NAME).write_bytes(b"%08x %s\n" % (zlib.crc32(body), body))
    assert "is damaged (a line that is not a record)" in refusal(tmp_path)


@pytest.mark.anyio
async def test_a_record_whose_text_holds_spaces_reads_back(tmp_path: Path) -> None:
    """The checksum ends at the first space; the record's own spaces are its own."""
    journal = Journal.open(tmp_path)
    await durable(journal.put(assignment("job_1")))
    await durable(journal.put(assignment("job_2", payload={"argv": ["echo", "a b", " c "]})))
    await journal.close()
    assert Journal.open(tmp_path).entries["job_2"].payload == {"argv": ["echo", "a b", " c "]}


def test_a_checksum_is_eight_hex_digits_exactly(tmp_path: Path) -> None:
    """A checksum written without its leading zero does not hold (a damaged first line)."""
    header = json.dumps({"format": "moonrun-journal/2"}, separators=(",", ":")).encode()
    body = next(
        candidate
        for n in range(10_000)
        if zlib.crc32(candidate := json.dumps({"drop": f"job_{n}"}).encode()) < 0x10000000
    )
    damaged = b"%x %s\n" % (zlib.crc32(body), body)
    (tmp_path / FILE_NAME).write_bytes(b"%08x %s\n" % (zlib.crc32(header), header) + damaged * 2)
    assert "is damaged (line 2 of 3 fails its checksum)" in refusal(tmp_path)
