"""Group commit (FileStore's writes): many units, one transaction, each unit on its own.

Grouping is made certain, not hoped for: the first unit holds the write connection until the
others have queued behind it, so they all go into the next transaction together.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from moonrun.errors import AlreadyExists, StoreUnavailable
from moonrun.store.group_commit import GroupCommit


def translate(error: BaseException) -> BaseException:
    if isinstance(error, sqlite3.IntegrityError):
        return AlreadyExists(str(error))
    if isinstance(error, sqlite3.Error):
        return StoreUnavailable(str(error))
    return error


def open_connection(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = FULL")
    return connection


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "group.db"
    with closing(open_connection(path)) as setup:
        setup.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, note TEXT NOT NULL)")
    return path


def insert(row_id: int, note: str = "x") -> Callable[[sqlite3.Cursor], int]:
    def work(cursor: sqlite3.Cursor) -> int:
        cursor.execute("INSERT INTO rows (id, note) VALUES (?, ?)", (row_id, note))
        return row_id

    return work


def stored(path: Path) -> list[int]:
    with closing(open_connection(path)) as reader:
        return [row[0] for row in reader.execute("SELECT id FROM rows ORDER BY id")]


def grouped(commits: GroupCommit, works: list[Callable[[sqlite3.Cursor], Any]]) -> list[Any]:
    """Run `works` so that all of them share one transaction; their outcomes, in order
    (the result, or the exception raised to that caller)."""
    release = threading.Event()

    def hold(cursor: sqlite3.Cursor) -> None:
        release.wait(10)

    with ThreadPoolExecutor(max_workers=len(works) + 1) as pool:
        holder = pool.submit(commits.run, hold)
        while commits.pending < 1:
            threading.Event().wait(0.001)
        futures: list[Future[Any]] = [pool.submit(commits.run, work) for work in works]
        while commits.pending < len(works) + 1:
            threading.Event().wait(0.001)
        release.set()
        holder.result(timeout=10)
        outcomes: list[Any] = []
        for future in futures:
            try:
                outcomes.append(future.result(timeout=10))
            except BaseException as error:
                outcomes.append(error)
    return outcomes


def test_units_queued_while_a_group_commits_share_the_next_transaction(database: Path) -> None:
    """Four writers behind a busy writer are committed together: two transactions in all."""
    commits = GroupCommit(open_connection(database), translate)
    outcomes = grouped(commits, [insert(n) for n in range(1, 5)])
    assert (
        outcomes,
        stored(database),
        commits.groups,
        commits.units,
    ) == ([1, 2, 3, 4], [1, 2, 3, 4], 2, 5)


def test_a_failing_unit_in_a_group_rolls_back_alone(database: Path) -> None:
    """One unit of a group fails halfway: its own writes vanish, the others' are committed,
    and only its caller sees the error."""

    def half_then_fail(cursor: sqlite3.Cursor) -> None:
        cursor.execute("INSERT INTO rows (id, note) VALUES (20, 'half')")
        cursor.execute("INSERT INTO rows (id, note) VALUES (1, 'clash')")  # 1 is taken below

    commits = GroupCommit(open_connection(database), translate)
    outcomes = grouped(commits, [insert(1), half_then_fail, insert(3)])
    assert (1, AlreadyExists, 3) == (outcomes[0], type(outcomes[1]), outcomes[2])
    assert (stored(database), commits.groups) == ([1, 3], 2)


def test_a_unit_that_raises_gets_its_own_exception_back(database: Path) -> None:
    """A bug in a unit's own code reaches its caller unchanged; the group goes on."""

    def broken(cursor: sqlite3.Cursor) -> None:
        raise KeyError("a bug")

    commits = GroupCommit(open_connection(database), translate)
    outcomes = grouped(commits, [insert(1), broken])
    assert (1, KeyError) == (outcomes[0], type(outcomes[1]))
    assert stored(database) == [1]


class _FailingCommit:
    """A connection whose second COMMIT fails, as on a full or vanished disk (and, with
    `rollback_fails`, the ROLLBACK after it too, as on a connection that broke)."""

    def __init__(self, connection: sqlite3.Connection, *, rollback_fails: bool = False) -> None:
        self._connection = connection
        self.in_transaction = False
        self.commits = 0
        self.rollback_fails = rollback_fails

    def cursor(self) -> Any:
        outer = self
        inner = self._connection.cursor()

        class Cursor:
            def execute(self, sql: str, *args: Any) -> Any:
                if sql == "COMMIT":
                    outer.commits += 1
                    if outer.commits == 2:
                        raise sqlite3.OperationalError("disk I/O error")
                if sql == "ROLLBACK" and outer.rollback_fails:
                    raise sqlite3.OperationalError("the connection is broken")
                result = inner.execute(sql, *args)
                outer.in_transaction = outer._connection.in_transaction
                return result

            def close(self) -> None:
                inner.close()

        return Cursor()


def test_a_failed_commit_answers_every_unit_of_the_group_with_an_error(database: Path) -> None:
    """When the commit itself fails, no unit of the group is stored and every caller is told."""
    connection = open_connection(database)
    commits = GroupCommit(_FailingCommit(connection), translate)  # type: ignore[arg-type]
    outcomes = grouped(commits, [insert(1), insert(2)])
    connection.rollback()
    assert ([StoreUnavailable, StoreUnavailable], []) == (
        [type(outcome) for outcome in outcomes],
        stored(database),
    )


class _Gate:
    """A gate that records what was executed while it was held."""

    def __init__(self) -> None:
        self.held = False

    def __enter__(self) -> None:
        self.held = True

    def __exit__(self, *exc: object) -> None:
        self.held = False


def test_the_gate_is_held_for_the_units_and_let_go_for_begin_and_commit(database: Path) -> None:
    """Reads may run while the group waits for the write lock or for the commit's fsync,
    never while its units are being applied."""
    gate, seen = _Gate(), []
    connection = open_connection(database)
    connection.set_trace_callback(lambda sql: seen.append((sql.split()[0], gate.held)))
    GroupCommit(connection, translate, gate=gate).run(insert(1))
    assert seen == [("BEGIN", False), ("INSERT", True), ("COMMIT", False)]


def test_a_group_holds_at_most_max_group_units(database: Path) -> None:
    """65 writers behind a busy one: the default cap of 64 makes two groups of them."""
    commits = GroupCommit(open_connection(database), translate)
    outcomes = grouped(commits, [insert(n) for n in range(1, 66)])
    assert (outcomes, commits.groups, commits.units) == (list(range(1, 66)), 3, 66)


def test_a_group_holds_at_most_the_cap_it_was_given(database: Path) -> None:
    commits = GroupCommit(open_connection(database), translate, max_group=2)
    outcomes = grouped(commits, [insert(n) for n in range(1, 6)])
    assert (outcomes, commits.groups, stored(database)) == ([1, 2, 3, 4, 5], 4, [1, 2, 3, 4, 5])


def test_after_a_failed_commit_the_next_group_starts_afresh(database: Path) -> None:
    """The failed group's transaction is rolled back, not left open: the next write begins
    its own transaction and is stored, the failed group's rows are not."""
    commits = GroupCommit(_FailingCommit(open_connection(database)), translate)  # type: ignore[arg-type]
    failed = grouped(commits, [insert(1), insert(2)])
    assert (
        [type(outcome) for outcome in failed],
        commits.run(insert(5)),
        stored(database),
    ) == ([StoreUnavailable, StoreUnavailable], 5, [5])


def test_a_rollback_that_fails_too_still_answers_the_commits_error(database: Path) -> None:
    """On a broken connection even the ROLLBACK fails: every caller gets the commit's error
    (the next BEGIN will say what is wrong), not the rollback's."""
    broken = _FailingCommit(open_connection(database), rollback_fails=True)
    commits = GroupCommit(broken, translate)  # type: ignore[arg-type]
    outcomes = grouped(commits, [insert(1), insert(2)])
    assert [(type(outcome), str(outcome)) for outcome in outcomes] == [
        (StoreUnavailable, "disk I/O error"),
        (StoreUnavailable, "disk I/O error"),
    ]


class _Interrupt(BaseException):
    """Not an Exception: a KeyboardInterrupt or a cancellation."""


def test_an_interrupt_reaches_every_caller_of_its_group_as_itself(database: Path) -> None:
    """An interrupt inside a unit is not a failure to translate: every member of the group
    sees the interrupt itself, and nothing of the group is stored."""

    def interrupted(cursor: sqlite3.Cursor) -> None:
        raise _Interrupt("stop")

    def everything_unavailable(error: BaseException) -> BaseException:
        return StoreUnavailable(str(error))

    commits = GroupCommit(open_connection(database), everything_unavailable)
    outcomes = grouped(commits, [insert(1), interrupted, insert(3)])
    assert ([type(outcome) for outcome in outcomes], stored(database)) == (
        [_Interrupt, _Interrupt, _Interrupt],
        [],
    )
