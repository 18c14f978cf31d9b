"""Fixtures shared by the suites: every store-backed suite runs against every store.

MySQL tests use a fresh database per test session. They skip when MariaDB is unreachable on
a developer machine, and fail when `CI=true`, where MariaDB must be running.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import hypothesis
import pymysql
import pytest

from tests.support import needs
from tests.support.harness import World
from tests.support.stores import (
    DEFAULT_MYSQL_URL,
    DEFAULT_POSTGRES_URL,
    STORE_NAMES,
    StoreFactory,
    file_factory,
    memory_factory,
    mysql_factory,
    mysql_test_database,
    postgres_factory,
    postgres_test_database,
)

# Every Hypothesis failure prints the `@reproduce_failure` blob that replays it, whatever the
# test's own settings (the randomized tests without Hypothesis print their seeds:
# tests/support/seeds.py). No deadline: an example's 200 ms is a wall-clock bound a loaded
# machine (or mutmut's tracing in `make mutate`) breaks, and the tests here keep none
# (docs/testing.md).
hypothesis.settings.register_profile("moonrun", print_blob=True, deadline=None)
hypothesis.settings.load_profile("moonrun")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    try:
        databases = mysql_test_database()
        url = next(databases)
    except pymysql.err.MySQLError as error:
        where = os.environ.get("MOONRUN_TEST_MYSQL_URL", DEFAULT_MYSQL_URL)
        needs.missing(f"MariaDB/MySQL unreachable at {where}: {error}")
    yield url
    databases.close()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    try:
        import psycopg

        databases = postgres_test_database()
        url = next(databases)
    except (ImportError, psycopg.Error) as error:
        where = os.environ.get("MOONRUN_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
        needs.missing(f"PostgreSQL unreachable at {where}: {error}")
    yield url
    databases.close()


def build_factory(
    name: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> StoreFactory:
    if name == "memory":
        return memory_factory()
    if name == "file":
        return file_factory(lambda: tmp_path_factory.mktemp("store"))
    if name == "postgres":
        return postgres_factory(request.getfixturevalue("postgres_url"))
    if name == "mysql+mysqldb" and importlib.util.find_spec("MySQLdb") is None:
        needs.missing(
            "mysqlclient is not installed (it needs libmariadb-dev and pkg-config to build)"
        )
    return mysql_factory(request.getfixturevalue("mysql_url"), name)


def chosen_stores(names: list[str]) -> list[str]:
    """The stores a parametrized suite runs on: all, or those `MOONRUN_TEST_STORES` names
    (comma-separated; `make mutate` runs the in-process suites on `memory` only)."""
    only = os.environ.get("MOONRUN_TEST_STORES", "").strip()
    return [name for name in names if name in only.split(",")] if only else names


@pytest.fixture(params=chosen_stores(STORE_NAMES))
def store_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> StoreFactory:
    return build_factory(request.param, request, tmp_path_factory)


@pytest.fixture(params=chosen_stores(["file", "mysql", "postgres"]))
def durable_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> StoreFactory:
    """The durable stores only: what must survive a process kill or a reopen."""
    return build_factory(request.param, request, tmp_path_factory)


@pytest.fixture
def world(store_factory: StoreFactory) -> Iterator[World]:
    world = World(store_factory)
    yield world
    world.store.close()
