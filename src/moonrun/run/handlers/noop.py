"""`noop`: succeeds at once."""

from __future__ import annotations

from moonrun.run.handlers import ANY_PAYLOAD, HandlerResult, JobContext


class NoopHandler:
    resumable = True
    payload_schema = ANY_PAYLOAD

    async def run(self, context: JobContext) -> HandlerResult:
        context.report(100.0, "done")
        return HandlerResult("succeeded", output={})
