"""Concurrency keys: at most `limit` jobs of one owner with one key claimed or running at once.

Pure: the key's checks, and which of its held jobs go. A key holds jobs as a group's
`max_parallel` does (`scheduling/groups.py`), with the same count: a job with a key is made
key-held (queued, not claimable), and the key releases its held jobs oldest first while fewer
than its limit are neither held nor ended (`groups.to_release`). A job of a group with
`max_parallel` is first released by its group, then by its key: its group counts it from
then on, its key once its key releases it. Keys are the owner's: the store keeps a key's
limit and the row its releases take turns on by (owner, key) (docs/protocol.md,
"Concurrency keys").
"""

from __future__ import annotations

from typing import Final

from moonrun.errors import InvalidRequest
from moonrun.scheduling import groups
from moonrun.scheduling.jobs import Concurrency, Job, JobState
from moonrun.scheduling.time import Instant

MAX_KEY_LENGTH: Final = 128
MAX_LIMIT: Final = 1000


def _refuse(field: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"{field} {problem}", fields=((field, problem),))


def check(value: object) -> Concurrency | None:
    """A request's `concurrency` (`{"key": ..., "limit"?: ...}` or null) as a value; 422
    naming `concurrency.key` or `concurrency.limit` when it is not one."""
    if value is None or isinstance(value, Concurrency):
        if isinstance(value, Concurrency):
            check({"key": value.key, "limit": value.limit})
        return value
    if not isinstance(value, dict) or set(value) - {"key", "limit"}:
        raise _refuse("concurrency", "must be an object with key and limit")
    key, limit = value.get("key"), value.get("limit", 1)
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_LENGTH or not key.isprintable():
        raise _refuse("concurrency.key", f"must be 1 to {MAX_KEY_LENGTH} printable characters")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise _refuse("concurrency.limit", f"must be an integer from 1 to {MAX_LIMIT}")
    return Concurrency(key, limit)


def to_release(limit: int, live: int, held: int) -> int:
    """How many of a key's held jobs go now: enough that `live` reach `limit` (the group's
    count: `groups.to_release`)."""
    return groups.to_release(limit, live, held)


def release(job: Job, now: Instant) -> Job:
    """The key-held job made claimable (the very record when its key no longer holds it:
    releasing twice changes nothing)."""
    if not job.key_held or job.held or job.state is not JobState.QUEUED:
        return job
    return job.unheld_by_key(now)


def ended(before: Job | None, after: Job) -> bool:
    """The write ended a job with a key (it became terminal)."""
    return (
        after.concurrency is not None
        and after.state.is_terminal
        and (before is None or not before.state.is_terminal)
    )


def waiting(before: Job | None, after: Job) -> bool:
    """The write left a job its key should look at: made or released by its group while its
    key holds it."""
    return after.held_key is not None and (before is None or before.held_key is None)
