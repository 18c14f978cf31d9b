"""`Store.extend_sessions`: many sessions' extensions in one write, each as `extend_session`
would apply it (a later expiry is stored with its last_seen_at; an earlier one, or an unknown
session, changes nothing), over every store."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from moonrun.store.file import FileStore
from moonrun.store.protocol import Store
from tests.support.stores import StoreFactory
from tests.unit.store.test_store_contract import SESSION_TTL_MS, T0, make_session


@pytest.fixture
def store(store_factory: StoreFactory) -> Iterator[Store]:
    store = store_factory.open()
    yield store
    store.close()


def test_extend_sessions_applies_each_extension_in_one_write(store: Store) -> None:
    sessions = [make_session(f"sess-{n}", endpoint_id=f"ep-{n}") for n in range(3)]
    for session in sessions:
        store.insert_session(session)
    later = T0 + 30_000
    commits = store.groups_committed if isinstance(store, FileStore) else None
    store.extend_sessions(
        [
            ("sess-0", later, later + SESSION_TTL_MS),
            ("sess-1", T0 - 5_000, T0 - 5_000 + SESSION_TTL_MS),  # earlier: ignored
            ("sess-ghost", later, later + SESSION_TTL_MS),  # unknown: nothing
        ]
    )
    if commits is not None:
        assert isinstance(store, FileStore)
        assert store.groups_committed - commits == 1
    assert store.get_session("sess-0") == replace(
        sessions[0], last_seen_at=later, expires_at=later + SESSION_TTL_MS
    )
    assert store.get_session("sess-1") == sessions[1]
    assert store.get_session("sess-2") == sessions[2]
    assert store.get_session("sess-ghost") is None
    store.extend_sessions([])  # nothing to write
