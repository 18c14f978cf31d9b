"""docs/guide.md runs as written: every `$` command of its console blocks, in order, in one
bash, with each command's output checked against the lines the guide shows.

Conventions of the guide, which this runner implements:
- a ```console block holds `$ command` lines (a line ending in `\\` continues on the next),
  each followed by the output it prints; `...` in an output line stands for any text, and an
  output line of just `...` for any number of lines;
- `$ export NAME=prefix_...` takes the value from the output of the last command that was not
  such a capture: the first text there that starts with `prefix_` (a token or an id:
  letters, digits, `_` and `-`);
- blank lines are not compared (a progress bar off a terminal may leave one behind);
- a command must exit 0 (the guide shows an expected failure as `cmd || echo "exit $?"`);
- port 8470 (and any other `127.0.0.1:PORT`) is replaced by a free port, and the commands run
  in a fresh directory with its own HOME, with this checkout's `moonrun` first on the PATH.
Processes the guide starts in the background are stopped when the test ends, however it ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.launcher import free_port

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide.md"
STEP_TIMEOUT_S = 60.0
"""A hang guard per command, not an assertion on time: a step normally takes well under 2 s."""
DONE = "__moonrun_guide_step_done__"
CAPTURE = re.compile(r"^export (\w+)=([\w-]*)\.\.\.$")
PORT = re.compile(r"(?<=127\.0\.0\.1:)(\d{2,5})\b")
LOG_TAIL_LINES = 30


@dataclass(frozen=True)
class Step:
    """One `$` command of the guide, with the output lines the guide shows for it."""

    line: int
    command: str
    expected: tuple[str, ...]


def guide_steps(text: str) -> list[Step]:
    """The `$` commands of the guide's ```console blocks, in order."""
    steps: list[Step] = []
    command: list[str] = []
    expected: list[str] = []
    start = 0
    inside = False

    def finish() -> None:
        if command:
            steps.append(Step(start, "\n".join(command), tuple(expected)))
        command.clear()
        expected.clear()

    for number, line in enumerate(text.splitlines(), start=1):
        if not inside:
            inside = line.strip() == "```console"
            continue
        if line.strip() == "```":
            finish()
            inside = False
        elif command and command[-1].endswith("\\") and not expected:
            command.append(line)
        elif line.startswith("$ "):
            finish()
            start = number
            command.append(line[2:])
        else:
            expected.append(line.rstrip())
    return steps


def line_pattern(expected: str) -> re.Pattern[str]:
    return re.compile("^" + ".*".join(re.escape(part) for part in expected.split("...")) + "$")


def output_matches(expected: tuple[str, ...], actual: list[str]) -> bool:
    """Whether `actual` is `expected` line for line, with `...` wildcards (a `...` line: any
    number of lines)."""
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    if head == "...":
        return any(output_matches(rest, actual[skip:]) for skip in range(len(actual) + 1))
    return (
        bool(actual)
        and line_pattern(head).match(actual[0]) is not None
        and output_matches(rest, actual[1:])
    )


def with_free_ports(steps: list[Step]) -> list[Step]:
    """The steps with every loopback port of the guide replaced by a free one."""
    ports: dict[str, str] = {}

    def replace(text: str) -> str:
        return PORT.sub(lambda found: ports.setdefault(found[1], str(free_port())), text)

    return [
        Step(step.line, replace(step.command), tuple(replace(line) for line in step.expected))
        for step in steps
    ]


class Shell:
    """One bash fed the guide's commands one at a time; each command's output in a file."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        home = directory / "home"
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MOONRUN_", "XDG_"))}
        env.update(
            HOME=str(home),
            PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
            PYTHONUNBUFFERED="1",
            COLUMNS="100",
            NO_COLOR="1",
            TERM="dumb",
        )
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=directory,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # bash and whatever it starts in the background: one group
        )
        self.count = 0

    def run(self, command: str) -> tuple[int, list[str]]:
        """Run `command` in the shell; its exit status and output lines (stdout and stderr)."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.count += 1
        output = self.directory / f".step-{self.count}.out"
        self.process.stdin.write(f"{{ {command}\n}} < /dev/null > {output} 2>&1\necho {DONE} $?\n")
        self.process.stdin.flush()
        while True:
            ready, _, _ = select.select([self.process.stdout], [], [], STEP_TIMEOUT_S)
            if not ready:
                raise AssertionError(f"no end of {command!r} after {STEP_TIMEOUT_S} s")
            line = self.process.stdout.readline()
            if not line:
                raise AssertionError(f"bash ended during {command!r}")
            if line.startswith(DONE):
                status = int(line.split()[1])
                lines = (text.rstrip() for text in output.read_text().splitlines())
                return status, [text for text in lines if text]

    def close(self) -> None:
        """Stop bash and everything the guide started in the background."""
        for signum in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
                if signum == signal.SIGTERM and not group_alive(self.process.pid):
                    break
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def shell(directory: Path) -> Iterator[Shell]:
    opened = Shell(directory)
    try:
        yield opened
    finally:
        opened.close()


def log_tails(directory: Path) -> str:
    """The last lines of every log file the guide's background processes wrote."""
    return "\n".join(
        f"--- {path.name}\n" + "\n".join(path.read_text().splitlines()[-LOG_TAIL_LINES:])
        for path in sorted(directory.glob("*.log"))
    )


def test_the_guide_runs_as_written(tmp_path: Path) -> None:
    """Every command of docs/guide.md succeeds and prints what the guide says it prints."""
    steps = with_free_ports(guide_steps(GUIDE.read_text()))
    assert len(steps) > 10
    previous: list[str] = []
    with shell(tmp_path) as bash:
        for step in steps:
            where = f"docs/guide.md:{step.line}: $ {step.command}"
            if capture := CAPTURE.match(step.command):
                name, prefix = capture.groups()
                found = re.search(re.escape(prefix) + r"[\w-]+", "\n".join(previous))
                assert found is not None, f"{where}: no {prefix}... in\n" + "\n".join(previous)
                command = f"export {name}='{found[0]}'"
            else:
                command = step.command
            status, output = bash.run(command)
            context = f"{where}\n--- output\n" + "\n".join(output) + "\n" + log_tails(tmp_path)
            assert (status, output_matches(step.expected, output)) == (0, True), context
            if not capture:
                previous = output


def test_the_runner_matches_output_with_wildcards() -> None:
    """`...` stands for any text in a line, and a line of `...` for any number of lines."""
    assert output_matches(("job job_... queued",), ["job job_x1 queued"])
    assert output_matches(("a", "...", "z"), ["a", "b", "c", "z"])
    assert output_matches(("a", "...", "z"), ["a", "z"])
    assert not output_matches(("a", "z"), ["a", "b", "z"])
    assert not output_matches(("job_...",), ["job_1", "extra"])


def test_the_runner_reads_continued_commands_and_their_output() -> None:
    """A `\\` at a command line's end continues it; the lines after it are its output."""
    text = "```console\n$ moonrun a \\\n    --b c\nout\n$ next\n```\n```sh\n$ not run\n```\n"
    assert guide_steps(text) == [
        Step(2, "moonrun a \\\n    --b c", ("out",)),
        Step(5, "next", ()),
    ]
