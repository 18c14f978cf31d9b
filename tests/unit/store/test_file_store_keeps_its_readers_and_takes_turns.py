"""A FileStore keeps a reading connection between reads (one opened, not one per read), and the
units it applies hold the gate its reads take (the threads of a process take turns at the
store)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from moonrun.store.file import FileStore


def test_reads_one_after_another_share_one_kept_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path / "platform.db")
    opened: list[sqlite3.Connection] = []
    open_one = store._open

    def counted() -> sqlite3.Connection:
        opened.append(open_one())
        return opened[-1]

    monkeypatch.setattr(store, "_open", counted)
    try:
        for _ in range(3):
            store.list_users()
    finally:
        store.close()
    assert len(opened) == 1


def test_a_unit_being_applied_holds_the_gate_that_reads_take(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "platform.db")
    taken: list[bool] = []

    def another_thread_takes_the_gate() -> None:
        got = store._gate.acquire(blocking=False)
        taken.append(got)
        if got:
            store._gate.release()

    def unit(cursor: sqlite3.Cursor) -> None:
        thread = threading.Thread(target=another_thread_takes_the_gate)
        thread.start()
        thread.join()

    try:
        store._write(unit)
    finally:
        store.close()
    assert taken == [False]
