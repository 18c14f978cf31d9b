"""Every store lists the groups one person made, newest first, for the console's groups page
(docs/protocol.md, "Groups")."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from moonrun.scheduling.groups import Group
from moonrun.store.protocol import Store
from tests.support.jobkit import T0
from tests.support.stores import StoreFactory

MADE = Group(
    id="grp_a",
    creator_id="usr-1",
    selector="role=web",
    kind="noop",
    created_at=T0,
    job_count=0,
)


@pytest.fixture
def store(store_factory: StoreFactory) -> Iterator[Store]:
    opened = store_factory.open()
    yield opened
    opened.close()


def test_a_creators_groups_are_listed_newest_first_and_no_one_elses(store: Store) -> None:
    made = [
        MADE,
        replace(MADE, id="grp_c", created_at=T0 + 1),
        replace(MADE, id="grp_b", created_at=T0 + 1),  # the same time: the greater id first
        replace(MADE, id="grp_d", created_at=T0 + 2, creator_id="usr-2"),
    ]
    for group in made:
        store.insert_jobs([], None, group)
    assert [group.id for group in store.groups_of("usr-1", 10)] == ["grp_c", "grp_b", "grp_a"]
    assert store.groups_of("usr-1", 2) == [made[1], made[2]]
    assert store.groups_of("usr-3", 10) == []
