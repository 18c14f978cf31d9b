"""Sign-in throttling with several platform processes behind one load balancer (docs/
operations.md, "Several platforms", "Sign-in throttling"): beside a database they share, the
processes count failed sign-ins together, in files of their shared data directory
(`security/sign_in_ledger.py`'s FileLedger), so a guesser spread over N processes gets one
allowance, not N, and a sign-in on one clears the name on all. Each throttle here has its own
ledger object over one directory, as each process has."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from moonrun.clock import ManualClock
from moonrun.security.sign_in_ledger import FileLedger
from moonrun.service.websessions import SignInThrottle

PLATFORMS = 3


def platforms(clock: ManualClock, root: Path) -> list[SignInThrottle]:
    return [SignInThrottle(clock, ledger=FileLedger(root)) for _ in range(PLATFORMS)]


def test_platforms_sharing_a_ledger_give_a_guesser_one_allowance_not_n(tmp_path: Path) -> None:
    """100 tries at one name from 100 addresses, each to the next platform: five are checked,
    every other is told to wait, at most a minute."""
    throttles = platforms(ManualClock(), tmp_path)
    answers = [throttles[n % PLATFORMS].reserve("alice", f"198.51.100.{n}") for n in range(100)]
    assert answers.count(0) == 5
    assert answers[:5] == [0] * 5
    assert all(0 < wait <= 60 for wait in answers[5:])


def test_a_sign_in_on_one_platform_clears_the_name_on_every_other(tmp_path: Path) -> None:
    a, b, c = platforms(ManualClock(), tmp_path)
    for throttle in (a, b, a, b):
        assert throttle.reserve("alice", "203.0.113.7") == 0  # four wrong passwords
    assert c.reserve("alice", "192.0.2.1") == 0
    c.succeeded("alice", "192.0.2.1")  # the fifth was alice's own
    assert [b.reserve("alice", "203.0.113.7") for _ in range(5)] == [0] * 5


def test_the_user_waits_no_longer_behind_n_platforms_than_behind_one(tmp_path: Path) -> None:
    """However many guesses the platforms saw, a minute after the latest one each of them
    checks the user's password again."""
    clock = ManualClock()
    throttles = platforms(clock, tmp_path)
    for _ in range(100):
        for throttle in throttles:
            throttle.reserve("alice", "203.0.113.7")
        clock.advance_s(0.5)
    clock.advance_s(60)
    assert throttles[1].reserve("alice", "192.0.2.1") == 0


def test_names_nobody_failed_for_long_leave_no_file(tmp_path: Path) -> None:
    clock = ManualClock()
    throttle = SignInThrottle(clock, ledger=FileLedger(tmp_path, prune_every=1))
    throttle.reserve("alice", "203.0.113.7")
    assert len(list(tmp_path.iterdir())) == 2  # the name's and the address's
    clock.advance_s(16 * 60)
    throttle.reserve("bob", "192.0.2.1")
    assert len(list(tmp_path.iterdir())) == 2  # bob's and the new address's: alice's went
    for path in tmp_path.iterdir():  # no name or address on disk
        assert (len(path.name), b"bob" in path.read_bytes()) == (64, False)


def _tries_from_a_process(root: str, start: Any, checked: Any) -> None:
    throttle = SignInThrottle(ManualClock(), ledger=FileLedger(Path(root)))
    start.wait()
    for n in range(20):
        if throttle.reserve("alice", f"198.51.100.{n}") == 0:
            with checked.get_lock():
                checked.value += 1


def test_tries_at_once_on_two_processes_never_pass_the_allowance(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    start, checked = context.Barrier(2), context.Value("i", 0)
    children = [
        context.Process(target=_tries_from_a_process, args=(str(tmp_path), start, checked))
        for _ in range(2)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=120)
    assert [child.exitcode for child in children] == [0, 0]
    assert checked.value == 5
