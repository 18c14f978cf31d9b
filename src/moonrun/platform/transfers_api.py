"""Logs and artifacts (PROTOCOL.md section 5): their own routes, channels and storage.

They check the attempt evidence read-only and never write the job record, so however slow
their storage is, job and control traffic never waits on them.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Header, Request

from moonrun.platform.http import ERROR_RESPONSES, platform_of
from moonrun.platform.logstore import LogLine
from moonrun.platform.run_api import signed_by
from moonrun.platform.schemas import LogBatchAnswer, LogBatchRequest
from moonrun.scheduling.messages import Evidence

router = APIRouter(prefix="/run/v1", tags=["run transfers"], responses=ERROR_RESPONSES)


@router.post("/logs", status_code=202, response_model=LogBatchAnswer)
async def append_logs(
    body: LogBatchRequest,
    request: Request,
    session_id: str = Depends(signed_by("session", "logs")),
) -> dict[str, Any]:
    """Store a batch of log lines, once per (job, attempt, seq)."""
    platform = platform_of(request)
    lane = platform.channels.logs
    evidence = Evidence(body.attempt, body.lease)
    await lane.run(platform.service.check_transfer, session_id, body.job_id, evidence)
    lines = [LogLine(body.seq, line.ts, line.stream, line.text) for line in body.lines]
    through = await lane.run(platform.logs.append, body.job_id, body.attempt, body.seq, lines)
    return {"accepted_through_seq": through}


@router.put(
    "/artifacts/{job_id}/{attempt}/{name}/{chunk_index}",
    status_code=202,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
        }
    },
)
async def put_artifact_chunk(
    job_id: str,
    attempt: int,
    name: str,
    chunk_index: int,
    request: Request,
    run_lease: str = Header(alias="Run-Lease"),
    run_final: str | None = Header(default=None, alias="Run-Final"),
    session_id: str = Depends(signed_by("session", "artifacts")),
) -> dict[str, Any]:
    """Store one chunk of an artifact (idempotent per chunk index); `Run-Final` ends it."""
    platform = platform_of(request)
    lane = platform.channels.artifacts
    data = await request.body()
    await lane.run(
        platform.service.check_transfer, session_id, job_id, Evidence(attempt, run_lease)
    )
    final = (run_final or "").lower() == "true"
    await lane.run(platform.artifacts.put_chunk, job_id, attempt, name, chunk_index, data, final)
    return {"chunk_index": chunk_index, "final": final}
