"""PostgresStore's pool checks a connection before use only when it sat idle (CHECK_IDLE_S): a
connection the database dropped meanwhile is replaced instead of failing a request, and one
reused at once costs no extra round trip (checking every checkout took a third of a busy
platform's time in `bench/peer_bench.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from moonrun.store import postgres
from moonrun.store.postgres import PostgresStore
from tests.support.stores import wipe_postgres


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every check the pool makes, counted (and made)."""
    made: list[Any] = []
    real = postgres._driver()[1].ConnectionPool.check_connection

    def counted(connection: Any) -> None:
        made.append(connection)
        real(connection)

    monkeypatch.setattr(postgres._driver()[1].ConnectionPool, "check_connection", counted)
    return made


@pytest.fixture
def store(postgres_url: str, checks: list[Any]) -> Iterator[PostgresStore]:
    """A store whose pool holds one connection, made once the checks are counted."""
    wipe_postgres(postgres_url)
    opened = PostgresStore(postgres_url, pool_size=1)
    yield opened
    opened.close()


def test_a_connection_reused_at_once_is_not_checked_again(
    store: PostgresStore, checks: list[Any]
) -> None:
    store.get_job("job-a")  # the pool's one connection, checked on its first use
    first = len(checks)
    for _ in range(20):
        store.get_job("job-b")
    assert len(checks) == first


def test_a_connection_the_database_dropped_while_idle_is_replaced_not_a_failed_request(
    store: PostgresStore, postgres_url: str, checks: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store.get_job("job-a")
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'moonrun' AND datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ).fetchall()
    assert ended, "no pooled connection to drop"
    monkeypatch.setattr(postgres, "CHECK_IDLE_S", 0.0)  # every connection counts as idle now
    before = len(checks)
    assert store.get_job("job-a") is None  # answered, on a new connection
    assert len(checks) > before
