"""An attempt's file that holds no whole record (its writer crashed inside the first one) and
that another platform process then deletes is forgotten by a process that had read it: its
reads answer an empty page, with nothing to forget in memory but the file's place."""

from __future__ import annotations

from pathlib import Path

from moonrun.logs.file import FileLogStore


def test_a_file_with_no_whole_record_deleted_elsewhere_reads_empty(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir(mode=0o700)
    (tmp_path / "x" / "1.jsonl").write_bytes(b'{"seq": 1, "lines": [["2026-11-30T00:0')
    reader = FileLogStore(tmp_path, shared=True)
    assert reader.read("x", 1, -1).lines == []  # the file read: nothing whole in it

    FileLogStore(tmp_path, shared=True).delete_job("x", 1)
    assert not (tmp_path / "x" / "1.jsonl").exists()

    page = reader.read("x", 1, -1)
    assert (page.lines, page.dropped_lines) == ([], 0)
    assert reader.attempts("x") == []
