"""The Celery peer of bench/peer_bench.py: one no-op task, Redis as broker and result store.

Configured as a careful Celery user configures it for work that must not be lost: the
message is acknowledged after the task ran (`acks_late`), a worker that dies mid-task gives
it back (`reject_on_worker_lost`), results live in Redis. The worker is the default prefork
pool; peer_bench starts it with `--concurrency 2` (this machine's cores).
"""

from __future__ import annotations

import os

from celery import Celery

REDIS_URL = os.environ.get("MOONRUN_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")

app = Celery("moonrun_peer", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="noop")
def noop() -> None:
    """Does nothing, like moonrun's `noop` kind."""
