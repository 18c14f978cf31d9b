"""`sleep` `{"seconds", "fail"?: "retryable"|"fatal"}`: progress every second, cancellable.

Resumable: after a Run restart it sleeps only what is left of the attempt's time.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from moonrun.run.handlers import HandlerResult, JobContext, refuse_payload
from moonrun.scheduling.jsonschema_subset import compile_schema

MAX_SECONDS = 7 * 24 * 3600
PAYLOAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "seconds": {
            "type": "number",
            "minimum": 0,
            "maximum": MAX_SECONDS,
            "default": 1,
            "description": "How long to sleep, in seconds.",
        },
        "fail": {
            "enum": ["retryable", "fatal", None],
            "description": "Fail after sleeping: retryably, or for good.",
        },
    },
}


CHECK_PAYLOAD = compile_schema(PAYLOAD_SCHEMA)


class SleepHandler:
    resumable = True
    payload_schema = PAYLOAD_SCHEMA

    async def run(self, context: JobContext) -> HandlerResult:
        if refused := refuse_payload(CHECK_PAYLOAD, context.payload):
            return refused
        payload = context.payload
        seconds = payload.get("seconds", 1)
        fail = payload.get("fail")
        deadline_ms = context.started_at_ms + round(seconds * 1000)
        while (left_ms := deadline_ms - context.now_ms()) > 0:
            done = 100.0 * (1 - left_ms / max(1.0, seconds * 1000))
            context.report(done, f"{left_ms / 1000:.1f} s left")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(context.cancelled.wait(), timeout=min(1.0, left_ms / 1000))
            if context.cancelled.is_set():
                return HandlerResult("cancelled")
        context.report(100.0, "slept")
        context.log("stdout", f"slept {seconds} s")
        if fail == "retryable":
            return HandlerResult.failed("sleep_failed", "failed as asked", retryable=True)
        if fail == "fatal":
            return HandlerResult.failed("sleep_failed", "failed as asked")
        return HandlerResult("succeeded", output={"slept_s": seconds})
