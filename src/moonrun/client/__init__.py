"""moonrun's user API from Python (`Client`, `AsyncClient`) and from a terminal (the `moonrun`
user verbs).

`library.py` is the client (httpx) and `async_library.py` the same on asyncio; both send the
requests of `calls.py` (the user API without I/O: a `Call` per operation, typed errors from
the error envelope), read answers into `records.py`'s dataclasses and retry as `policy.py`
decides; they import only `moonrun.errors`, `moonrun.backoff` and the profiles.
`verbs.py` is the `login`, `job`, `endpoint`, `user` and `server` verbs built on `Client`,
`group_verbs.py` the `group` verbs and `job submit --selector`, `schedule_verbs.py` the
`schedule` verbs, and `profiles.py` the profiles `moonrun login` saves. `moonrun.cli` only
wires the verbs in.
"""

from moonrun.client.async_library import AsyncClient
from moonrun.client.library import (
    Artifact,
    Client,
    Endpoint,
    FanOut,
    Group,
    Job,
    JobState,
    Kinds,
    LogLine,
    PlatformError,
    Schedule,
    Server,
    Unreachable,
    User,
    WaitTimedOut,
)

__all__ = [
    "Artifact",
    "AsyncClient",
    "Client",
    "Endpoint",
    "FanOut",
    "Group",
    "Job",
    "JobState",
    "Kinds",
    "LogLine",
    "PlatformError",
    "Schedule",
    "Server",
    "Unreachable",
    "User",
    "WaitTimedOut",
]
