"""The jobs pages: the list (filters, pages, Cancel selected), submitting, one job."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from markupsafe import Markup

from moonrun.errors import (
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    MoonrunError,
    NotFound,
    TooLarge,
)
from moonrun.scheduling.jobs import Job, JobState
from moonrun.scheduling.records import User
from moonrun.scheduling.views import job_view, server_view
from moonrun.service.answers import CancelOutcome, JobPage
from moonrun.service.retention import job_data
from moonrun.web import logview, submitform
from moonrun.web.pages import (
    FORM_FIELDS,
    TERMINAL_STATES,
    checked_form,
    on_user_channel,
    platform_of,
    render,
    signed_in,
)
from moonrun.web.schedules import schedules_page_of

router = APIRouter(include_in_schema=False)
MAX_BULK_CANCEL = 200
"""Jobs one "Cancel selected" may name."""
DELETED: Final = "The job was deleted, with its logs and artifacts."
"""The notice after a job page's Delete (a fixed text: the query only says that it happened)."""


@dataclass(frozen=True, slots=True)
class Listing:
    """What the jobs page lists: its filters and page, as its query (or a form) gives them."""

    server_id: str | None = None
    state: str | None = None
    kind: str | None = None
    id: str | None = None
    """The start of a job id as a person typed it, with or without `job_`."""
    group: str | None = None
    """A fan-out group's id: only its jobs (`/jobs?group=grp_...`, linked from its page)."""
    cursor: str | None = None

    @classmethod
    def of(cls, values: Mapping[str, str | None]) -> Listing:
        """From query or form values; empty ones are no filter."""
        return cls(**{name: (values.get(name) or "").strip() or None for name in _LISTING})

    def query(self) -> dict[str, str]:
        return {name: value for name in _LISTING if (value := getattr(self, name))}


_LISTING: Final = ("server_id", "state", "kind", "id", "group", "cursor")

# -- the list ----------------------------------------------------------------------------------


@router.get("/jobs")
async def jobs_page(
    request: Request,
    server_id: str | None = None,
    state: str | None = None,
    kind: str | None = None,
    id: str | None = None,
    group: str | None = None,
    cursor: str | None = None,
    fragment: bool = False,
    cancelled: str | None = None,
    cancelling: str | None = None,
    ended: str | None = None,
    refused: str | None = None,
    deleted: str | None = None,
) -> Response:
    user = await signed_in(request)
    counts = CancelCounts.of(cancelled, cancelling, ended, refused)
    notice = counts.notice() or (DELETED if deleted == "1" else "")
    listing = Listing.of(
        {
            "server_id": server_id,
            "state": state,
            "kind": kind,
            "id": id,
            "group": group,
            "cursor": cursor,
        }
    )
    return await _jobs(request, user, listing, fragment=fragment, notice=notice)


async def _jobs(
    request: Request,
    user: User,
    listing: Listing,
    *,
    fragment: bool = False,
    notice: str = "",
    problem: MoonrunError | None = None,
) -> Response:
    """The jobs page (or its live fragment), with what a form did or why it did not."""
    platform = platform_of(request)
    search_error = ""
    try:
        page = await on_user_channel(
            request,
            platform.service.list_jobs,
            user,
            server_id=listing.server_id,
            state=listing.state,
            limit=25,
            cursor=listing.cursor,
            kind=listing.kind,
            id_prefix=_id_prefix(listing.id),
            group_id=listing.group,
        )
    except InvalidRequest as error:
        # A search too broad or malformed: said on the page, whose filters then start empty
        # (a refused value is never shown again: it may be a secret typed in the wrong box).
        search_error = error.message
        page = JobPage((), None)
        listing = Listing(server_id=listing.server_id)
    servers = await on_user_channel(request, platform.directory.list_servers, user)
    online = await on_user_channel(
        request, platform.service.endpoints_online, [s.endpoint_id for s in servers]
    )
    names = {server.id: server.name for server in servers}
    filters = {name: value for name, value in listing.query().items() if name != "cursor"}
    cursor = listing.cursor
    older = (
        "/jobs?" + urlencode({**filters, "cursor": page.next_cursor}) if page.next_cursor else None
    )
    service = platform.service
    context: dict[str, Any] = {
        "jobs": [
            job_view(job, logs_complete=service.logs_complete(job, None, platform.logs.complete))
            for job in page.jobs
        ],
        "server_names": names,
        "servers": [server_view(server, online[server.endpoint_id]) for server in servers],
        "states": [s.value for s in JobState],
        "filters": filters,
        "cursor": cursor or "",
        "older": older,
        "live_url": "/jobs?" + urlencode({**filters, "fragment": "1", **_cursor(cursor)}),
        "search_error": search_error,
        "notice": notice,
        "problem": problem.message if problem else "",
    }
    status = problem.status if problem else 422 if search_error else 200
    return render(request, "_jobs_table.html" if fragment else "jobs.html", status, **context)


@dataclass(frozen=True, slots=True)
class CancelCounts:
    """What "Cancel selected" did: jobs that ended cancelled at once, jobs whose Run was asked
    to stop them, jobs that had already ended (left alone), and jobs it could not cancel."""

    cancelled: int = 0
    cancelling: int = 0
    ended: int = 0
    refused: int = 0

    @classmethod
    def of(cls, *values: str | None) -> CancelCounts:
        """From the page's query (anything but a small count counts as 0)."""
        return cls(*(int(v) if v and v.isdigit() and len(v) <= 4 else 0 for v in values))

    @classmethod
    def count(cls, outcomes: Sequence[CancelOutcome | MoonrunError]) -> CancelCounts:
        """What `SchedulingService.cancel_jobs` answered, job by job: a job that had already
        ended was left alone, and one the user may not cancel (or that does not exist) is
        counted, not raised."""
        cancelled = cancelling = ended = refused = 0
        for outcome in outcomes:
            if isinstance(outcome, MoonrunError):
                refused += 1
            elif outcome.waits_on_run:
                cancelling += 1
            elif outcome.had_ended or outcome.job.state is not JobState.CANCELLED:
                ended += 1
            else:
                cancelled += 1
        return cls(cancelled, cancelling, ended, refused)

    def query(self) -> dict[str, int]:
        return {
            "cancelled": self.cancelled,
            "cancelling": self.cancelling,
            "ended": self.ended,
            "refused": self.refused,
        }

    def notice(self) -> str:
        parts = [
            _jobs_phrase(self.cancelled, "cancelled"),
            _jobs_phrase(self.cancelling, "asked to stop (cancelling)"),
            _jobs_phrase(self.ended, "had already ended", were=False),
            _jobs_phrase(self.refused, "could not be cancelled (not yours, or gone)", were=False),
        ]
        said = "; ".join(part for part in parts if part)
        return said[:1].upper() + said[1:] + "." if said else ""


def _jobs_phrase(count: int, what: str, *, were: bool = True) -> str:
    if not count:
        return ""
    verb = ("was " if count == 1 else "were ") if were else ""
    return f"{count} job{'' if count == 1 else 's'} {verb}{what}"


@router.post("/jobs/cancel")
async def cancel_jobs(request: Request) -> Response:
    """Cancel selected: each job named by a `job_id` field (at most `MAX_BULK_CANCEL`), in
    one call of the use case the API's `POST /api/v1/jobs/cancel` makes."""
    user = await signed_in(request)
    fields = await checked_form(request, max_fields=MAX_BULK_CANCEL + FORM_FIELDS)
    listing = Listing.of(fields)
    job_ids = list(dict.fromkeys(job_id for job_id in fields.every("job_id") if job_id))
    problem: MoonrunError | None = None
    if not job_ids:
        problem = InvalidRequest("select at least one job to cancel")
    elif len(job_ids) > MAX_BULK_CANCEL:
        problem = TooLarge(f"select at most {MAX_BULK_CANCEL} jobs at once")
    if problem is not None:
        return await _jobs(request, user, listing, problem=problem)
    service = platform_of(request).service
    outcomes = await on_user_channel(request, service.cancel_jobs, user, job_ids)
    query = listing.query() | CancelCounts.count(outcomes).query()
    return RedirectResponse("/jobs?" + urlencode(query), status_code=303)


def _cursor(cursor: str | None) -> dict[str, str]:
    return {"cursor": cursor} if cursor else {}


def _id_prefix(text: str | None) -> str | None:
    """What a person typed to find a job by id: its start, with or without `job_`."""
    typed = (text or "").strip()
    if not typed:
        return None
    return typed if typed.startswith("job_") else "job_" + typed


# -- submitting (routed before /jobs/{job_id}, which would take "new" for an id) ------------


@router.get("/jobs/new")
async def submit_page(
    request: Request, server_id: str | None = None, kind: str | None = None
) -> Response:
    user = await signed_in(request)
    return await _submit_form(request, user, server_id=server_id, kind=kind)


@router.post("/jobs/new")
async def submit_job(request: Request) -> Response:
    user = await signed_in(request)
    fields = await checked_form(request)
    server_id, kind = fields.get("server_id", ""), fields.get("kind", "").strip()
    text, attempts = fields.get("payload", ""), fields.get("max_attempts", "").strip()
    options = {
        name: fields.get(name, "").strip()
        for name in ("priority", "concurrency_key", "concurrency_limit")
    }
    form = {"server_id": server_id, "kind": kind, "payload": text, "max_attempts": attempts}
    try:
        payload = submitform.parse_payload(text)
        max_attempts = submitform.parse_attempts(attempts)
        job = await on_user_channel(
            request,
            platform_of(request).service.create_job,
            user,
            server_id,
            kind=kind,
            payload=payload,
            max_attempts=max_attempts,
            priority=submitform.parse_priority(options["priority"]),
            concurrency=submitform.parse_concurrency(
                options["concurrency_key"], options["concurrency_limit"]
            ),
            idempotency_key=fields.get("submit_key") or None,
        )
    except (InvalidRequest, IdempotencyConflict) as error:
        return await _submit_form(request, user, error=error, options=options, **form)
    return RedirectResponse(f"/jobs/{quote(job.id)}", status_code=303)


async def _submit_form(
    request: Request,
    user: User,
    *,
    server_id: str | None = None,
    kind: str | None = None,
    payload: str | None = None,
    max_attempts: str = "",
    options: dict[str, str] | None = None,
    error: MoonrunError | None = None,
) -> Response:
    """The submit form for one of the user's servers (the first, unless one is chosen), with
    the kinds its Run advertised; after a refused submit, what was typed and why."""
    platform = platform_of(request)
    servers = await on_user_channel(request, platform.directory.list_servers, user)
    chosen = next((s for s in servers if s.id == server_id), servers[0] if servers else None)
    if server_id and chosen is not None and chosen.id != server_id:
        raise NotFound("no such server")
    context: dict[str, Any] = {"servers": servers, "server": None, "kinds": []}
    if chosen is not None:
        online = await on_user_channel(
            request, platform.service.endpoints_online, [chosen.endpoint_id]
        )
        advertisement = await on_user_channel(
            request, platform.service.server_kinds, user, chosen.id
        )
        kinds = submitform.kinds_of(advertisement)
        chosen_kind = kind or (kinds[0]["kind"] if kinds else "")
        skeleton = next((k["skeleton"] for k in kinds if k["kind"] == chosen_kind), "{}")
        context |= {
            "server": server_view(chosen, online[chosen.endpoint_id]),
            "kinds": kinds,
            "chosen_kind": chosen_kind,
            "payload": skeleton if payload is None else payload,
            "max_attempts": max_attempts,
            "options": options or {},
            "submit_key": secrets.token_urlsafe(16),
            "error": {"code": error.code, "message": error.message} if error else None,
            "problems": [{"field": f, "message": m} for f, m in error.fields] if error else [],
        }
    status = 200 if error is None else error.status
    return render(request, "submit.html", status, **context)


# -- one job -----------------------------------------------------------------------------------


@router.get("/jobs/{job_id}")
async def job_page(request: Request, job_id: str, fragment: bool = False) -> Response:
    user = await signed_in(request)
    platform = platform_of(request)
    job = await on_user_channel(request, platform.service.get_job, user, job_id)
    complete = platform.service.logs_complete(job, None, platform.logs.complete)
    view = job_view(job, logs_complete=complete)
    attempts = await on_user_channel(request, platform.logs.attempts, job_id)
    logs_attempt = attempts[-1] if attempts else None
    page = None
    if logs_attempt is not None:
        page = await on_user_channel(
            request, platform.logs.tail, job_id, logs_attempt, logview.TAIL_LINES
        )
    lines = logview.shown_tail(page) if page else []
    server = await on_user_channel(request, platform.directory.get_server, user, job.server_id)
    artifacts = await on_user_channel(request, platform.artifacts.artifacts, job_id)
    schedule_name, schedule_gone, schedule_page = None, False, ""
    if job.schedule_id is not None:
        try:
            made_by = await on_user_channel(
                request, platform.service.schedules.get, user, job.schedule_id
            )
            schedule_name = made_by.schedule.name
            schedule_page = schedules_page_of(made_by.schedule.server_id)
        except NotFound:  # deleted since: its jobs stay
            schedule_gone = True
        except Forbidden:  # not the viewer's to manage: its id alone
            pass
    context: dict[str, Any] = {
        # On a thread (redacting and escaping up to 64 KiB is CPU work), once: not in the fragment.
        "payload_lines": [] if fragment else await on_user_channel(request, payload_lines, job),
        "artifacts": [
            {
                "attempt": a.attempt,
                "name": a.name,
                "size": a.size,
                "complete": a.complete,
                "url": f"/api/v1/jobs/{quote(job_id)}/artifacts/{a.name}?attempt={a.attempt}",
            }
            for a in artifacts
        ],
        "job": view,
        # Drawn as text inside <pre> (autoescaped): a result is whatever a handler returned.
        "result_json": None
        if view["terminal"] is None or view["terminal"]["result"] is None
        else json.dumps(view["terminal"]["result"], indent=2, ensure_ascii=False),
        "server_name": server.name,
        "schedule_name": schedule_name,
        "schedule_gone": schedule_gone,
        "schedule_page": schedule_page,
        "logs": lines,
        "logs_kept": page.kept_lines if page else 0,
        "logs_dropped": page.dropped_lines if page else 0,
        "logs_url": f"/api/v1/jobs/{quote(job_id)}/logs?attempt={logs_attempt}",
        "final": view["state"] in TERMINAL_STATES,
        "logs_attempt": logs_attempt,
        "can_cancel": view["state"] not in TERMINAL_STATES and not view["cancel"]["requested"],
        "live_url": f"/jobs/{quote(job_id)}?fragment=1",
        "rerun_nonce": secrets.token_urlsafe(8),
    }
    return render(request, "_job_detail.html" if fragment else "job.html", **context)


def payload_lines(job: Job) -> list[Markup]:
    """The job's payload as its readers see it (credential-looking members redacted), as
    pretty JSON, a line at a time, each escaped with its controls and bidi characters drawn as
    visible escapes, as log lines are (JSON escapes the C0 controls itself)."""
    shown = job_view(job, payload=True)["payload"]
    text = json.dumps(shown, indent=2, ensure_ascii=False)
    return [logview.line_html(line) for line in text.split("\n")]


@router.post("/jobs/{job_id}/rerun")
async def rerun_job(request: Request, job_id: str) -> Response:
    user = await signed_in(request)
    fields = await checked_form(request)
    service = platform_of(request).service
    key = fields.get("submit_key") or None
    job = await on_user_channel(request, service.rerun_job, user, job_id, idempotency_key=key)
    return RedirectResponse(f"/jobs/{quote(job.id)}", status_code=303)


@router.post("/jobs/{job_id}/delete")
async def delete_job(request: Request, job_id: str) -> Response:
    """Delete a finished job now, with its logs and artifacts: the use case the API's
    `DELETE /api/v1/jobs/{id}` calls."""
    user = await signed_in(request)
    await checked_form(request)
    platform = platform_of(request)
    forget = job_data(platform.logs, platform.artifacts)
    await on_user_channel(request, platform.service.delete_job, user, job_id, forget)
    return RedirectResponse("/jobs?deleted=1", status_code=303)


@router.post("/jobs/{job_id}/cancel")
async def cancel_job(request: Request, job_id: str) -> Response:
    user = await signed_in(request)
    await checked_form(request)
    await on_user_channel(request, platform_of(request).service.cancel_job, user, job_id)
    return RedirectResponse(f"/jobs/{quote(job_id)}", status_code=303)
