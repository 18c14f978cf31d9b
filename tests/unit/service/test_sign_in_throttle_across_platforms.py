"""Sign-in throttling with several platform processes behind one load balancer (docs/
operations.md, "Several platforms"): each process counts the tries it sees, in memory, so a
guesser spread over N processes by the balancer gets at most N times one process's allowance
checked before every process makes it wait, and the user is never held off longer than one
process would hold them: at most `max_s` after the latest guess. Why it is not in the store:
docs/operations.md, "Sign-in throttling"."""

from __future__ import annotations

from moonrun.clock import ManualClock
from moonrun.service.websessions import SignInThrottle

PLATFORMS = 3


def round_robin(clock: ManualClock) -> tuple[list[SignInThrottle], list[int]]:
    """A burst of 100 tries at one name, each to the next platform: what each try was told
    (0: its password is checked; else the seconds to wait)."""
    throttles = [SignInThrottle(clock) for _ in range(PLATFORMS)]
    answers = [throttles[n % PLATFORMS].reserve("alice", f"198.51.100.{n}") for n in range(100)]
    return throttles, answers


def test_a_guesser_gets_at_most_n_times_one_platforms_allowance() -> None:
    _, answers = round_robin(ManualClock())
    assert answers.count(0) == PLATFORMS * 5
    assert all(0 < wait <= 60 for wait in answers[PLATFORMS * 5 :])


def test_the_user_waits_no_longer_behind_n_platforms_than_behind_one() -> None:
    """However many guesses each platform saw, a minute after the latest one every platform
    checks the user's password again."""
    clock = ManualClock()
    throttles, _ = round_robin(clock)
    for _ in range(200):
        for throttle in throttles:
            throttle.reserve("alice", "203.0.113.7")
        clock.advance_s(0.5)
    clock.advance_s(60)
    assert [throttle.reserve("alice", "192.0.2.1") for throttle in throttles] == [0] * PLATFORMS
