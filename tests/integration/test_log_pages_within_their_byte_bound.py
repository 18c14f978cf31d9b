"""Pages and tails of both log stores hold at most `page_bytes` of text (at least one batch, or
line), up to it exactly; an attempt with nothing to answer has an empty page that says where
to go on from; a line is cut between characters, and one of exactly `line_bytes` is kept
whole; a FileLogStore opened again has each line's `ts` and `stream` as sent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from moonrun.logs.file import FileLogStore
from moonrun.logs.memory import MemoryLogStore
from moonrun.logs.protocol import LogLine, LogPage, LogStore

TS = "2026-11-30T00:00:00.000Z"

MakeStore = Callable[..., LogStore]


def lines(seq: int, *texts: str) -> list[LogLine]:
    return [LogLine(seq, TS, "stdout", text) for text in texts]


def texts(page: LogPage) -> list[str]:
    return [ln.text for ln in page.lines]


@pytest.fixture(params=["memory", "file"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> MakeStore:
    if request.param == "memory":
        return MemoryLogStore
    return lambda **limits: FileLogStore(tmp_path / "logs", **limits)


def test_a_page_holds_batches_up_to_page_bytes_exactly(make_store: MakeStore) -> None:
    store = make_store(page_bytes=10)
    store.append("job", 1, 1, lines(1, "x"))
    store.append("job", 1, 2, lines(2, "aa"))
    store.append("job", 1, 3, lines(3, "bbbb", "cccc"))
    first, rest = store.read("job", 1, -1), store.read("job", 1, 1)
    assert [(texts(p), p.next_after_seq, p.more) for p in (first, rest)] == [
        (["x", "aa"], 2, True),
        (["aa", "bbbb", "cccc"], 3, False),
    ]


def test_a_tail_holds_lines_up_to_page_bytes_exactly(make_store: MakeStore) -> None:
    store = make_store(page_bytes=10)
    store.append("job", 1, 1, lines(1, "x", "aa"))
    store.append("job", 1, 2, lines(2, "bbbb", "cccc"))
    assert texts(store.tail("job", 1, 10)) == ["aa", "bbbb", "cccc"]


def test_nothing_to_answer_is_an_empty_page_that_says_where_to_go_on(
    make_store: MakeStore,
) -> None:
    store = make_store()
    store.append("job", 1, 3, lines(3, "c"))
    assert [
        store.read("none", 2, 7),
        store.tail("none", 2, 5, after_seq=7),
        store.tail("job", 1, 5, after_seq=3),
    ] == [
        LogPage(2, [], 7, False),
        LogPage(2, [], 7, False),
        LogPage(1, [], 3, False, kept_lines=1),
    ]


def test_lines_are_cut_between_characters_and_kept_whole_at_the_cap(
    make_store: MakeStore,
) -> None:
    store = make_store(line_bytes=9)
    store.append("job", 1, 1, lines(1, "éééé", "ééééé", "aéééé"))
    assert texts(store.read("job", 1, -1)) == [
        "éééé",
        "éééé… [truncated 2 bytes]",
        "aéééé",
    ]


def test_lines_read_back_keep_their_ts_and_stream(make_store: MakeStore, tmp_path: Path) -> None:
    sent = [LogLine(1, TS, "stdout", "out"), LogLine(1, "2026-11-30T00:00:01.000Z", "stderr", "e")]
    store = make_store()
    store.append("job", 1, 1, sent)
    assert store.read("job", 1, -1).lines == sent


def test_lines_read_back_after_a_restart_keep_their_ts_and_stream(tmp_path: Path) -> None:
    sent = [LogLine(1, TS, "stdout", "out"), LogLine(1, "2026-11-30T00:00:01.000Z", "stderr", "e")]
    FileLogStore(tmp_path).append("job", 1, 1, sent)
    assert FileLogStore(tmp_path).read("job", 1, -1).lines == sent
