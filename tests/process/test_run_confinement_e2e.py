"""A command's processes belong to its attempt, owners do not share a uid, nothing is left.

A real platform and a real Run (tests/support/e2e.py), as root here and in CI. Every process a job
starts is stopped with its attempt (cancel, timeout, the main process's exit), `setsid` or
not, and a job that left some says so; with `--run-as-range` each owner's commands run under
a uid of their own, so one owner's job can neither read another's working directory nor
signal its processes; a Run killed with SIGKILL (its supervisors too) has what its attempts
left stopped and removed when it starts again. Tests find a command's processes on the host
by a `sleep` duration no other process has.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from moonrun.run.cgroups import cgroup2_mount
from tests.support import needs
from tests.support.e2e import Cluster, JobView, Run, cluster
from tests.support.launcher import wait_for

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = [pytest.mark.processes, pytest.mark.alone]

GRACE_S = 2.0
"""The cancel grace the harness starts Run with."""
MARGIN_S = 15.0
"""Generous: what a cancel may take past the grace on a loaded machine (the bug took 91 s)."""
LEFT_BEHIND = "moonrun: stopped 1 process the command left behind"


def needs_root() -> None:
    needs.root("another uid per owner needs Run to run as root")


def marker() -> str:
    """A `sleep` duration no other process on this host has: how a test finds its process."""
    return f"{secrets.randbelow(50) + 50}.{secrets.randbelow(10**6):06d}"


def sleeping(duration: str) -> list[int]:
    """The live processes that are `sleep <duration>`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if argv[-2:] == [b"sleep", duration.encode()] and state != "Z":
            found.append(int(entry.name))
    return found


def processes_of(uid: int) -> list[int]:
    """Live processes with `uid` as their real, effective or saved uid."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            continue
        if uid in {int(n) for n in fields.get("Uid", "").split()[:3]}:
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def killed_at_the_end(*durations: str) -> Iterator[None]:
    """Whatever happens, no `sleep` of these durations outlives the test."""
    try:
        yield
    finally:
        for duration in durations:
            for pid in sleeping(duration):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def ended(cl: Cluster, job_id: str, *, timeout_s: float = 30.0) -> JobView:
    return cl.wait_state(job_id, "succeeded", "failed", "cancelled", timeout_s=timeout_s)


def lines(cl: Cluster, job_id: str, stream: str) -> list[str]:
    return [line["text"] for line in cl.logs(job_id) if line["stream"] == stream]


def logged(cl: Cluster, job_id: str, text: str, stream: str = "stdout") -> list[str]:
    """The job's lines of `stream`, once one of them is `text` (logs travel on their own)."""
    found: list[str] = wait_for(
        lambda: (got := lines(cl, job_id, stream)) and text in got and got,
        f"{text!r} in the {stream} log of {job_id}",
    )
    return found


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[Cluster, Run, Any]]:
    with cluster(tmp_path) as cl:
        run = cl.add_run("host-1", capacity=8)
        server = cl.create_server("web-1", run.endpoint_id)
        yield cl, run, server


# -- every process a job starts belongs to its attempt (issue 21, point 4) -------------------


def test_a_cancel_stops_a_setsid_child_of_the_command_within_the_grace(
    shared: tuple[Cluster, Run, Any],
) -> None:
    """`setsid sleep & echo started; sleep 300`, then cancel: the job ends cancelled within
    the grace and a margin (it took 91 s: Run waited for the pipes the setsid child held),
    and the setsid child is gone by then."""
    cl, _, server = shared
    left = marker()
    with killed_at_the_end(left), cl.explained():
        script = f"setsid sleep {left} & echo started; sleep 300"
        job = cl.submit(server, "command", {"argv": ["sh", "-c", script]}, max_attempts=1)
        logged(cl, job["id"], "started")
        wait_for(lambda: sleeping(left), "the setsid child to run")
        asked = time.monotonic()
        cl.api("POST", f"/api/v1/jobs/{job['id']}/cancel")
        done = ended(cl, job["id"], timeout_s=GRACE_S + MARGIN_S)
        took_s = time.monotonic() - asked
        still = sleeping(left)
    assert (done["state"], still) == ("cancelled", [])
    assert took_s < GRACE_S + MARGIN_S


def test_commands_that_exit_leaving_setsid_children_free_their_slots_and_say_so(
    tmp_path: Path,
) -> None:
    """Eight `setsid sleep 40 & exit 0` with `timeout_s: 5` on a Run of capacity 8: each job
    succeeds at once (they held 7 of 8 slots for 40 s), its stderr log says it left a process
    behind, and none of the sleeps survives; a job queued after them runs."""
    left = f"40.{secrets.randbelow(10**6):06d}"
    with killed_at_the_end(left), cluster(tmp_path) as cl:
        run = cl.add_run("host-1", capacity=8)
        server = cl.create_server("web-1", run.endpoint_id)
        payload = {"argv": ["sh", "-c", f"setsid sleep {left} & exit 0"], "timeout_s": 5}
        jobs = [cl.submit(server, "command", payload, max_attempts=1) for _ in range(8)]
        views = [ended(cl, job["id"]) for job in jobs]
        after = cl.submit(server, "noop")
        later = ended(cl, after["id"])
        said = [logged(cl, job["id"], LEFT_BEHIND, "stderr") for job in jobs]
        still = sleeping(left)
    assert [view["state"] for view in views] == ["succeeded"] * 8
    assert said == [[LEFT_BEHIND]] * 8
    assert (still, later["state"]) == ([], "succeeded")


def test_a_fully_detached_process_is_gone_once_its_job_succeeded(
    shared: tuple[Cluster, Run, Any],
) -> None:
    """A double-forked, setsid'd `sleep` with its output closed (it held no pipe, so the job
    succeeded at once and it ran on): gone by the time the job is succeeded, with the line."""
    cl, _, server = shared
    left = marker()
    with killed_at_the_end(left), cl.explained():
        script = f"(setsid sleep {left} </dev/null >/dev/null 2>&1 &); echo started"
        job = cl.submit(server, "command", {"argv": ["sh", "-c", script]}, max_attempts=1)
        done = ended(cl, job["id"])
        still = sleeping(left)
        said = logged(cl, job["id"], LEFT_BEHIND, "stderr")
    assert (done["state"], still, said) == ("succeeded", [], [LEFT_BEHIND])


# -- owners do not share a uid (point 5) -----------------------------------------------------


class Owner:
    """A user with a server of its own on the shared endpoint, speaking the user API."""

    def __init__(self, cl: Cluster, name: str, endpoint_id: str) -> None:
        created = cl.created("/api/v1/users", {"name": name, "platform_admin": False})
        body = {"name": f"{name}-server", "endpoint_id": endpoint_id}
        self.cl = cl
        self.client = httpx.Client(
            base_url=cl.platform.url,
            headers={"Authorization": f"Bearer {created['api_token']}"},
            timeout=30,
        )
        self.server_id = cl.created("/api/v1/servers", {**body, "owner_id": created["user"]["id"]})[
            "id"
        ]

    def submit(self, script: str) -> str:
        body = {"kind": "command", "payload": {"argv": ["sh", "-c", script]}, "max_attempts": 1}
        response = self.client.post(f"/api/v1/servers/{self.server_id}/jobs", json=body)
        assert response.status_code == 201, response.text
        job_id: str = response.json()["id"]
        return job_id


def test_owners_get_uids_of_their_own_and_cannot_reach_each_others_attempts(
    tmp_path: Path,
) -> None:
    """`--run-as-range`: alice's and bob's commands run under distinct uids of the range;
    bob's job cannot read the file in alice's working directory (0700, hers, under Run's
    0711 work root), cannot kill her `sleep` by its host PID, and once his job ended no
    process of his uid is left (a detached one included); once her job is cancelled, none of
    hers either, and her working directory is gone."""
    needs_root()
    first = 200_000 + secrets.randbelow(50_000) * 20
    hers, his = marker(), marker()
    with killed_at_the_end(hers, his), cluster(tmp_path) as cl:
        run = cl.add_run("shared", capacity=4, start=False)
        run.start(options=("--run-as-range", f"{first}-{first + 19}"))
        alice = Owner(cl, "alice", run.endpoint_id)
        bob = Owner(cl, "bob", run.endpoint_id)
        with cl.explained():
            her_job = alice.submit(
                f"echo secret-of-alice > secret.txt; pwd; id -u; echo ready; exec sleep {hers}"
            )
            her_lines = logged(cl, her_job, "ready")
            her_dir, her_uid = Path(her_lines[0]), int(her_lines[1])
            (her_pid,) = wait_for(lambda: sleeping(hers), "alice's sleep")
            her_dir_stat, root_mode = her_dir.stat(), stat.S_IMODE(her_dir.parent.stat().st_mode)
            his_job = bob.submit(
                f"id -u; cat {her_dir}/secret.txt; echo cat=$?; kill -9 {her_pid}; "
                f"echo kill=$?; (setsid sleep {his} </dev/null >/dev/null 2>&1 &); echo done"
            )
            his_end = ended(cl, his_job)
            his_lines = logged(cl, his_job, "done")
            his_uid = int(his_lines[0])
            his_left = processes_of(his_uid)
            hers_alive = sleeping(hers)
            cl.api("POST", f"/api/v1/jobs/{her_job}/cancel")
            her_end = ended(cl, her_job)
            her_left = processes_of(her_uid)
            her_dir_left = her_dir.exists()
        alice.client.close()
        bob.client.close()
    assert (her_uid != his_uid, {her_uid, his_uid} <= set(range(first, first + 20))) == (
        True,
        True,
    )
    assert (her_dir_stat.st_uid, stat.S_IMODE(her_dir_stat.st_mode), root_mode) == (
        her_uid,
        0o700,
        0o711,
    )
    assert his_end["state"] == "succeeded"
    assert [line for line in his_lines if "secret-of-alice" in line] == []
    assert "cat=0" not in his_lines
    assert "kill=0" not in his_lines
    assert hers_alive == [her_pid]
    assert his_left == []
    assert (her_end["state"], her_left, her_dir_left) == ("cancelled", [], False)


# -- what a SIGKILLed Run left (point 11) ----------------------------------------------------


def supervisors_of(run: Run) -> list[int]:
    """The attempt supervisors Run started (its children running run/supervisor.py)."""
    assert run.process is not None
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            argv = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if parent == run.process.pid and b"supervisor" in argv:
            found.append(int(entry.name))
    return found


def cgroup_of(pid: int) -> str:
    text = Path(f"/proc/{pid}/cgroup").read_text()
    return next(line[3:] for line in text.splitlines() if line.startswith("0::"))


def test_what_a_sigkilled_run_left_is_stopped_and_removed_when_it_starts_again(
    tmp_path: Path,
) -> None:
    """Run and its attempt's supervisor are SIGKILLed while the command runs with a setsid
    child: both of its processes live on, orphans. The next start of Run stops them, removes
    the attempt's working directory (and its cgroup, where Run made one), then retries the
    job, which succeeds on attempt 2."""
    main_sleep, child_sleep = marker(), marker()
    once = tmp_path / "first-attempt-started"
    script = (
        f'if [ -e "{once}" ]; then echo again; exit 0; fi; touch "{once}"; '
        f"(setsid sleep {child_sleep} </dev/null >/dev/null 2>&1 &); pwd; echo ready; "
        f"exec sleep {main_sleep}"
    )
    with killed_at_the_end(main_sleep, child_sleep), cluster(tmp_path) as cl:
        run = cl.add_run("host-1")
        server = cl.create_server("web-1", run.endpoint_id)
        with cl.explained():
            job = cl.submit(server, "command", {"argv": ["sh", "-c", script]}, max_attempts=3)
            workdir = Path(logged(cl, job["id"], "ready")[0])
            (main_pid,) = wait_for(lambda: sleeping(main_sleep), "the command's sleep")
            (child_pid,) = wait_for(lambda: sleeping(child_sleep), "its setsid child")
            cgroup = cgroup_of(main_pid)
            supervisors = supervisors_of(run)
            for pid in supervisors:  # frozen first, so that it cannot see Run go
                os.kill(pid, signal.SIGSTOP)
            run.kill()
            for pid in supervisors:
                os.kill(pid, signal.SIGKILL)
            orphans = sleeping(main_sleep) + sleeping(child_sleep)
            run.start()
            left = sleeping(main_sleep) + sleeping(child_sleep)
            workdir_left = workdir.exists()
            done = ended(cl, job["id"])
            events = run.events("stopped and removed what a previous Run left")
    mount = cgroup2_mount(Path("/proc/self/mountinfo").read_text())
    made_one = cgroup.rpartition("/")[2].startswith("moonrun.")
    cgroup_left = made_one and mount is not None and (Path(mount[1]) / cgroup[1:]).exists()
    assert sorted(orphans) == sorted([main_pid, child_pid])
    assert (left, workdir_left, cgroup_left) == ([], False, False)
    assert (done["state"], done["attempt"]) == ("succeeded", 2)
    assert len(events) == 1, json.dumps(events)
