"""A record cut short by a crash (never acknowledged) at the end of an attempt's file is cut
off by the next writer, which keeps every whole record before it, also those another process
wrote after this one last read the file."""

from __future__ import annotations

from pathlib import Path

import orjson

from moonrun.logs.file import FileLogStore
from moonrun.logs.protocol import LogLine

TS = "2026-11-30T00:00:00.000Z"


def test_a_record_cut_short_after_another_writers_whole_record_is_cut_off_alone(
    tmp_path: Path,
) -> None:
    store = FileLogStore(tmp_path, shared=True)
    store.append("job", 1, 1, [LogLine(1, TS, "stdout", "one")])
    with open(tmp_path / "job" / "1.jsonl", "ab") as handle:  # another process, then a crash
        handle.write(orjson.dumps({"seq": 2, "lines": [[TS, "stdout", "two"]]}) + b"\n")
        handle.write(b'{"seq":3,"lines":[["2026')

    store.append("job", 1, 4, [LogLine(4, TS, "stdout", "four")])

    for reader in (store, FileLogStore(tmp_path, shared=True)):
        assert [ln.text for ln in reader.read("job", 1, -1).lines] == ["one", "two", "four"]
