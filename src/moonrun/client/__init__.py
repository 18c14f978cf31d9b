"""moonrun's user API from Python (`Client`) and from a terminal (the `moonrun` user verbs).

`library.py` is the client (httpx; imports only `moonrun.errors`, `moonrun.backoff` and the
profiles),
`verbs.py` the `login`, `job`, `endpoint`, `user` and `server` verbs built on it,
`group_verbs.py` the `group` verbs and `job submit --selector`, `schedule_verbs.py` the
`schedule` verbs, and
`profiles.py` the profiles `moonrun login` saves. `moonrun.cli` only wires the verbs in.
"""

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
