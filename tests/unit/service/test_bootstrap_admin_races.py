"""Platforms started together on a new database each make sure of the same bootstrap admin:
whichever loses the race to create the admin, or to record its token, finds what the winner
made and starts (before, it failed its start with `already_exists`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from moonrun.clock import ManualClock
from moonrun.security.tokens import SeededTokenSource
from moonrun.service.directory import Bootstrap, Directory
from moonrun.store.memory import MemoryStore

TOKEN = "mra_" + "b" * 43


def racing(store: MemoryStore, method: str, first: Callable[[], Any]) -> None:
    """Run `first` (the other platform) just before this platform's first call of `method`."""
    real = getattr(store, method)
    done: list[bool] = []

    def raced(*args: Any) -> Any:
        if not done:
            done.append(True)
            first()
        return real(*args)

    setattr(store, method, raced)


@pytest.mark.parametrize("lost_at", ["insert_user", "insert_api_token"])
def test_the_platform_that_loses_the_race_finds_the_winners_admin(lost_at: str) -> None:
    store, clock = MemoryStore(), ManualClock()
    winner = Directory(store, clock, SeededTokenSource(1))
    loser_store = store  # one database, two platforms
    loser = Directory(loser_store, clock, SeededTokenSource(2))
    made: list[Any] = []
    racing(store, lost_at, lambda: made.append(winner.bootstrap_admin(TOKEN)))
    admin, outcome = loser.bootstrap_admin(TOKEN)
    assert len(made) == 1  # the other platform made the admin, or its token, first
    assert admin.id == made[0][0].id
    assert outcome in (Bootstrap.UNCHANGED, Bootstrap.ROTATED)
    assert [user.name for user in store.list_users()] == ["admin"]
    assert loser.authenticate(TOKEN).id == admin.id
