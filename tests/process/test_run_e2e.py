"""The platform and Run as real processes: jobs end to end, restarts, reconciliation, cancel.

Black-box: `moonrun platform serve` and `moonrun run start` run as subprocesses
(tests/support/e2e.py);
the tests drive them through the user API, SIGKILL and restart them, and read or write Run's
journal file while Run is stopped. Assertions are on what the platform records (JobViews,
EndpointViews, job logs), on Run's journal and on Run's log lines, never on elapsed time.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from moonrun.run import identity
from moonrun.run.handlers.command import CONTINUED
from moonrun.run.journal import Assignment, Journal
from moonrun.scheduling.time import parse_instant
from moonrun.store import open_store
from tests.support import needs
from tests.support.e2e import Cluster, JobView, Run, Server, cluster
from tests.support.launcher import (
    ADMIN_TOKEN,
    Timings,
    command_env,
    free_port,
    moonrun,
    pid_alive,
    wait_for,
)
from tests.support.stores import StoreFactory

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes


def new_lease() -> str:
    return "mrl_" + secrets.token_urlsafe(32)


def history(view: JobView) -> list[tuple[int, str, str | None]]:
    return [(past["attempt"], past["outcome"], past["code"]) for past in view["history"]]


def last_failure(view: JobView) -> tuple[str, str | None, int] | None:
    failure = view["retry"]["last_failure"]
    return None if failure is None else (failure["reason"], failure["code"], failure["attempt"])


def ending(view: JobView) -> tuple[str, int, int | None, str | None]:
    """State, attempt, terminal attempt and terminal error code."""
    terminal = view["terminal"] or {}
    error = terminal.get("error") or {}
    return view["state"], view["attempt"], terminal.get("attempt"), error.get("code")


def write_journal(run: Run, entries: list[Assignment]) -> None:
    """Replace Run's journal on disk (Run must be stopped)."""
    assert not run.running, "write the journal only while Run is stopped"
    Journal(run.data_dir, {entry.job_id: entry for entry in entries}).rewrite()


def running_in_journal(run: Run, job_id: str) -> bool:
    """True once Run's journal holds the job's attempt as acknowledged and executing."""
    entry = run.journal().get(job_id)
    return entry is not None and entry.state == "running"


def wait_running(cl: Cluster, run: Run, job_id: str) -> None:
    wait_for(lambda: running_in_journal(run, job_id), f"job {job_id} running in Run's journal")
    cl.wait_state(job_id, "running")


def wait_ended(cl: Cluster, job_id: str) -> JobView:
    return cl.wait_state(job_id, "succeeded", "failed", "cancelled")


def run_once_then_succeed(cl: Cluster, tmp_path: Path) -> tuple[list[str], Path]:
    """argv of a command whose first attempt writes its PID and sleeps; later ones succeed."""
    pidfile = cl.pidfile("first-attempt")
    marker = tmp_path / "first-attempt-started"
    script = (
        f'if [ -e "{marker}" ]; then echo again; exit 0; fi; '
        f'touch "{marker}"; echo $$ > "{pidfile}"; exec sleep 30'
    )
    return ["sh", "-c", script], pidfile


DRAINING = "stopping: no more claims, waiting for held attempts"
"""Run's log line once a first SIGTERM started its graceful stop."""


def host_online(cl: Cluster, server: Server) -> tuple[bool, bool]:
    """(the endpoint's `online`, the server's `endpoint_online`) as the platform says now."""
    response = cl.api("GET", f"/api/v1/servers/{server.id}")
    assert response.status_code == 200, response.text
    online: bool = cl.endpoint(server.endpoint_id)["online"]
    return online, response.json()["endpoint_online"]


def one_host(cl: Cluster, **options: Any) -> tuple[Run, Server]:
    run = cl.add_run(**options)
    return run, cl.create_server("web-1", run.endpoint_id)


# -- happy paths: one platform and one Run for these tests ------------------------------------


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Server]]:
    with cluster(tmp_path_factory.mktemp("e2e-shared")) as cl:
        _, server = one_host(cl)
        yield cl, server


def test_noop_job_succeeds_on_its_first_attempt(shared: tuple[Cluster, Server]) -> None:
    """A noop job is claimed, run and reported succeeded under attempt 1."""
    cl, server = shared
    with cl.explained():
        job = cl.submit(server, "noop")
        done = wait_ended(cl, job["id"])
    succeeded = (("succeeded", 1, 1, None), None, [(1, "succeeded", None)])
    assert succeeded == (ending(done), last_failure(done), history(done))


def test_sleep_job_succeeds_and_logs_what_it_did(shared: tuple[Cluster, Server]) -> None:
    """A sleep job succeeds under attempt 1 and its log line reaches the job's logs."""
    cl, server = shared
    with cl.explained():
        job = cl.submit(server, "sleep", {"seconds": 1.5})
        done = wait_ended(cl, job["id"])
        lines = wait_for(lambda: cl.logs(job["id"]), "the sleep job's log line")
    succeeded = ("succeeded", 1, 1, None)
    assert succeeded == ending(done)
    expected_lines = [("stdout", "slept 1.5 s")]
    assert expected_lines == [(line["stream"], line["text"]) for line in lines]


def test_command_job_output_reaches_the_job_logs(shared: tuple[Cluster, Server]) -> None:
    """A command's stdout and stderr lines are shipped to GET /api/v1/jobs/{id}/logs."""
    cl, server = shared
    script = "echo first to stdout; echo to stderr >&2; echo second to stdout"
    with cl.explained():
        job = cl.submit(server, "command", {"argv": ["sh", "-c", script]})
        done = wait_ended(cl, job["id"])

        def all_lines() -> list[dict[str, Any]] | None:
            lines = cl.logs(job["id"])
            return lines if len(lines) >= 3 else None

        lines = wait_for(all_lines, "the command's three log lines")
    succeeded = ("succeeded", 1, 1, None)
    assert succeeded == ending(done)
    shipped = {(line["stream"], line["text"]) for line in lines}
    expected = {
        ("stdout", "first to stdout"),
        ("stderr", "to stderr"),
        ("stdout", "second to stdout"),
    }
    assert expected == shipped
    stdout = [line["text"] for line in lines if line["stream"] == "stdout"]
    in_order = ["first to stdout", "second to stdout"]
    assert in_order == stdout


def test_command_printing_a_3_mb_line_succeeds_and_its_logs_hold_the_line_in_pieces(
    shared: tuple[Cluster, Server],
) -> None:
    """A line far beyond any read buffer does not wedge the attempt: the job succeeds and its
    logs hold the line, split into marked pieces, then `done`."""
    cl, server = shared
    script = 'head -c 3000000 /dev/zero | tr "\\0" A; echo; echo done'
    with cl.explained():
        job = cl.submit(server, "command", {"argv": ["sh", "-c", script]})
        done = wait_ended(cl, job["id"])

        def through_done() -> list[str] | None:
            texts = [line["text"] for line in cl.logs(job["id"]) if line["stream"] == "stdout"]
            return texts if texts and texts[-1] == "done" else None

        *pieces, last = wait_for(through_done, "the command's log lines through `done`")
    assert ending(done) == ("succeeded", 1, 1, None)
    assert last == "done"
    assert [False] + [True] * (len(pieces) - 1) == [p.startswith(CONTINUED) for p in pieces]
    assert "".join(piece.removeprefix(CONTINUED) for piece in pieces) == "A" * 3_000_000


def test_command_exiting_non_zero_fails_without_retry(shared: tuple[Cluster, Server]) -> None:
    """A command that exits 3 ends failed (exit_status) after one attempt of three allowed."""
    cl, server = shared
    with cl.explained():
        job = cl.submit(server, "command", {"argv": ["sh", "-c", "exit 3"]}, max_attempts=3)
        done = wait_ended(cl, job["id"])
    failed_once = (("failed", 1, 1, "exit_status"), [(1, "failed", "exit_status")])
    assert failed_once == (ending(done), history(done))


def test_command_over_its_timeout_is_killed_and_retried(shared: tuple[Cluster, Server]) -> None:
    """A command past its timeout_s is stopped and fails retryably (code timeout), then again."""
    cl, server = shared
    with cl.explained():
        pidfile = cl.pidfile("timed-out")
        script = f'echo $$ > "{pidfile}"; exec sleep 30'
        payload = {"argv": ["sh", "-c", script], "timeout_s": 0.5}
        job = cl.submit(server, "command", payload, max_attempts=2)
        done = wait_ended(cl, job["id"])
        pid = cl.wait_pid(pidfile)
    timed_out_twice = (
        ("failed", 2, 2, "timeout"),
        [(1, "failed", "timeout"), (2, "failed", "timeout")],
        False,
    )
    assert timed_out_twice == (ending(done), history(done), pid_alive(pid))


def test_unknown_kind_fails_without_retry(shared: tuple[Cluster, Server]) -> None:
    """A kind that Run has no handler for, queued before its Run ever advertised what it runs,
    ends failed (unknown_kind) after one attempt; once it has, the kind is refused at submit."""
    cl, _ = shared
    with cl.explained():
        run = cl.add_run("host-unadvertised", start=False)
        server = cl.create_server("unadvertised-1", run.endpoint_id)
        job = cl.submit(server, "no.such-kind", {}, max_attempts=3)
        run.start()
        done = wait_ended(cl, job["id"])
        later = cl.api("POST", f"/api/v1/servers/{server.id}/jobs", {"kind": "no.such-kind"})
        run.stop()
    failed_once = (("failed", 1, 1, "unknown_kind"), [(1, "failed", "unknown_kind")])
    assert failed_once == (ending(done), history(done))
    assert (later.status_code, later.json()["error"]["code"]) == (422, "unknown_kind")


def test_a_run_advertises_its_kinds_and_misfits_are_refused_at_submit(
    shared: tuple[Cluster, Server],
) -> None:
    """A real Run advertises noop, sleep and command with their schemas; a misspelt kind is
    422 unknown_kind (with a suggestion), a bad argv 422 invalid_payload naming `argv`, and a
    job that fits still runs."""
    cl, server = shared
    with cl.explained():
        kinds = cl.api("GET", f"/api/v1/servers/{server.id}/kinds").json()
        misspelt = cl.api("POST", f"/api/v1/servers/{server.id}/jobs", {"kind": "comand"})
        bad_argv = cl.api(
            "POST",
            f"/api/v1/servers/{server.id}/jobs",
            {"kind": "command", "payload": {"argv": "echo hi"}},
        )
        fits = cl.submit(server, "command", {"argv": ["echo", "hi"]})
        done = wait_ended(cl, fits["id"])
    schemas = {kind["kind"]: kind["payload_schema"] for kind in kinds["kinds"]}
    assert (kinds["advertised"], sorted(schemas)) == (True, ["command", "noop", "sleep"])
    assert schemas["command"]["required"] == ["argv"]
    unknown = misspelt.json()["error"]
    assert (misspelt.status_code, unknown["code"]) == (422, "unknown_kind")
    assert "did you mean 'command'?" in unknown["message"]
    invalid = bad_argv.json()["error"]
    assert (bad_argv.status_code, invalid["code"]) == (422, "invalid_payload")
    assert invalid["fields"] == [{"field": "argv", "message": "must be an array, not a string"}]
    assert done["state"] == "succeeded"


def test_retryable_failure_is_retried_after_its_backoff(shared: tuple[Cluster, Server]) -> None:
    """A retryable failure waits its backoff, then runs again under a higher attempt."""
    cl, server = shared
    backoff = {"initial_s": 1, "multiplier": 2, "max_s": 1}
    with cl.explained():
        job = cl.submit(
            server, "sleep", {"seconds": 0, "fail": "retryable"}, max_attempts=2, backoff=backoff
        )
        done = wait_ended(cl, job["id"])
    both_failed = (
        ("failed", 2, 2, "sleep_failed"),
        ("failed", "sleep_failed", 2),
        [(1, "failed", "sleep_failed"), (2, "failed", "sleep_failed")],
    )
    assert both_failed == (ending(done), last_failure(done), history(done))
    first, second = done["history"]
    waited_ms = parse_instant(second["claimed_at"]) - parse_instant(first["ended_at"])
    backoff_ms = 1000
    assert waited_ms >= backoff_ms, done["history"]


def test_fatal_failure_ends_failed_after_one_attempt(shared: tuple[Cluster, Server]) -> None:
    """A fatal (non-retryable) failure ends the job failed at once, attempts left or not."""
    cl, server = shared
    with cl.explained():
        job = cl.submit(server, "sleep", {"seconds": 0, "fail": "fatal"}, max_attempts=3)
        done = wait_ended(cl, job["id"])
    failed_once = (
        ("failed", 1, 1, "sleep_failed"),
        ("failed", "sleep_failed", 1),
        [(1, "failed", "sleep_failed")],
    )
    assert failed_once == (ending(done), last_failure(done), history(done))


def test_jobs_succeed_over_each_durable_store(
    durable_factory: StoreFactory, tmp_path: Path
) -> None:
    """A noop and a command job succeed with the platform on FileStore and on MariaDB."""
    store = durable_factory.open()
    store.close()
    with cluster(tmp_path, store_url=durable_factory.url()) as cl:
        _, server = one_host(cl)
        noop = cl.submit(server, "noop")
        command = cl.submit(server, "command", {"argv": ["true"]})
        views = [wait_ended(cl, noop["id"]), wait_ended(cl, command["id"])]
    both_succeeded = [("succeeded", 1, 1, None)] * 2
    assert both_succeeded == [ending(view) for view in views]


# -- Run restarts ----------------------------------------------------------------------------


def test_run_restart_resumes_confirmed_attempt(tmp_path: Path) -> None:
    """A SIGKILLed Run's sleep is confirmed and rebound before any claim; same attempt ends it."""
    with cluster(tmp_path) as cl:
        run, server = one_host(cl)
        sleeper = cl.submit(server, "sleep", {"seconds": 4})
        wait_running(cl, run, sleeper["id"])
        first_generation = cl.endpoint(run.endpoint_id)["generation"]

        run.kill()
        # Queued while Run is down: the restarted Run may claim it only after reconciling.
        queued = cl.submit(server, "noop")
        second_generation = run.start()

        confirmed = cl.wait_job(
            sleeper["id"],
            lambda view: view["reconcile"]["outcome"] == "confirmed",
            "the restarted Run's reconcile confirming it",
        )
        claimed_later = wait_ended(cl, queued["id"])
        done = wait_ended(cl, sleeper["id"])

        cl.platform.kill()
        store = open_store(cl.platform.store_url)
        try:
            stored = store.get_job(sleeper["id"])
        finally:
            store.close()

    assert second_generation > first_generation
    same_attempt = (("succeeded", 1, 1, None), None, [(1, "succeeded", None)], "confirmed")
    assert same_attempt == (
        ending(done),
        last_failure(done),
        history(done),
        done["reconcile"]["outcome"],
    )
    reconciled_at = parse_instant(confirmed["reconcile"]["at"])
    (queued_attempt,) = claimed_later["history"]
    assert parse_instant(queued_attempt["claimed_at"]) >= reconciled_at, (
        confirmed["reconcile"],
        claimed_later["history"],
    )
    assert stored is not None
    assert stored.session_generation is not None
    assert stored.session_generation >= second_generation


def test_run_restart_retries_a_command_it_cannot_resume(tmp_path: Path) -> None:
    """A command whose Run was SIGKILLed is reported run_restarted (retryable), then attempt 2."""
    with cluster(tmp_path) as cl:
        run, server = one_host(cl)
        argv, pidfile = run_once_then_succeed(cl, tmp_path)
        job = cl.submit(server, "command", {"argv": argv}, max_attempts=3)
        wait_running(cl, run, job["id"])
        cl.wait_pid(pidfile)

        run.kill()
        run.start()
        done = wait_ended(cl, job["id"])
        accepted = run.events("registered and reconciled")

    retried = (
        ("succeeded", 2, 2, None),
        ("failed", "run_restarted", 1),
        [(1, "failed", "run_restarted"), (2, "succeeded", None)],
    )
    assert retried == (ending(done), last_failure(done), history(done))
    after_restart = accepted[-1]
    confirmed_then_reported = (1, 0, 0)
    assert confirmed_then_reported == (
        after_restart["confirmed"],
        after_restart["discarded"],
        after_restart["lost"],
    )


def test_run_restart_stops_the_command_of_the_attempt_it_gives_up(tmp_path: Path) -> None:
    """Once a restarted Run reports a command run_restarted, that attempt's process is gone."""
    with cluster(tmp_path) as cl:
        run, server = one_host(cl)
        argv, pidfile = run_once_then_succeed(cl, tmp_path)
        job = cl.submit(server, "command", {"argv": argv}, max_attempts=3)
        wait_running(cl, run, job["id"])
        pid = cl.wait_pid(pidfile)

        run.kill()
        run.start()
        done = wait_ended(cl, job["id"])
        first_attempt_alive = pid_alive(pid)

    retried = (("succeeded", 2, 2, None), ("failed", "run_restarted", 1))
    assert retried == (ending(done), last_failure(done))
    assert not first_attempt_alive, (
        f"attempt 1's process {pid} still runs after Run reported it run_restarted and the "
        "job was run again as attempt 2"
    )


def test_run_stops_at_once_on_a_second_sigterm_and_restart_retries_its_command(
    tmp_path: Path,
) -> None:
    """A second SIGTERM stops Run and its command's process without waiting for the grace;
    the restarted Run reports run_restarted."""
    with cluster(tmp_path) as cl:
        run, server = one_host(cl)
        argv, pidfile = run_once_then_succeed(cl, tmp_path)
        job = cl.submit(server, "command", {"argv": argv}, max_attempts=3)
        wait_running(cl, run, job["id"])
        pid = cl.wait_pid(pidfile)

        run.terminate()
        wait_for(lambda: run.events(DRAINING), "Run to start its graceful stop")
        exit_code = run.stop()
        first_attempt_alive = pid_alive(pid)
        run.start()
        done = wait_ended(cl, job["id"])

    stopped_cleanly = (0, False)
    assert stopped_cleanly == (exit_code, first_attempt_alive)
    retried = (("succeeded", 2, 2, None), ("failed", "run_restarted", 1))
    assert retried == (ending(done), last_failure(done))


def test_sigterm_lets_a_running_command_finish_and_shows_the_host_offline(
    tmp_path: Path,
) -> None:
    """On SIGTERM Run claims nothing more, lets its 5 s command succeed on attempt 1, delivers
    the result and ends its session: endpoint and server say offline as soon as Run exits."""
    with cluster(tmp_path) as cl:
        run, server = one_host(cl)
        pidfile = cl.pidfile("graceful")
        script = f'echo $$ > "{pidfile}"; sleep 5; echo finished'
        job = cl.submit(server, "command", {"argv": ["sh", "-c", script]}, max_attempts=3)
        wait_running(cl, run, job["id"])
        cl.wait_pid(pidfile)
        online_before = host_online(cl, server)

        exit_code = run.stop()
        online_after = host_online(cl, server)
        done = cl.job(job["id"])

    assert online_before == (True, True)
    assert (exit_code, online_after) == (0, (False, False))
    assert ending(done) == ("succeeded", 1, 1, None)


def test_an_unknown_query_filter_is_refused_by_the_platform(
    shared: tuple[Cluster, Server],
) -> None:
    """`GET /api/v1/jobs?colour=blue` is 422 invalid_request naming `colour`, not every job."""
    cl, _ = shared

    response = cl.api("GET", "/api/v1/jobs?colour=blue")

    error = response.json()["error"]
    assert (response.status_code, error["code"]) == (422, "invalid_request")
    assert "query.colour" in error["message"]


def test_run_restart_delivers_a_journaled_result(tmp_path: Path) -> None:
    """A result journaled before a SIGKILL is delivered after the restart, not run again."""
    with cluster(tmp_path) as cl:
        run, server = one_host(cl)
        job = cl.submit(server, "sleep", {"seconds": 60}, max_attempts=3)
        wait_running(cl, run, job["id"])

        run.kill()
        entry = run.journal()[job["id"]]
        entry.state = "finished"
        entry.result = {
            "outcome": "failed",
            "retryable": False,
            "error": {"code": "journaled_result", "message": "reported after a restart"},
        }
        write_journal(run, [entry])
        run.start()
        done = wait_ended(cl, job["id"])
        # The platform ends the job before its answer reaches Run, which forgets the entry
        # only then: wait for that rather than read the journal in between.
        wait_for(lambda: job["id"] not in run.journal(), "Run to forget the delivered result")
        journal_after = run.journal()

    delivered = (
        ("failed", 1, 1, "journaled_result"),
        [(1, "failed", "journaled_result")],
        "confirmed",
        {},
    )
    assert delivered == (
        ending(done),
        history(done),
        done["reconcile"]["outcome"],
        journal_after,
    )


def test_run_reports_stale_journal_entry(tmp_path: Path) -> None:
    """Terminal, unknown, other-endpoint, wrong-attempt and wrong-lease entries are discarded."""
    with cluster(tmp_path) as cl:
        run, server = one_host(cl)
        other_endpoint, _ = cl.create_endpoint("host-2")
        other_server = cl.create_server("web-2", other_endpoint)

        terminal = cl.submit(server, "noop")
        wait_ended(cl, terminal["id"])
        later = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        not_yet = cl.submit(server, "noop", not_before=later)
        hour = {"initial_s": 3600, "max_s": 3600}
        waiting = cl.submit(
            server, "sleep", {"seconds": 0, "fail": "retryable"}, max_attempts=2, backoff=hour
        )
        cl.wait_state(waiting["id"], "retrying")
        elsewhere = cl.submit(other_server, "noop")
        unknown_id = "job_" + secrets.token_hex(12)

        clean_exit = 0
        assert clean_exit == run.stop(), "Run did not stop cleanly on SIGTERM"
        failed_result = {"outcome": "failed", "retryable": True, "error": {"code": "x"}}
        stale = [
            Assignment(
                terminal["id"],
                1,
                new_lease(),
                "noop",
                {},
                server.id,
                "finished",
                result=failed_result,
            ),
            Assignment(unknown_id, 1, new_lease(), "noop", {}, server.id, state="running"),
            Assignment(elsewhere["id"], 1, new_lease(), "noop", {}, other_server.id),
            Assignment(not_yet["id"], 1, new_lease(), "noop", {}, server.id, state="running"),
            Assignment(
                waiting["id"], 1, new_lease(), "sleep", {"seconds": 0}, server.id, state="running"
            ),
        ]
        write_journal(run, stale)
        real = [terminal["id"], not_yet["id"], waiting["id"], elsewhere["id"]]
        before = {job_id: cl.job(job_id) for job_id in real}
        reconciles = len(run.events("registered and reconciled"))

        run.start()
        wait_for(lambda: not run.journal(), "Run's journal to be emptied")
        # Run claims after it reconciles: once a new job succeeded, Run has claimed since.
        sentinel = cl.submit(server, "noop")
        succeeded = "succeeded"
        assert succeeded == wait_ended(cl, sentinel["id"])["state"]
        after = {job_id: cl.job(job_id) for job_id in real}
        report = run.events("registered and reconciled")[reconciles]
        dropped = {event["job_id"] for event in run.events("journal entry dropped")}

    all_discarded = (0, 5, 0)
    assert all_discarded == (report["confirmed"], report["discarded"], report["lost"])
    assert {entry.job_id for entry in stale} == dropped
    assert before == after
    unchanged = {
        terminal["id"]: "succeeded",
        not_yet["id"]: "queued",
        waiting["id"]: "retrying",
        elsewhere["id"]: "queued",
    }
    assert unchanged == {job_id: view["state"] for job_id, view in after.items()}


def test_cancel_while_run_is_down_is_honoured_after_restart(tmp_path: Path) -> None:
    """A cancel asked while Run is down reaches the resumed attempt, which ends cancelled."""
    with cluster(tmp_path) as cl:
        run, server = one_host(cl)
        job = cl.submit(server, "sleep", {"seconds": 60})
        wait_running(cl, run, job["id"])

        run.kill()
        asked = cl.api("POST", f"/api/v1/jobs/{job['id']}/cancel")
        run.start()
        done = wait_ended(cl, job["id"])

    waits_on_run = 202
    assert waits_on_run == asked.status_code, asked.text
    cancelled = (("cancelled", 1, 1, None), "cancelled", [(1, "cancelled", None)])
    assert cancelled == (ending(done), done["cancel"]["result"], history(done))


# -- platform restarts and lost work -----------------------------------------------------------


def test_platform_restart_accepts_reconciliation(tmp_path: Path) -> None:
    """After a platform SIGKILL and restart, Run re-registers, is confirmed, and the sleep ends."""
    # A longer lease: Run must not self-fence while the platform is down and starting again.
    with cluster(tmp_path, timings=Timings(lease_ttl_s=12)) as cl:
        run, server = one_host(cl)
        job = cl.submit(server, "sleep", {"seconds": 8})
        wait_running(cl, run, job["id"])
        generation = cl.endpoint(run.endpoint_id)["generation"]

        noticed = len(run.events("heartbeat failed"))
        cl.platform.kill()
        # Start again once Run has seen the outage (a failed heartbeat): a restart that fits
        # between two heartbeats goes unnoticed, and Run then keeps its persisted session.
        wait_for(
            lambda: len(run.events("heartbeat failed")) > noticed,
            "Run to notice that the platform is down",
        )
        cl.platform.start()
        confirmed = cl.wait_job(
            job["id"],
            lambda view: view["reconcile"]["outcome"] == "confirmed",
            "Run's reconcile after the platform restart",
        )
        registered_again = cl.endpoint(run.endpoint_id)["generation"]
        done = wait_ended(cl, job["id"])

    assert registered_again > generation
    still_running = ("running", 1)
    assert still_running == (confirmed["state"], confirmed["attempt"])
    same_attempt = (("succeeded", 1, 1, None), None, [(1, "succeeded", None)])
    assert same_attempt == (ending(done), last_failure(done), history(done))


def test_platform_active_work_is_missing_from_run(tmp_path: Path) -> None:
    """A running job missing from a restarted Run's journal is recorded lost and retried."""
    with cluster(tmp_path) as cl:
        run, server = one_host(cl)
        backoff = {"initial_s": 2, "max_s": 2}
        job = cl.submit(server, "sleep", {"seconds": 2}, backoff=backoff)
        wait_running(cl, run, job["id"])

        run.kill()
        Journal(run.data_dir).path.unlink()
        kept = sorted(path.name for path in run.data_dir.iterdir())
        run.start()
        lost = cl.wait_job(
            job["id"],
            lambda view: view["reconcile"]["outcome"] == "lost",
            "the platform to record the attempt lost",
        )
        done = wait_ended(cl, job["id"])

    identity_kept = ["endpoint.json", "identity.key", "run.lock"]
    assert identity_kept == kept
    recorded_lost = ("retrying", 1, ("reconcile_lost", "reconcile_lost", 1))
    assert recorded_lost == (lost["state"], lost["attempt"], last_failure(lost))
    retried = (
        ("succeeded", 2, 2, None),
        ("reconcile_lost", "reconcile_lost", 1),
        [(1, "reconcile_lost", "reconcile_lost"), (2, "succeeded", None)],
    )
    assert retried == (ending(done), last_failure(done), history(done))


# -- cancel --------------------------------------------------------------------------------------


def test_cancel_after_claim_stops_a_running_command(tmp_path: Path) -> None:
    """Cancelling a running command kills its process and ends the job cancelled, idempotently."""
    with cluster(tmp_path) as cl:
        run, server = one_host(cl)
        pidfile = cl.pidfile("command")
        script = f'echo $$ > "{pidfile}"; exec sleep 60'
        job = cl.submit(server, "command", {"argv": ["sh", "-c", script]})
        wait_running(cl, run, job["id"])
        pid = cl.wait_pid(pidfile)

        first = cl.api("POST", f"/api/v1/jobs/{job['id']}/cancel")
        repeated_early = cl.api("POST", f"/api/v1/jobs/{job['id']}/cancel")
        done = wait_ended(cl, job["id"])

        wait_for(lambda: not pid_alive(pid), f"the command's process {pid} to be gone")
        repeated_late = cl.api("POST", f"/api/v1/jobs/{job['id']}/cancel")

    waits_on_run = (202, "running")
    assert waits_on_run == (first.status_code, first.json()["state"]), first.text
    intent = first.json()["cancel"]
    unresolved = (True, None)
    assert unresolved == (intent["requested"], intent["result"])
    assert intent["requested_at"] == repeated_early.json()["cancel"]["requested_at"]
    cancelled = ("cancelled", 1, 1, None)
    assert cancelled == ending(done)
    resolved = done["cancel"]
    assert (intent["requested_at"], "cancelled") == (resolved["requested_at"], resolved["result"])
    # The repeated cancel answers the ended job unchanged; only `logs_complete` may have
    # turned true since (Run ships the attempt's last lines after its end).
    late = {**repeated_late.json(), "logs_complete": done["logs_complete"]}
    assert (200, done) == (repeated_late.status_code, late)


def run_join(
    cl: Any, platform: str, token: str, data_dir: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        moonrun(
            "run", "join", "--platform", platform, "--token", token, "--data-dir", str(data_dir)
        ),
        cwd=cl.workdir,
        env=command_env(ADMIN_TOKEN),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_join_explains_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    """A used token, a bad URL, a missing data dir and an unreachable platform: one line each,
    exit 1, and a failed join leaves no identity behind."""
    with cluster(tmp_path) as cl:
        _, token = cl.create_endpoint("host-2")
        burnt = tmp_path / "burnt"
        burnt.mkdir()
        assert run_join(cl, cl.platform.url, token, burnt).returncode == 0
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        cases = {
            "used token": (cl.platform.url, token, fresh),
            "bad url": ("ftp://example.invalid", token, fresh),
            "missing dir": (cl.platform.url, token, tmp_path / "missing"),
            "unreachable": (f"http://127.0.0.1:{free_port()}", token, fresh),
        }
        outcomes = {case: run_join(cl, *arguments) for case, arguments in cases.items()}
    expected = {
        "used token": (
            "moonrun: error: join_token_invalid: The join token is unknown, expired or already "
            "used."
        ),
        "bad url": "moonrun: error: invalid_request: --platform must be an http:// or https:// URL",
        "missing dir": "moonrun: error: data_dir: data directory",
        "unreachable": "moonrun: error: unreachable: cannot reach the platform at http://127.0.0.1:",
    }
    found = {
        case: (
            result.returncode,
            len(result.stderr.splitlines()),
            result.stderr.startswith(expected[case]),
        )
        for case, result in outcomes.items()
    }
    assert dict.fromkeys(cases, (1, 1, True)) == found
    assert list(fresh.iterdir()) == []


# -- what a command job can reach -----------------------------------------------------------------

ALLOWED_ENVIRONMENT = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR"}


def stdout_and_stderr(cl: Cluster, job_id: str, through: str) -> tuple[list[str], list[str]]:
    """A job's stdout and stderr lines, once its stdout holds `through`."""

    def shipped() -> list[dict[str, Any]] | None:
        lines = cl.logs(job_id)
        return lines if any(line["text"] == through for line in lines) else None

    lines = wait_for(shipped, f"job {job_id}'s output through {through!r}")
    return (
        [line["text"] for line in lines if line["stream"] == "stdout"],
        [line["text"] for line in lines if line["stream"] == "stderr"],
    )


@pytest.fixture
def open_workdir() -> Iterator[Path]:
    """A directory everyone may traverse (pytest's own are private to their user), so that
    only the data directory's own modes keep another user out of it."""
    path = Path(tempfile.mkdtemp(prefix="moonrun-e2e-"))
    path.chmod(0o755)
    old_umask = os.umask(0o022)
    try:
        yield path
    finally:
        os.umask(old_umask)
        shutil.rmtree(path, ignore_errors=True)


def test_a_command_run_as_nobody_cannot_read_runs_data_directory(open_workdir: Path) -> None:
    """`--run-as nobody`: the command runs with nobody's uid, in a directory of its own that
    is gone afterwards, and cannot list Run's data directory (0700 whatever the umask) nor
    read its identity key or journal (0600); Run does not warn about root."""
    needs.root("--run-as another user needs Run to run as root")
    nobody = pwd.getpwnam("nobody").pw_uid
    with cluster(open_workdir) as cl:
        run = cl.add_run(start=False)
        run.start(options=("--run-as", "nobody"))
        server = cl.create_server("web-1", run.endpoint_id)
        data = run.data_dir
        script = (
            f"id -u; pwd; ls {data}; cat {data / 'identity.key'}; cat {data / 'journal.log'}; "
            "echo finished"
        )
        job = cl.submit(server, "command", {"argv": ["sh", "-c", script]})
        done = wait_ended(cl, job["id"])
        stdout, stderr = stdout_and_stderr(cl, job["id"], "finished")
        modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in data.iterdir()}
        root_warnings = [e for e in run.events() if e["msg"].startswith("commands run as root")]
    assert ending(done) == ("succeeded", 1, 1, None)
    assert str(nobody) == stdout[0]
    workdir = Path(stdout[1])
    assert (workdir.name.startswith(f"moonrun-{job['id']}-1-"), workdir.exists()) == (True, False)
    assert ["Permission denied" in line for line in stderr] == [True, True, True]
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert dict.fromkeys(modes, 0o600) == modes
    assert {"identity.key", "endpoint.json", "journal.log", "run.lock"} <= set(modes)
    assert root_warnings == []


def test_a_command_sees_only_the_allow_listed_part_of_runs_environment(tmp_path: Path) -> None:
    """Secrets exported to Run (a MOONRUN_* token, a cloud key) never reach a command: `env`
    shows only PATH, HOME, USER, LOGNAME and what Run had of LANG, LC_*, TZ, TMPDIR."""
    secrets_of_run = {
        "MOONRUN_SECRET_TOKEN": "mrs-not-for-commands",
        "AWS_SECRET_ACCESS_KEY": "aws-not-for-commands",
        "LANG": "C.UTF-8",
    }
    with cluster(tmp_path) as cl:
        run = cl.add_run(start=False)
        run.start(extra_env=secrets_of_run)
        server = cl.create_server("web-1", run.endpoint_id)
        job = cl.submit(server, "command", {"argv": ["sh", "-c", "env; echo finished"]})
        done = wait_ended(cl, job["id"])
        stdout, _ = stdout_and_stderr(cl, job["id"], "finished")
    names = {line.partition("=")[0] for line in stdout[:-1]}
    assert ending(done) == ("succeeded", 1, 1, None)
    assert set() == {name for name in names if name not in ALLOWED_ENVIRONMENT | {"PWD"}}
    assert {"PATH", "HOME", "USER", "LOGNAME", "LANG"} <= names
    assert [line for line in stdout if "not-for-commands" in line] == []


def test_run_warns_loudly_at_start_when_commands_would_run_as_root(tmp_path: Path) -> None:
    """Started as root without --run-as: one line on stderr and a warning in the JSON log
    that commands run as root, with the advice to use --run-as (as another user: none)."""
    with cluster(tmp_path) as cl:
        run = cl.add_run()
        warnings = [e for e in run.events() if e["msg"].startswith("commands run as root")]
        output = run.log.read_text()
    as_root = os.geteuid() == 0
    assert (as_root, as_root) == (
        len(warnings) == 1,
        "moonrun: warning: commands run as root" in output,
    )
    assert [True] * len(warnings) == ["--run-as USER" in e["msg"] for e in warnings]


def test_a_commands_artifacts_arrive_from_its_working_directory_within_runs_cap(
    tmp_path: Path,
) -> None:
    """`--max-artifact-bytes 4096`: a relative artifact in the working directory is stored by
    the platform; one over the cap and a symlink to Run's identity key are not, and the job's
    stderr log says why; the job still succeeds."""
    with cluster(tmp_path) as cl:
        run = cl.add_run(start=False)
        run.start(options=("--max-artifact-bytes", "4096"))
        server = cl.create_server("web-1", run.endpoint_id)
        script = (
            f"echo done > result.txt; truncate -s 1M big.bin; ln -s {run.data_dir}/identity.key"
            " key; echo finished"
        )
        artifacts = [{"path": name, "name": name} for name in ("result.txt", "big.bin", "key")]
        job = cl.submit(server, "command", {"argv": ["sh", "-c", script], "artifacts": artifacts})
        done = wait_ended(cl, job["id"])
        stored = tmp_path / "platform-data" / "artifacts" / job["id"] / "1"
        wait_for(lambda: (stored / "result.txt" / "final").exists(), "result.txt to be stored")

        def refusals() -> list[str] | None:
            lines = [line["text"] for line in cl.logs(job["id"]) if line["stream"] == "stderr"]
            return lines if len(lines) == 2 else None

        refused = wait_for(refusals, "two artifact refusals in the job's logs")
    assert ending(done) == ("succeeded", 1, 1, None)
    assert (stored / "result.txt" / "000000.chunk").read_bytes() == b"done\n"
    # The store's own bookkeeping (`.held`, the attempt's byte count) aside, only result.txt.
    assert sorted(p.name for p in stored.iterdir() if not p.name.startswith(".")) == ["result.txt"]
    assert sorted(refused) == [
        "artifact big.bin not uploaded: 1048576 bytes is over the 4096-byte cap",
        "artifact key not uploaded: a symbolic link",
    ]


def test_a_drained_host_finishes_its_work_then_its_server_and_endpoint_are_removed(
    tmp_path: Path,
) -> None:
    """Drain a host while a command runs: the command succeeds on attempt 1, a job queued
    meanwhile is not claimed; the server cannot go while that job waits (409 server_busy),
    can once it is cancelled; then the endpoint goes, and its Run, refused as unknown, keeps
    running and says so in its log."""
    with cluster(tmp_path) as cl:
        run, server = one_host(cl)
        with cl.explained():
            running = cl.submit(server, "command", {"argv": ["sh", "-c", "sleep 2; echo done"]})
            cl.wait_state(running["id"], "running")
            drained = cl.api("POST", f"/api/v1/endpoints/{server.endpoint_id}/drain").json()
            waiting = cl.submit(server, "noop")
            done = wait_ended(cl, running["id"])
            still = cl.job(waiting["id"])["state"]
            busy = cl.api("DELETE", f"/api/v1/servers/{server.id}")
            cl.api("POST", f"/api/v1/jobs/{waiting['id']}/cancel")
            removed_server = cl.api("DELETE", f"/api/v1/servers/{server.id}")
            removed_endpoint = cl.api("DELETE", f"/api/v1/endpoints/{server.endpoint_id}")
            listed = [e["id"] for e in cl.api("GET", "/api/v1/endpoints").json()["endpoints"]]

            def refused() -> list[dict[str, Any]] | None:
                found = [
                    event
                    for event in run.events("register and reconcile failed; retrying")
                    if event.get("code") == "signature_invalid"
                ]
                return found or None

            refusals = wait_for(refused, "Run refused as an unknown endpoint")
            run.check_alive()
    assert drained["draining"] is True
    assert ending(done) == ("succeeded", 1, 1, None)
    assert still == "queued"
    assert (busy.status_code, busy.json()["error"]["code"]) == (409, "server_busy")
    assert (removed_server.status_code, removed_endpoint.status_code) == (200, 200)
    assert server.endpoint_id not in listed
    assert "unknown endpoint" in refusals[0]["error"]


def test_a_second_run_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    """Two Runs on one journal would corrupt it: the second stops with one clear line."""
    identity.join_key(tmp_path)
    identity.save_endpoint(tmp_path, "ep_1", "http://127.0.0.1:9")
    command = moonrun(
        "run", "start", "--platform", "http://127.0.0.1:9", "--data-dir", str(tmp_path)
    )
    env = command_env()
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (tmp_path / identity.LOCK_FILE).exists():
            time.sleep(0.05)
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    finally:
        first.terminate()
        first.wait(timeout=30)
    assert (1, [f"moonrun: error: data_dir: another Run is already using {tmp_path}"]) == (
        second.returncode,
        second.stderr.splitlines(),
    )
