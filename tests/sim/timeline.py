"""A job's story as the history recorded it: what a replayed failure prints."""

from __future__ import annotations

from typing import Any

from tests.sim.history import History


def _short(value: Any, width: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def timeline(history: History, job_id: str) -> str:
    """Every committed write and deletion, answer and stretch of work about one job, in time
    order."""
    start = history.started_at
    events: list[tuple[int, int, str]] = []
    for write in history.writes:
        if write.after.id != job_id:
            continue
        b, a, cause = write.before, write.after, write.cause
        came = f"{cause.kind} from {cause.sender} via #{cause.instance}" if cause else "no call"
        was = "-" if b is None else f"{b.state.value}/{b.attempt} until {_at(b.deadline_at, start)}"
        now = f"{a.state.value}/{a.attempt} until {_at(a.deadline_at, start)} v{a.version}"
        events.append((write.at, 0, f"write   {came}: {was} -> {now}"))
    for deletion in history.deletions:
        if deletion.job.id == job_id:
            cause = deletion.cause
            came = f"{cause.kind} from {cause.sender} via #{cause.instance}" if cause else "no call"
            job = deletion.job
            events.append((deletion.at, 0, f"delete  {came}: {job.state.value}/{job.attempt}"))
    for answer in history.answers:
        cause = answer.cause
        if answer.job_id != job_id and not (answer.job_id is None and job_id in cause.entries):
            continue
        session = history.sessions.get(cause.session_id or "")
        who = f"{cause.sender} (generation {session[1]})" if session else cause.sender
        events.append(
            (
                answer.at,
                1,
                f"answer  {cause.kind} to {who} via #{cause.instance}: {_short(answer.value)}",
            )
        )
    for work in history.work:
        if work.job_id == job_id:
            events.append(
                (
                    work.start,
                    2,
                    f"work    Run {work.run} ({work.boot}) starts attempt {work.attempt}",
                )
            )
            if work.end is not None:
                events.append(
                    (
                        work.end,
                        2,
                        f"work    Run {work.run} ({work.boot}) stops attempt {work.attempt}: "
                        f"{work.why}",
                    )
                )
    lines = [f"+{at - start:>7} ms  {text}" for at, _, text in sorted(events, key=lambda e: e[:2])]
    return "\n".join([f"timeline of {job_id}:", *lines])


def _at(instant: int | None, start: int) -> str:
    return "-" if instant is None else f"+{instant - start}"
