"""Fixtures shared by the suites: every store-backed suite runs against every store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import World
from tests.stores import STORE_NAMES, StoreFactory, make_factory


@pytest.fixture(params=STORE_NAMES)
def store_factory(request: pytest.FixtureRequest) -> StoreFactory:
    return make_factory(request.param)


@pytest.fixture
def world(store_factory: StoreFactory) -> Iterator[World]:
    world = World(store_factory)
    yield world
    world.store.close()
