"""A claim reaches every owner and every rank that has claimable jobs, whatever the owner ids
look like and however urgent the jobs are: owner ids that sort before the word `None` (digits,
capitals A to M) are found and served like `usr_…` ones, and jobs of priority 9 and 8 (ranks 0
and 1, the first two a claim looks at) are granted first. Users' ids are `usr_…`; a store fed
other ids (an import, a test) must still not lose the first owner of a rank. On MemoryStore and
FileStore (the store contract's MySQL runs are left to `make test`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.scheduling.jobs import create_job
from moonrun.store.file import FileStore
from moonrun.store.memory import MemoryStore
from moonrun.store.protocol import Store
from tests.unit.store.test_store_contract import POLICY, T0, backlog, grant_at, owners


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened: Store = MemoryStore() if request.param == "memory" else FileStore(tmp_path / "p.db")
    yield opened
    opened.close()


@pytest.mark.parametrize(
    "ids",
    [
        pytest.param(("0-first", "1-second"), id="digits"),
        pytest.param(("Alice", "Bob"), id="capitals"),
        pytest.param(("MMM", "Nona"), id="just before None"),
    ],
)
def test_owners_whose_ids_sort_first_take_their_turns(store: Store, ids: tuple[str, str]) -> None:
    first, second = ids
    store.insert_jobs([*backlog(first, 3), *backlog(second, 3, start=T0 + 10)])
    claimed = store.claim_jobs("ep-1", T0 + 100, 4, grant_at(T0 + 100))
    assert owners(claimed) == [first, second, first, second]
    later = store.claim_jobs("ep-1", T0 + 100, 1, grant_at(T0 + 100), after_owner=first)
    assert owners(later) == [second]


def test_a_lone_owner_whose_id_sorts_first_gets_every_job(store: Store) -> None:
    store.insert_jobs(backlog("A", 3))
    claimed = store.claim_jobs("ep-1", T0 + 100, 5, grant_at(T0 + 100))
    assert [job.id for job in claimed] == [f"job-A-{n:04d}" for n in range(3)]


def test_the_most_urgent_priorities_are_claimed_first(store: Store) -> None:
    """Priority 9 is rank 0 and 8 rank 1: the ranks a claim starts from."""
    jobs = [
        create_job(
            job_id=f"job-p{priority}",
            server_id="srv-1",
            endpoint_id="ep-1",
            owner_id="usr-1",
            kind="work",
            payload={},
            policy=POLICY,
            now=T0 + n,
            priority=priority,
        )
        for n, priority in enumerate((5, 8, 9))
    ]
    store.insert_jobs(jobs)
    claimed = store.claim_jobs("ep-1", T0 + 100, 5, grant_at(T0 + 100))
    assert [job.id for job in claimed] == ["job-p9", "job-p8", "job-p5"]
