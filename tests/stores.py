"""Store factories for the parametrized suites: each opens a store and reopens it as a restart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from moonrun.store.memory import MemoryStore
from moonrun.store.protocol import Store


@dataclass
class StoreFactory:
    """Opens a fresh store and reopens it over the same data (a platform restart)."""

    name: str
    open: Callable[[], Store]
    reopen: Callable[[Store], Store]


def memory_factory() -> StoreFactory:
    # A MemoryStore dies with its process, so a "restart" keeps the same object: the new
    # service instance must still rely on nothing but the store.
    return StoreFactory("memory", MemoryStore, lambda store: store)


STORE_NAMES = ["memory"]
"""The stores every contract and scenario suite runs against (file and mysql join later)."""


def make_factory(name: str) -> StoreFactory:
    if name == "memory":
        return memory_factory()
    raise LookupError(f"no store factory named {name!r}")
