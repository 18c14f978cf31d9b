"""Every store keeps endpoints' and servers' labels (docs/protocol.md, "Labels"), through each of
its reads, a compare-and-swap and a reopen; an older store gains them on open."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from moonrun.scheduling.labels import check_labels
from moonrun.scheduling.records import Endpoint, Server
from moonrun.store import open_store
from moonrun.store.file import FileStore
from moonrun.store.mysql import MySQLStore
from moonrun.store.protocol import Store
from moonrun.store.schema import SCHEMA_VERSION
from tests.support.jobkit import T0
from tests.support.stores import StoreFactory
from tests.unit.store.test_durable_stores import _raw_sql, private_store_url

__all__ = ["private_store_url"]  # a fixture: a file, or a MySQL database of its own

# Values that a careless encoding would lose: quotes, a backslash, non-ASCII, the empty string.
LABELS = check_labels(
    {"role": "web", "env": "prod", "note": 'say "hi" \\ ☾', "empty": "", "a/b.c-d_e": "x" * 128}
)


def endpoint(labels: tuple[tuple[str, str], ...] = ()) -> Endpoint:
    return Endpoint("ep-1", "alpha", T0, "join-hash", T0 + 3_600_000, labels=labels)


def server(labels: tuple[tuple[str, str], ...] = ()) -> Server:
    return Server("srv-1", "web-1", "ep-1", "usr-1", T0, admin_ids=("usr-2",), labels=labels)


@pytest.fixture
def stores(store_factory: StoreFactory) -> Iterator[list[Store]]:
    """The opened store, then each reopening of it (the last one is closed at the end)."""
    opened = [store_factory.open()]
    yield opened
    opened[-1].close()


def test_every_store_keeps_endpoint_and_server_labels_across_reads_and_a_reopen(
    store_factory: StoreFactory, stores: list[Store]
) -> None:
    store = stores[0]
    store.insert_endpoint(endpoint(LABELS))
    store.insert_server(server(LABELS))
    again = store_factory.reopen(store)
    stores.append(again)
    assert again.get_endpoint("ep-1") == endpoint(LABELS)
    assert again.list_endpoints() == [endpoint(LABELS)]
    assert again.get_server("srv-1") == server(LABELS)
    assert again.list_servers() == [server(LABELS)]
    assert again.servers_of_user("usr-2") == [server(LABELS)]


def test_every_store_replaces_labels_by_compare_and_swap(stores: list[Store]) -> None:
    store = stores[0]
    store.insert_endpoint(endpoint(LABELS))
    store.insert_server(server())
    cleared = replace(endpoint(), version=2)
    labelled = replace(server(LABELS), version=2)
    assert store.replace_endpoint(cleared, 1)
    assert store.replace_server(labelled, 1)
    assert not store.replace_server(replace(server(), version=3), 1)
    assert store.get_endpoint("ep-1") == cleared
    assert store.get_server("srv-1") == labelled


def test_an_older_store_gains_labels_on_open(private_store_url: str) -> None:
    """A store of schema 8 (no labels) opens at the current version, its endpoints and
    servers without labels, and keeps labels set from then on."""
    store = open_store(private_store_url)
    store.insert_endpoint(endpoint())
    store.insert_server(server())
    store.close()
    _raw_sql(
        private_store_url,
        "ALTER TABLE endpoints DROP COLUMN labels_json",
        "ALTER TABLE servers DROP COLUMN labels_json",
        "UPDATE schema_version SET version = 8",
    )
    store = open_store(private_store_url)
    try:
        assert store.get_endpoint("ep-1") == endpoint()
        assert store.get_server("srv-1") == server()
        assert store.replace_server(replace(server(LABELS), version=2), 1)
        assert store.get_server("srv-1") == replace(server(LABELS), version=2)
        assert isinstance(store, FileStore | MySQLStore)
        assert store.schema_version() == SCHEMA_VERSION
    finally:
        store.close()
