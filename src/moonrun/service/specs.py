"""What a user asks of one job, as a value: shared by creates, batches and schedules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from moonrun.scheduling.fingerprint import JsonValue
from moonrun.scheduling.jobs import Concurrency
from moonrun.scheduling.time import Instant


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job a user asks for: what `create_job` takes, as a value (for batches)."""

    kind: str
    payload: JsonValue | None = None
    max_attempts: int | None = None
    backoff: Mapping[str, float] | None = None
    not_before: Instant | None = None
    concurrency: object = None
    """`{"key", "limit"?}` as asked, or a `Concurrency` (checked when its job is made)."""
    after: tuple[str, ...] = ()
    """The jobs it waits on (docs/protocol.md, "Dependencies")."""
    after_group: str | None = None
    """The group it waits on."""
    priority: int | None = None
    """0 to 9 (docs/protocol.md, "Priorities"); None is the default, 5."""

    def request(self, server_id: str) -> dict[str, Any]:
        """The request as the idempotency fingerprint sees it (dependencies and a priority
        only when named, so that the fingerprint of a request naming none is what it always
        was)."""
        request = {
            "server_id": server_id,
            "kind": self.kind,
            "payload": self.payload,
            "max_attempts": self.max_attempts,
            "backoff": dict(self.backoff) if self.backoff is not None else None,
            "not_before": self.not_before,
            **({} if self.concurrency is None else {"concurrency": _plain(self.concurrency)}),
        }
        if self.after:
            request["after"] = list(self.after)
        if self.after_group is not None:
            request["after_group"] = self.after_group
        if self.priority is not None:
            request["priority"] = self.priority
        return request


def _plain(concurrency: object) -> object:
    """A `Concurrency` as the request would have said it, for fingerprints."""
    if isinstance(concurrency, Concurrency):
        return {"key": concurrency.key, "limit": concurrency.limit}
    return concurrency
