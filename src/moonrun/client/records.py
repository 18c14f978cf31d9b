"""What the user API answers, as Python records (one dataclass per view) and job states.

Each record keeps the API's JSON object exactly as answered in `data`; `Record.of(data)`
builds one from it. Shared by `Client` and `AsyncClient` (through `calls.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

TERMINAL_STATES: Final = frozenset({"succeeded", "failed", "cancelled"})


def _instant(text: Any) -> datetime:
    return datetime.fromisoformat(str(text).replace("Z", "+00:00").replace("z", "+00:00"))


def _optional_instant(text: Any) -> datetime | None:
    return None if text is None else _instant(text)


class JobState(StrEnum):
    """A job's state (docs/protocol.md, "Jobs"); each equals its name as a string too."""

    QUEUED = "queued"
    ACCEPTED = "accepted"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Job:
    """A job as the user API shows it (JobView); `data` is that object as answered."""

    id: str
    server_id: str
    kind: str
    state: JobState
    attempt: int
    max_attempts: int
    created_at: datetime
    progress: dict[str, Any] | None
    terminal: dict[str, Any] | None
    data: dict[str, Any]

    @classmethod
    def of(cls, data: dict[str, Any]) -> Job:
        return cls(
            id=data["id"],
            server_id=data["server_id"],
            kind=data["kind"],
            state=JobState(data["state"]),
            attempt=data["attempt"],
            max_attempts=data["max_attempts"],
            created_at=_instant(data["created_at"]),
            progress=data.get("progress"),
            terminal=data.get("terminal"),
            data=data,
        )

    @property
    def ended(self) -> bool:
        """Whether the job is in a terminal state (succeeded, failed or cancelled)."""
        return self.state in TERMINAL_STATES

    @property
    def result(self) -> Any:
        """What the ending attempt's handler returned (docs/kinds.md); None until it ends."""
        return None if self.terminal is None else self.terminal.get("result")

    @property
    def logs_complete(self) -> bool:
        """Whether its latest attempt's log lines are all in (a platform older than that
        says nothing: then whether the job has ended)."""
        complete = self.data.get("logs_complete")
        return self.ended if complete is None else bool(complete)

    @property
    def priority(self) -> int:
        """0 to 9: among its endpoint's claimable jobs a higher one goes first (5 from a
        platform older than priorities)."""
        return int(self.data.get("priority", 5))

    @property
    def payload(self) -> dict[str, Any] | None:
        """The payload its submitter gave, each credential-looking member's value shown as
        "[redacted]" (docs/protocol.md, "Payload"); None unless it was asked for
        (`Client.job(id, include_payload=True)`)."""
        found = self.data.get("payload")
        return None if found is None else dict(found)

    @property
    def waiting_for(self) -> dict[str, Any] | None:
        """While it waits on its dependencies, `{"jobs": [...], "group": ...}`; else None."""
        found = self.data.get("waiting_for")
        return None if found is None else dict(found)


@dataclass(frozen=True)
class Group:
    """A fan-out group as the user API shows it (GroupView); `data` is that object."""

    id: str
    selector: str
    kind: str
    job_count: int
    max_parallel: int | None
    stop_on_failure: bool
    counts: dict[str, int]
    done: bool
    created_at: datetime
    data: dict[str, Any]

    @classmethod
    def of(cls, data: dict[str, Any]) -> Group:
        return cls(
            id=data["id"],
            selector=data["selector"],
            kind=data["kind"],
            job_count=data["job_count"],
            max_parallel=data.get("max_parallel"),
            stop_on_failure=bool(data.get("stop_on_failure")),
            counts=dict(data["counts"]),
            done=bool(data["done"]),
            created_at=_instant(data["created_at"]),
            data=data,
        )


@dataclass(frozen=True)
class FanOut:
    """What a fan-out made: its group and its jobs, one per matching server."""

    group: Group
    jobs: list[Job]


@dataclass(frozen=True)
class User:
    id: str
    name: str
    platform_admin: bool
    created_at: datetime
    data: dict[str, Any]
    disabled: bool = False

    @classmethod
    def of(cls, data: dict[str, Any]) -> User:
        return cls(
            data["id"],
            data["name"],
            data["platform_admin"],
            _instant(data["created_at"]),
            data,
            bool(data.get("disabled", False)),
        )


@dataclass(frozen=True)
class Endpoint:
    id: str
    name: str
    online: bool
    generation: int
    last_seen_at: datetime | None
    capacity: int | None
    run_version: str | None
    data: dict[str, Any]
    draining: bool = False
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Endpoint:
        return cls(
            id=data["id"],
            name=data["name"],
            online=data["online"],
            generation=data["generation"],
            last_seen_at=_optional_instant(data.get("last_seen_at")),
            capacity=data.get("capacity"),
            run_version=data.get("run_version"),
            data=data,
            draining=bool(data.get("draining", False)),
            labels=dict(data.get("labels") or {}),  # an older platform sends none
        )


@dataclass(frozen=True)
class Server:
    id: str
    name: str
    endpoint_id: str
    owner_id: str
    admin_ids: tuple[str, ...]
    created_at: datetime
    endpoint_online: bool
    data: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)
    """The server's own labels (selectors match them over its endpoint's)."""

    @classmethod
    def of(cls, data: dict[str, Any]) -> Server:
        return cls(
            id=data["id"],
            name=data["name"],
            endpoint_id=data["endpoint_id"],
            owner_id=data["owner_id"],
            admin_ids=tuple(data["admin_ids"]),
            created_at=_instant(data["created_at"]),
            endpoint_online=data["endpoint_online"],
            data=data,
            labels=dict(data.get("labels") or {}),  # an older platform sends none
        )


@dataclass(frozen=True)
class Schedule:
    """A server's recurring job (or, with a `selector`, a recurring fan-out): its calendar,
    what each firing creates, and how it went."""

    id: str
    server_id: str | None
    """None for a selector schedule."""
    name: str
    cron: str
    timezone: str
    kind: str
    overlap: str
    paused: bool
    next_times: tuple[datetime, ...]
    skipped: int
    missed: int
    last_job_id: str | None
    data: dict[str, Any]
    selector: str | None = None
    """The label selector each firing fans out over (a group per firing)."""
    last_group_id: str | None = None
    """The group the last selector firing made."""
    unmatched: int = 0
    """Selector firings that matched no server."""

    @classmethod
    def of(cls, data: dict[str, Any]) -> Schedule:
        last = data.get("last_firing")
        return cls(
            id=data["id"],
            server_id=data["server_id"],
            name=data["name"],
            cron=data["cron"],
            timezone=data["timezone"],
            kind=data["job"]["kind"],
            overlap=data["overlap"],
            paused=data["paused"],
            next_times=tuple(_instant(t) for t in data["next_times"]),
            skipped=data["skipped"],
            missed=data["missed"],
            last_job_id=last["job_id"] if last else None,
            data=data,
            # An older platform sends none of these.
            selector=data.get("selector"),
            last_group_id=last.get("group_id") if last else None,
            unmatched=data.get("unmatched", 0),
        )


@dataclass(frozen=True)
class LogLine:
    """One line of an attempt's log; `ts` is the RFC 3339 text Run wrote."""

    attempt: int
    seq: int
    ts: str
    stream: str
    text: str
    data: dict[str, Any]

    @classmethod
    def of(cls, data: dict[str, Any]) -> LogLine:
        return cls(data["attempt"], data["seq"], data["ts"], data["stream"], data["text"], data)


@dataclass(frozen=True)
class Artifact:
    """One artifact of one attempt; only a `complete` one can be downloaded."""

    attempt: int
    name: str
    size: int
    complete: bool
    data: dict[str, Any]

    @classmethod
    def of(cls, data: dict[str, Any]) -> Artifact:
        return cls(data["attempt"], data["name"], data["size"], data["complete"], data)


@dataclass(frozen=True)
class Kinds:
    """What a server's Run advertised it runs: each kind's payload JSON Schema. Not
    `advertised` (an older Run, or none registered yet): every kind is accepted at submit."""

    advertised: bool
    schemas: dict[str, Any]
    data: dict[str, Any]

    @classmethod
    def of(cls, data: dict[str, Any]) -> Kinds:
        schemas = {kind["kind"]: kind["payload_schema"] for kind in data["kinds"]}
        return cls(data["advertised"], schemas, data)
