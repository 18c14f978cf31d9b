"""`/metrics` says which platform process answered (docs/operations.md, "Health and metrics"):
behind a load balancer, two scrapes of one address may reach two processes."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from tests.support.http_harness import http_world
from tests.support.stores import memory_factory

INFO = re.compile(r'^moonrun_process_info\{process="([^"]+)",version="([^"]+)"\} 1\.0$', re.M)


def scrape(text: str) -> list[tuple[str, str]]:
    return INFO.findall(text)


def test_each_process_names_itself_the_same_at_every_scrape(tmp_path: Path) -> None:
    with (
        http_world(memory_factory(), tmp_path / "a") as a,
        http_world(memory_factory(), tmp_path / "b") as b,
    ):
        first = scrape(a.world.client.get("/metrics").text)
        again = scrape(a.world.client.get("/metrics").text)
        other = scrape(b.world.client.get("/metrics").text)

    assert len(first) == len(other) == 1
    assert first == again
    assert first != other
    host, pid, _tag = first[0][0].split(":")
    assert (host, pid) == (socket.gethostname(), str(os.getpid()))
