"""Job handlers: the built-in `noop`, `sleep` and `command`, and plugins from the
`moonrun.handlers` entry-point group (name = job kind, value = a Handler class).

A handler declares the JSON Schema of its payload (`payload_schema`, `scheduling/kinds.py`
says which keywords count). Run checks each payload against it before the handler runs, and
advertises every handler's schema when it registers, so that the platform refuses a job that
does not fit at submit (422 `invalid_payload`) rather than on the host.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from moonrun.errors import MoonrunError
from moonrun.scheduling import jsonschema_subset
from moonrun.scheduling import kinds as kinds_domain
from moonrun.scheduling.jobs import OUTPUT_LIMIT

if TYPE_CHECKING:
    from moonrun.run.confinement import Confinement

log = logging.getLogger("moonrun.run.handlers")

ENTRY_POINT_GROUP = "moonrun.handlers"


RESULT_BYTES = OUTPUT_LIMIT
"""The largest result a handler may return, as compact JSON: the platform's own bound."""


@dataclass(frozen=True)
class HandlerResult:
    """How an attempt ended, as Run will report it."""

    outcome: str
    retryable: bool = False
    error: dict[str, str] | None = None
    output: Any = None

    @classmethod
    def failed(
        cls, code: str, message: str, *, retryable: bool = False, output: Any = None
    ) -> HandlerResult:
        return cls("failed", retryable, {"code": code, "message": message[:4096]}, output)

    def bounded(self) -> HandlerResult:
        """This result, or a failure saying why its output cannot be reported: the platform
        keeps at most RESULT_BYTES of compact JSON (docs/kinds.md, "Results")."""
        if self.output is None:
            return self
        try:
            size = len(
                json.dumps(
                    self.output, separators=(",", ":"), ensure_ascii=False, allow_nan=False
                ).encode()
            )
        except (TypeError, ValueError, RecursionError) as error:
            return HandlerResult.failed("result_invalid", f"the result is not JSON: {error}")
        if size > RESULT_BYTES:
            return HandlerResult.failed(
                "result_too_large",
                f"the result is {size} bytes as JSON; a result holds at most {RESULT_BYTES}",
            )
        return self

    def as_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"outcome": self.outcome, "retryable": self.retryable}
        if self.error is not None:
            message["error"] = self.error
        if self.output is not None:
            message["output"] = self.output
        return message


@dataclass
class JobContext:
    """What a handler sees of its attempt, and how it talks back."""

    job_id: str
    attempt: int
    kind: str
    payload: Any
    started_at_ms: int
    """When this attempt first started (kept across Run restarts, for resumable handlers)."""
    now_ms: Callable[[], int]
    log_line: Callable[[str, str], None]
    upload: Callable[[str | BinaryIO, str], None]
    """`upload(path, name)` queues a file for the artifacts channel (never blocks); a handler
    may hand over an open binary file instead of a path, which the uploader then closes."""
    remember_process: Callable[[int | dict[str, Any]], Awaitable[None]]
    """Journal what a handler started (a process group leader's pid, or a record that
    run/leftovers.py knows how to stop), so that a restarted Run can stop it."""
    grace_s: float = 10.0
    owner_id: str | None = None
    """Who owns the job (its server's owner), when the platform said so with the claim."""
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    percent: float | None = None
    message: str | None = None

    def report(self, percent: float | None = None, message: str | None = None) -> None:
        """Note progress; Run sends the latest with its next lease renewal."""
        if percent is not None:
            self.percent = max(0.0, min(100.0, float(percent)))
        if message is not None:
            self.message = message[:4096]

    def log(self, stream: str, text: str) -> None:
        self.log_line(stream, text)


class Handler(Protocol):
    resumable: bool
    """Whether an attempt confirmed after a Run restart may be run again from its payload."""

    async def run(self, context: JobContext) -> HandlerResult: ...


ANY_PAYLOAD: dict[str, Any] = {"type": "object"}
"""The schema of a handler that declares none: any JSON object."""


def payload_schema(handler: Handler) -> Any:
    """The handler's declared `payload_schema`, or `ANY_PAYLOAD` when it declares none."""
    return getattr(handler, "payload_schema", ANY_PAYLOAD)


def payload_checker(handler: Handler) -> jsonschema_subset.Checker:
    """The handler's declared schema, compiled (once per handler: see Agent)."""
    return jsonschema_subset.compile_schema(payload_schema(handler))


def refuse_payload(check: jsonschema_subset.Checker, payload: Any) -> HandlerResult | None:
    """`bad_payload` naming each field that does not fit (`check` is a compiled schema);
    None when it fits."""
    problems = check(payload)
    if not problems:
        return None
    return HandlerResult.failed("bad_payload", "; ".join(p.describe() for p in problems))


def advertised_kinds(handlers: dict[str, Handler]) -> dict[str, Any] | None:
    """What Run advertises at registration: each kind with its payload schema. A schema the
    platform would refuse (malformed, too large) is advertised as `ANY_PAYLOAD`, with a
    warning, so one plugin cannot keep Run from registering; past `MAX_KINDS` kinds nothing
    is advertised (the platform then checks no job at submit)."""
    if len(handlers) > kinds_domain.MAX_KINDS:
        log.warning(
            "too many handlers to advertise; jobs are checked on this host only",
            extra={"fields": {"kinds": len(handlers), "max": kinds_domain.MAX_KINDS}},
        )
        return None
    kinds: dict[str, Any] = {}
    for kind, handler in sorted(handlers.items()):
        schema = payload_schema(handler)
        try:
            kinds_domain.check_advertisement({kind: schema})
        except MoonrunError as error:
            log.warning(
                "handler payload schema not advertised",
                extra={"fields": {"kind": kind, "why": error.message}},
            )
            schema = ANY_PAYLOAD
        kinds[kind] = schema
    try:
        kinds_domain.check_advertisement(kinds)
    except MoonrunError as error:  # all of them together are too large
        log.warning(
            "handler payload schemas not advertised",
            extra={"fields": {"why": error.message}},
        )
        kinds = dict.fromkeys(kinds, ANY_PAYLOAD)
    return kinds


def load_handlers(confinement: Confinement | None = None) -> dict[str, Handler]:
    """The built-ins, then every installed plugin (a plugin may replace a built-in);
    `command` starts its processes under `confinement`."""
    from moonrun.run.handlers.command import CommandHandler
    from moonrun.run.handlers.noop import NoopHandler
    from moonrun.run.handlers.sleep import SleepHandler

    handlers: dict[str, Handler] = {
        "noop": NoopHandler(),
        "sleep": SleepHandler(),
        "command": CommandHandler(confinement),
    }
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            plugin = entry.load()
            if entry.name in handlers and type(handlers[entry.name]) is plugin:
                continue  # moonrun's own entry for a built-in: keep the one configured above
            handlers[entry.name] = plugin()
        except Exception as error:  # a broken plugin must not stop Run; its kind fails
            log.warning(
                "handler plugin failed to load",
                extra={"fields": {"kind": entry.name, "error": type(error).__name__}},
            )
    return handlers
