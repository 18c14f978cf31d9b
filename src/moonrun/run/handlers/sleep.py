"""`sleep` `{"seconds", "fail"?: "retryable"|"fatal"}`: progress every second, cancellable.

Resumable: after a Run restart it sleeps only what is left of the attempt's time.
"""

from __future__ import annotations

import asyncio
import contextlib

from moonrun.run.handlers import HandlerResult, JobContext

MAX_SECONDS = 7 * 24 * 3600


class SleepHandler:
    resumable = True

    async def run(self, context: JobContext) -> HandlerResult:
        payload = context.payload
        if not isinstance(payload, dict):
            return HandlerResult.failed("bad_payload", "sleep needs a JSON object payload")
        seconds = payload.get("seconds", 1)
        fail = payload.get("fail")
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds <= MAX_SECONDS
            or fail not in (None, "retryable", "fatal")
        ):
            return HandlerResult.failed(
                "bad_payload", "sleep needs seconds (0 to 604800) and fail: retryable|fatal"
            )
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
