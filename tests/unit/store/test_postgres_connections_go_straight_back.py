"""PostgresStore hands a connection back to its pool in the thread that used it, and reads
and writes on the same autocommit connections: no per-query hop through the pool's worker
thread and no mode switch per checkout (together they made a PostgreSQL read cost 125-170 us
against MySQL's 30 in one run; `bench/peer_bench.py` end to end 0.70x MySQL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from moonrun.store import postgres
from moonrun.store.postgres import PostgresStore
from tests.support.stores import wipe_postgres


@pytest.fixture
def tasks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the tasks the pool gives its worker threads."""
    given: list[str] = []
    pool_class = postgres._driver()[1].ConnectionPool
    real = pool_class.run_task

    def counted(self: Any, task: Any) -> None:
        given.append(type(task).__name__)
        real(self, task)

    monkeypatch.setattr(pool_class, "run_task", counted)
    return given


@pytest.fixture
def store(postgres_url: str, tasks: list[str]) -> Iterator[PostgresStore]:
    wipe_postgres(postgres_url)
    opened = PostgresStore(postgres_url, pool_size=2)
    yield opened
    opened.close()


def test_reads_and_writes_give_their_connection_back_without_the_pools_worker(
    store: PostgresStore, tasks: list[str]
) -> None:
    store.get_job("job-a")
    before = list(tasks)
    for _ in range(10):
        store.get_job("job-a")
        assert store.delete_endpoint("end-unknown") == 0
    assert tasks == before, "a connection went back through the pool's worker thread"


def test_every_pooled_connection_stays_in_autocommit_after_reads_and_writes(
    store: PostgresStore,
) -> None:
    for _ in range(3):
        store.get_job("job-a")
        store.delete_endpoint("end-unknown")
    with store._pool.connection() as connection:
        assert connection.autocommit
        assert connection.info.transaction_status == postgres._driver()[0].pq.TransactionStatus.IDLE
