"""The Procrastinate peer of bench/peer_bench.py: one no-op task, jobs kept in PostgreSQL.

Procrastinate 3 keeps every job and its status in PostgreSQL (here 15 with its defaults:
`fsync` and `synchronous_commit` on), so a deferred job and its end survive a crash, as
moonrun's do: the durable peer. peer_bench gives it a database of its own (`moonrun_peer`,
made afresh each run), applies Procrastinate's schema, and starts 2 worker processes
(this machine's cores) with 16 jobs at once each, as moonrun's Run has capacity 16. The task
is async (a sync task would run on threads). Procrastinate keeps no results: a client learns
that a job ended by reading its status.
"""

from __future__ import annotations

import os

import procrastinate

SERVER_DSN = os.environ.get("MOONRUN_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432")
DATABASE = "moonrun_peer"
DSN = f"{SERVER_DSN}/{DATABASE}"

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=DSN, min_size=4, max_size=12)
)


@app.task(name="noop")
async def noop() -> None:
    """Does nothing, like moonrun's `noop` kind."""
