"""Over FileStore, the platform's channels hand their store work to the store's loop flusher:
calls made together on the event loop share one COMMIT (issue 24, "busy writes share a
commit"); over MemoryStore the work runs inline, with nothing to group."""

from __future__ import annotations

import asyncio
from pathlib import Path

from moonrun.clock import SystemClock
from moonrun.security.tokens import SystemTokenSource
from moonrun.service.directory import Directory
from moonrun.store.file import FileStore
from moonrun.wiring.settings import channels_for


def test_calls_made_together_over_filestore_share_commits(tmp_path: Path) -> None:
    """Twenty writes awaited at once on the jobs and control channels are each answered, in
    fewer groups than calls."""
    store = FileStore(tmp_path / "moonrun.db")
    channels = channels_for(store)
    try:
        directory = Directory(store, SystemClock(), SystemTokenSource())
        admin = directory.ensure_bootstrap_admin("mra_wiring-groups-admin-token")

        async def make(index: int) -> str:
            channel = channels.jobs if index % 2 else channels.control
            made = await channel.run(directory.create_user, admin, f"user-{index}")
            return made.user.id

        async def together() -> list[str]:
            return await asyncio.gather(*(make(index) for index in range(20)))

        assert len(set(asyncio.run(together()))) == 20
        assert store.flusher.calls >= 20
        assert store.flusher.groups < store.flusher.calls, "each call committed alone"
    finally:
        channels.close()
        store.close()
