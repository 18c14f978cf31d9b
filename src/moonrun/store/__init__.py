"""The store seam: the only place scheduling state lives (memory, SQLite file, MySQL)."""

from moonrun.store.protocol import Store

__all__ = ["Store"]
