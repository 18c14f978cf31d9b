"""`Store.record_beats`: many sessions' heartbeats in one write (one transaction), each moving
its session's `last_seen_at` forward only and nothing else; and `Store.latest_session`: the
session an endpoint had last, once none is current. Over every store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from moonrun.store.protocol import Store
from moonrun.store.sql import SqlStore
from tests.conftest import build_factory
from tests.support.stores import CONTRACT_STORE_NAMES, StoreFactory
from tests.unit.store.test_store_contract import T0, make_session


@pytest.fixture(params=CONTRACT_STORE_NAMES)
def store_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> StoreFactory:
    return build_factory(request.param, request, tmp_path_factory)


@pytest.fixture
def store(store_factory: StoreFactory) -> Iterator[Store]:
    store = store_factory.open()
    yield store
    store.close()


def count_units(store: Store) -> Callable[[], int]:
    """How many write units (transactions) the store ran since this call (a SQL store's
    `_write`; MemoryStore applies a call under one lock: counted as one)."""
    if not isinstance(store, SqlStore):
        return lambda: 1
    units = [0]
    write = store._write

    def counted(work: Any) -> Any:
        units[0] += 1
        return write(work)

    store._write = counted  # type: ignore[method-assign]
    return lambda: units[0]


def test_record_beats_moves_each_last_seen_forward_in_one_write(store: Store) -> None:
    sessions = [make_session(f"sess-{n}", endpoint_id=f"ep-{n}") for n in range(4)]
    for session in sessions:
        store.insert_session(session)
    store.extend_session("sess-3", T0 + 20_000, T0 + 70_000)  # seen later than its beat below
    units = count_units(store)

    store.record_beats(
        {
            "sess-0": T0 + 12_000,
            "sess-1": T0 + 13_000,
            "sess-3": T0 + 15_000,  # older than stored: never moves it back
            "sess-ghost": T0 + 14_000,  # unknown: skipped
        }
    )

    assert units() == 1
    assert [store.get_session(f"sess-{n}") for n in range(4)] == [
        replace(sessions[0], last_seen_at=T0 + 12_000),
        replace(sessions[1], last_seen_at=T0 + 13_000),
        sessions[2],
        replace(sessions[3], last_seen_at=T0 + 20_000, expires_at=T0 + 70_000),
    ]
    assert store.get_session("sess-ghost") is None


def test_record_beats_leaves_a_sessions_expiry_alone(store: Store) -> None:
    """Fencing is the expiry's: a beat recorded after the session expired does not revive it."""
    session = make_session()
    store.insert_session(session)
    store.record_beats({session.id: session.expires_at + 5_000})
    assert store.get_session(session.id) == replace(
        session, last_seen_at=session.expires_at + 5_000
    )


def test_record_beats_with_nothing_to_record_writes_nothing(store: Store) -> None:
    units = count_units(store)
    store.record_beats({})
    assert units() == (1 if not isinstance(store, SqlStore) else 0)


def test_latest_session_is_the_endpoints_session_of_the_highest_generation(store: Store) -> None:
    """Its latest registration (among two of one generation, the one seen last: a registration
    that lost its race leaves a row nobody heartbeats); other endpoints' sessions are not it."""
    assert store.latest_session("ep-1") is None
    first = make_session("sess-a")
    second = replace(make_session("sess-b", created_at=T0 + 1_000), generation=2)
    orphan = replace(make_session("sess-c", created_at=T0 + 2_000), generation=2)
    elsewhere = replace(make_session("sess-d", endpoint_id="ep-2"), generation=9)
    for session in (first, second, orphan, elsewhere):
        store.insert_session(session)
    store.record_beats({"sess-b": T0 + 30_000})

    assert store.latest_session("ep-1") == replace(second, last_seen_at=T0 + 30_000)
