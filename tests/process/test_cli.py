"""The user CLI as a user runs it: `python -m moonrun ...` against a real platform and Run.

Every command is a subprocess with its own HOME and XDG_CONFIG_HOME under the test's
directory. A `Shell` keeps each command's output, so a test can check that no command but the
one that creates a token ever prints it. Waits are the CLI's own (`job wait`, `-f`) or bounded
reads of a pipe; nothing asserts on elapsed time.
"""

from __future__ import annotations

import json
import queue
import stat
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e import Cluster, Server, cluster
from tests.support.launcher import ADMIN_TOKEN, command_env, free_port, moonrun

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes

COMMAND_TIMEOUT_S = 90
READ_BOUND_S = 30


@dataclass
class Done:
    args: tuple[str, ...]
    code: int
    out: str
    err: str


@dataclass
class Shell:
    """Runs `moonrun` like a user's terminal would, in its own home, and keeps a transcript."""

    home: Path
    env: dict[str, str]
    transcript: list[Done] = field(default_factory=list)

    @property
    def config_dir(self) -> Path:
        return Path(self.env["XDG_CONFIG_HOME"]) / "moonrun"

    def __call__(self, *args: str, stdin: str = "", env: dict[str, str] | None = None) -> Done:
        finished = subprocess.run(
            moonrun(*args),
            cwd=self.home,
            env={**self.env, **(env or {})},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        done = Done(args, finished.returncode, finished.stdout, finished.stderr)
        self.transcript.append(done)
        return done

    def ok(self, *args: str, stdin: str = "") -> Done:
        done = self(*args, stdin=stdin)
        assert done.code == 0, f"moonrun {' '.join(args)}: {done.code}\n{done.out}{done.err}"
        return done

    def json(self, *args: str, stdin: str = "") -> Any:
        """The command's --json document (--json goes before a `--`, which ends options)."""
        cut = args.index("--") if "--" in args else len(args)
        return json.loads(self.ok(*args[:cut], "--json", *args[cut:], stdin=stdin).out)

    def printed(self, secret: str, *, but: tuple[Done, ...] = ()) -> list[tuple[str, ...]]:
        """The commands (other than `but`) whose stdout or stderr holds `secret`."""
        return [
            done.args
            for done in self.transcript
            if not any(done is allowed for allowed in but) and secret in done.out + done.err
        ]


def user_env(home: Path) -> dict[str, str]:
    env = command_env(ADMIN_TOKEN)
    del env["MOONRUN_BOOTSTRAP_ADMIN_TOKEN"]  # a user's shell has no platform secrets in it
    return {**env, "HOME": str(home), "XDG_CONFIG_HOME": str(home / "xdg")}


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Server]]:
    with cluster(tmp_path_factory.mktemp("cluster")) as cl:
        run = cl.add_run("cli-host", capacity=8)
        yield cl, cl.create_server("cli-server", run.endpoint_id)


@pytest.fixture
def shell(tmp_path: Path, platform: tuple[Cluster, Server]) -> Iterator[Shell]:
    """A shell logged in as the bootstrap admin (profile `default`); afterwards, no command
    of the test has printed the admin's token."""
    cl, _ = platform
    home = tmp_path / "home"
    home.mkdir()
    sh = Shell(home, user_env(home))
    sh.ok("login", "--platform", cl.platform.url, stdin=ADMIN_TOKEN + "\n")
    yield sh
    assert sh.printed(ADMIN_TOKEN) == []


@pytest.fixture
def server_id(platform: tuple[Cluster, Server]) -> str:
    return platform[1].id


def one_error_line(done: Done, code: str) -> str:
    lines = done.err.splitlines()
    assert (done.code, len(lines)) == (1, 1), done.err
    assert lines[0].startswith(f"moonrun: error: {code}: "), done.err
    return lines[0]


def test_login_saves_a_private_profile_that_whoami_uses(shell: Shell) -> None:
    """Login writes the config 0600 in a 0700 directory; whoami and logout use the profile."""
    path = shell.config_dir / "config.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(shell.config_dir.stat().st_mode) == 0o700
    me = shell.json("whoami")
    assert (me["name"], me["platform_admin"]) == ("admin", True)
    assert shell.ok("whoami").out.split()[:2] == ["id", me["id"]]
    shell.ok("logout")
    one_error_line(shell("whoami"), "unauthenticated")
    assert shell.printed(ADMIN_TOKEN) == []


def test_login_with_a_bad_token_saves_nothing(
    tmp_path: Path, platform: tuple[Cluster, Server]
) -> None:
    """A token the platform refuses is one error line, exit 1, and no profile is written."""
    sh = Shell(tmp_path, user_env(tmp_path))
    done = sh("login", "--platform", platform[0].platform.url, stdin="mra_not-a-token\n")
    one_error_line(done, "unauthenticated")
    assert not (sh.config_dir / "config.toml").exists()


def test_a_bad_token_in_the_environment_overrides_the_profile_and_is_one_line(
    shell: Shell,
) -> None:
    """MOONRUN_TOKEN beats the profile's token; the platform's refusal is one line, exit 1."""
    done = shell("job", "list", env={"MOONRUN_TOKEN": "mra_wrong"})
    one_error_line(done, "unauthenticated")
    assert done.out == ""


def test_an_unreachable_platform_is_one_line_and_exit_1(shell: Shell) -> None:
    """MOONRUN_PLATFORM beats the profile's URL; nobody listening there is one line, exit 1."""
    nobody = f"http://127.0.0.1:{free_port()}"
    done = shell("whoami", env={"MOONRUN_PLATFORM": nobody})
    assert nobody in one_error_line(done, "unreachable")
    assert "Traceback" not in done.err


def test_admin_verbs_create_and_list_endpoints_users_and_servers(shell: Shell) -> None:
    """endpoint, user and server verbs answer the API's records; tokens show only once."""
    created = shell.json("endpoint", "create", "cli-ep-json")
    endpoint = created["endpoint"]
    assert (endpoint["name"], endpoint["online"]) == ("cli-ep-json", False)
    human = shell.ok("endpoint", "create", "cli-ep-human")
    join_line = next(line for line in human.out.splitlines() if "moonrun run join" in line)
    join_token = join_line.split("--token ")[1].split()[0]
    assert join_line.strip().endswith("--data-dir /var/lib/moonrun-run")
    listed = {e["name"]: e for e in shell.json("endpoint", "list")}
    assert {"cli-ep-json", "cli-ep-human"} <= set(listed)
    assert listed["cli-ep-json"]["id"] == endpoint["id"]

    made = shell.json("user", "create", "cli-owner")
    owner, api_token = made["user"], made["api_token"]
    assert (owner["name"], owner["platform_admin"]) == ("cli-owner", False)
    admin = shell.json("user", "create", "cli-ops", "--platform-admin", "--password-stdin",
                       stdin="a long enough password\n")["user"]  # fmt: skip
    assert admin["platform_admin"] is True
    assert {"cli-owner", "cli-ops"} <= {u["name"] for u in shell.json("user", "list")}

    server = shell.json(
        "server", "create", "cli-srv", "--endpoint", endpoint["id"], "--owner", owner["id"]
    )
    assert (server["name"], server["owner_id"], server["admin_ids"]) == (
        "cli-srv",
        owner["id"],
        [],
    )
    assert server["id"] in {s["id"] for s in shell.json("server", "list")}
    assert server["id"] in shell.ok("server", "list").out
    shell.ok("server", "admin", "add", server["id"], admin["id"])
    assert shell.json("server", "show", server["id"])["admin_ids"] == [admin["id"]]
    shell.ok("server", "admin", "remove", server["id"], admin["id"])
    assert shell.json("server", "show", server["id"])["admin_ids"] == []

    taken = shell("user", "create", "cli-owner")
    one_error_line(taken, "already_exists")
    creators = tuple(d for d in shell.transcript if d.args[:2] in {("user", "create")})
    assert shell.printed(api_token, but=creators) == []
    assert shell.printed(join_token, but=(human,)) == []
    assert shell.printed(ADMIN_TOKEN) == []


def test_access_verbs_disable_rotate_set_passwords_and_drain(shell: Shell) -> None:
    """user disable/enable, user token rotate, user password and endpoint drain/undrain."""
    made = shell.json("user", "create", "cli-leaver")
    user, old_token = made["user"], made["api_token"]
    shell.ok("user", "disable", user["id"])
    refused = shell("whoami", env={"MOONRUN_TOKEN": old_token})
    shell.ok("user", "enable", user["id"])
    flags = {u["name"]: u["disabled"] for u in shell.json("user", "list")}
    rotated = shell.json("user", "token", "rotate", user["id"])
    refused_after_rotation = shell("whoami", env={"MOONRUN_TOKEN": old_token})
    me = json.loads(shell("whoami", "--json", env={"MOONRUN_TOKEN": rotated["api_token"]}).out)
    shell.ok("user", "password", user["id"], stdin="a long enough password\n")
    endpoint = shell.json("endpoint", "create", "cli-drained")["endpoint"]
    shell.ok("endpoint", "drain", endpoint["id"])
    draining = {e["id"]: e["draining"] for e in shell.json("endpoint", "list")}[endpoint["id"]]
    shell.ok("endpoint", "undrain", endpoint["id"])
    after = {e["id"]: e["draining"] for e in shell.json("endpoint", "list")}[endpoint["id"]]
    one_error_line(refused, "unauthenticated")
    one_error_line(refused_after_rotation, "unauthenticated")
    assert (flags["cli-leaver"], me["id"], draining, after) == (False, user["id"], True, False)


def test_server_remove_and_endpoint_remove(shell: Shell) -> None:
    """`server remove` then `endpoint remove`; an endpoint still in use is endpoint_in_use."""
    endpoint = shell.json("endpoint", "create", "cli-removed")["endpoint"]
    owner = shell.json("user", "create", "cli-remover")["user"]
    server = shell.json(
        "server", "create", "cli-gone", "--endpoint", endpoint["id"], "--owner", owner["id"]
    )
    in_use = shell("endpoint", "remove", endpoint["id"])
    shell.ok("server", "remove", server["id"])
    shell.ok("endpoint", "remove", endpoint["id"])
    one_error_line(in_use, "endpoint_in_use")
    assert server["id"] not in {s["id"] for s in shell.json("server", "list")}
    assert endpoint["id"] not in {e["id"] for e in shell.json("endpoint", "list")}


def test_submit_after_double_dash_runs_that_command(shell: Shell, server_id: str) -> None:
    """`job submit SERVER -- CMD ARG...` is a `command` job; show, list and logs find it."""
    job = shell.json("job", "submit", server_id, "--", "echo", "hello", "--not-an-option")
    assert (job["kind"], job["server_id"]) == ("command", server_id)
    ended = shell.json("job", "wait", job["id"])
    assert ended["state"] == "succeeded"
    assert shell.json("job", "show", job["id"])["id"] == job["id"]
    assert job["id"] in {j["id"] for j in shell.json("job", "list", "--server", server_id)}
    assert job["id"] in shell.ok("job", "list", "--state", "succeeded").out
    lines = shell.json("job", "logs", job["id"])
    assert [line["text"] for line in lines] == ["hello --not-an-option"]
    assert shell.ok("job", "logs", job["id"]).out == "hello --not-an-option\n"


def test_submit_needs_a_kind_or_a_command(shell: Shell, server_id: str) -> None:
    """Neither KIND nor `-- CMD`, or both, is bad usage: exit 2, nothing submitted."""
    assert shell("job", "submit", server_id).code == 2
    assert shell("job", "submit", server_id, "sleep", "--", "true").code == 2
    assert shell("job", "submit", server_id, "sleep", "--payload", "[1]").code == 2


@pytest.mark.parametrize(
    ("payload", "cancel", "state", "exit_code"),
    [
        ({"seconds": 0}, False, "succeeded", 0),
        ({"seconds": 0, "fail": "fatal"}, False, "failed", 3),
        ({"seconds": 600}, True, "cancelled", 4),
    ],
)
def test_job_wait_exits_with_how_the_job_ended(
    shell: Shell, server_id: str, payload: dict[str, Any], cancel: bool, state: str, exit_code: int
) -> None:
    """`job wait` exits 0 for succeeded, 3 for failed and 4 for cancelled, printing the job."""
    job = shell.json("job", "submit", server_id, "sleep", "--payload", json.dumps(payload))
    if cancel:
        assert shell.json("job", "cancel", job["id"])["id"] == job["id"]
    waited = shell("job", "wait", job["id"], "--json")
    assert (waited.code, json.loads(waited.out)["state"]) == (exit_code, state)
    assert shell("job", "wait", job["id"]).out.startswith(f"job {job['id']} {state}")


def test_job_cancel_takes_several_jobs_and_answers_each_on_its_own_line(
    shell: Shell, server_id: str
) -> None:
    """`job cancel A B C`: one line each, a refused job's on stderr, and exit 1 when any was
    refused; with --json one object each, its job or its error."""
    ids = [
        shell.json("job", "submit", server_id, "sleep", "--payload", '{"seconds": 600}')["id"]
        for _ in range(2)
    ]
    done = shell("job", "cancel", *ids, "job_doesnotexist0000")
    assert (done.code, done.err) == (
        1,
        "job job_doesnotexist0000: error: not_found: no such job\n",
    )
    lines = done.out.splitlines()
    assert [line.split()[1] for line in lines] == ids
    assert all(line.endswith((" cancelled", "; cancel requested")) for line in lines), done.out
    again = shell("job", "cancel", *ids, "--json")
    assert again.code == 0
    assert [(entry["job_id"], entry["job"]["id"]) for entry in json.loads(again.out)] == [
        (job_id, job_id) for job_id in ids
    ]


def test_job_wait_exits_5_when_its_timeout_passes_first(shell: Shell, server_id: str) -> None:
    """A job still running when `--timeout` passes: exit 5 and the job as it is."""
    job = shell.json("job", "submit", server_id, "sleep", "--payload", '{"seconds": 600}')
    waited = shell("job", "wait", job["id"], "--timeout", "0.5", "--json")
    assert waited.code == 5
    assert json.loads(waited.out)["state"] in {"queued", "accepted", "running"}
    shell.ok("job", "cancel", job["id"])


def test_submit_wait_and_follow_exit_with_the_job(shell: Shell, server_id: str) -> None:
    """`submit --wait` and `submit --follow` end with the job: 0 succeeded, 3 failed; follow
    streams the job's log."""
    ok = shell("job", "submit", server_id, "--wait", "--", "sh", "-c", "echo done")
    assert (ok.code, ok.out.splitlines()[-1].split()[2]) == (0, "succeeded")
    failed = shell("job", "submit", server_id, "--wait", "--json", "--", "sh", "-c", "exit 7")
    assert (failed.code, json.loads(failed.out)["terminal"]["error"]["code"]) == (3, "exit_status")
    followed = shell("job", "submit", server_id, "sleep", "--payload", '{"seconds": 1}', "--follow")
    assert (followed.code, followed.out) == (0, "slept 1 s\n")
    assert "succeeded" in followed.err


def test_job_logs_follow_prints_lines_while_the_job_runs(
    shell: Shell, server_id: str, tmp_path: Path
) -> None:
    """`job logs -f` prints a line the job wrote while the job still runs, then the rest, and
    ends when the job does."""
    go = tmp_path / "go"
    script = f"echo first; while [ ! -e {go} ]; do sleep 0.1; done; echo second"
    job = shell.json("job", "submit", server_id, "--", "sh", "-c", script)
    lines: queue.Queue[str] = queue.Queue()
    with subprocess.Popen(
        moonrun("job", "logs", job["id"], "-f"),
        cwd=shell.home,
        env=shell.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    ) as follower:
        output = follower.stdout
        assert output is not None
        reader = threading.Thread(target=lambda: [lines.put(ln) for ln in output], daemon=True)
        reader.start()
        try:
            assert lines.get(timeout=READ_BOUND_S) == "first\n"
            assert shell.json("job", "show", job["id"])["state"] == "running"
            go.touch()
            assert lines.get(timeout=READ_BOUND_S) == "second\n"
            assert follower.wait(timeout=READ_BOUND_S) == 0
        finally:
            follower.kill()
            reader.join(timeout=READ_BOUND_S)
    assert shell.json("job", "show", job["id"])["state"] == "succeeded"


def test_server_kinds_lists_what_the_run_runs_and_misfits_are_one_line(
    shell: Shell, server_id: str
) -> None:
    """`server kinds` names each kind's fields; a submit that does not fit is one stderr line
    with the code and the field, exit 1, and nothing queued."""
    kinds = shell.json("server", "kinds", server_id)
    table = shell.ok("server", "kinds", server_id).out
    refused = shell("job", "submit", server_id, "command", "--payload", '{"argv": "echo hi"}')
    assert sorted(kind["kind"] for kind in kinds["kinds"]) == ["command", "noop", "sleep"]
    assert "argv, artifacts, timeout_s" in table
    assert (refused.code, refused.out) == (1, "")
    expected = "moonrun: error: invalid_payload: payload.argv must be an array, not a string\n"
    assert refused.err == expected


def test_job_rerun_waits_for_the_new_job_and_list_finds_it_by_kind(
    shell: Shell, server_id: str
) -> None:
    """`job rerun --wait` queues a finished job again and exits with how the new one ended;
    `job list --kind` and `--id-prefix` find it."""
    first = shell.json("job", "submit", server_id, "--wait", "--", "echo", "again")
    rerun = shell("job", "rerun", first["id"], "--wait", "--json")
    again = json.loads(rerun.out)
    by_kind = {job["id"] for job in shell.json("job", "list", "--kind", "command")}
    by_prefix = [job["id"] for job in shell.json("job", "list", "--id-prefix", again["id"])]
    assert (rerun.code, again["state"], again["kind"]) == (0, "succeeded", "command")
    assert {first["id"], again["id"]} <= by_kind
    assert by_prefix == [again["id"]]


def test_schedule_verbs_create_list_trigger_pause_resume_and_delete(
    shell: Shell, server_id: str
) -> None:
    """`schedule create` shows the next times; `trigger` fires a job that runs; a bad cron is
    one line naming the token; pause, resume and delete answer the schedule."""
    made = shell.json(
        "schedule", "create", server_id, "--name", "nightly", "--cron", "30 2 * * *",
        "--timezone", "Europe/Berlin", "--kind", "noop",
    )  # fmt: skip
    bad = shell(
        "schedule", "create", server_id, "--name", "x", "--cron", "61 * * * *", "--kind", "noop"
    )
    listed = shell.json("schedule", "list", "--server", server_id)
    table = shell.ok("schedule", "list").out
    triggered = shell.json("schedule", "trigger", made["id"])
    ended = shell.json("job", "wait", triggered["job_id"])
    paused = shell.json("schedule", "pause", made["id"])
    resumed = shell.json("schedule", "resume", made["id"])
    shown = shell.ok("schedule", "show", made["id"]).out
    shell.ok("schedule", "delete", made["id"])
    gone = shell("schedule", "show", made["id"])

    assert len(made["next_times"]) == 5
    assert "cron minute: '61'" in one_error_line(bad, "invalid_request")
    assert [s["id"] for s in listed] == [made["id"]]
    assert "nightly" in table
    assert ended["state"] == "succeeded"
    assert ended["schedule"]["id"] == made["id"]
    assert (paused["paused"], resumed["paused"]) == (True, False)
    assert triggered["job_id"] in shown
    one_error_line(gone, "not_found")


def test_follow_off_a_terminal_says_a_failed_attempt_on_stderr_never_among_the_jobs_lines(
    shell: Shell, server_id: str
) -> None:
    """`--follow` piped: stdout holds the job's own lines only; each failed attempt and its
    retry are said on stderr."""
    payload = '{"seconds": 0.2, "fail": "retryable"}'
    followed = shell(
        "job", "submit", server_id, "--max-attempts", "2", "sleep", "--payload", payload, "--follow"
    )

    # (Whether the status poll catches the retry's wait at all depends on timing: only
    # where a note goes is asserted.)
    assert followed.code == 3, followed.err
    assert "failed" not in followed.out
    assert set(followed.out.splitlines()) == {"slept 0.2 s"}
