"""The supervisor of one `command` attempt: every process the command starts belongs to it.

Run starts one per attempt with `python -I -S` (`command_line`; stdlib only: it starts in
about 30 ms), as Run's own user, in a session of its own, with an empty environment. Its stdout
and stderr are Run's pipes for the command's output, its stdin Run's control pipe, and one
more descriptor its status pipe. It reads its orders as one JSON line on stdin, then:

1. joins the attempt's cgroup when Run made one (`cgroup`), so that whatever happens below,
   Run can still kill everything at once (`cgroup.kill`);
2. becomes a child subreaper (`PR_SET_CHILD_SUBREAPER`): whatever the command leaves behind
   (a double fork, `setsid`) is re-parented to this process, never to init, so that it can be
   found by walking this process's descendants;
3. with `namespaces`, enters a new PID and mount namespace: it forks, and its child, PID 1
   there, goes on as the supervisor, with a private `/tmp`, `/var/tmp` and `/dev/shm` and a
   `/proc` that shows only the attempt's processes (the outer process only waits for it);
4. starts the command (`subprocess`, no `preexec_fn`: this process has no other thread) in a
   session of its own, under the command user's uid, gid and groups, stdin `/dev/null`;
5. waits. When the command's main process exits, when Run writes `stop` or closes stdin (Run
   is gone), or on SIGTERM, it stops every descendant: SIGTERM, then SIGKILL once the grace
   is over, again and again until none is left, reaping each (on a stop, what is left once
   the main process has exited gets one more SIGTERM of its own: `_tell_again`);
6. reports on the status pipe, one JSON line each: `{"started": pid, "ticks": t}` (the
   command's pid and start time, as seen from the host unless in a PID namespace),
   `{"exec_failed": why}`, `{"setup_failed": why}`, and last `{"ended": returncode,
   "stopped": n, "requested": bool}`: the main process's status (negative: killed by that
   signal; null if it was never reaped) and how many other processes had to be stopped;
7. leaves the attempt's cgroup for its parent and removes it.

`command_line("--probe-namespaces")` says (exit status 0) whether this host lets Run give
attempts their own namespaces.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
PRIVATE_DIRECTORIES = ("/tmp", "/var/tmp", "/dev/shm")
"""Made private (an empty tmpfs each) in an attempt's mount namespace, where they exist."""
TICK_S = 0.05
"""How often the descendants are looked for again while they are being stopped."""
KILL_WAIT_S = 5.0
"""How long after the grace SIGKILL is sent again to what is left (a process stuck in the
kernel cannot die sooner) before the supervisor reports anyway."""

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def become_subreaper() -> None:
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def mount(source: str, target: str, kind: str | None, flags: int, data: str | None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            kind.encode() if kind else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


# -- processes -------------------------------------------------------------------------------


Entry = tuple[int, str, int, int]
"""What /proc/PID/stat says of a process: (parent pid, state, start time in clock ticks,
process group)."""


def process_table() -> dict[int, Entry]:
    """Every process /proc shows, by pid."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (entry := process_table_entry(int(name))) is not None:
            table[int(name)] = entry
    return table


def process_table_entry(pid: int) -> Entry | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode(errors="replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    if len(fields) <= 19:
        return None
    return int(fields[1]), fields[0], int(fields[19]), int(fields[2])


def descendants(root: int, table: dict[int, Entry]) -> set[int]:
    """The live (not zombie) processes below `root` in `table`."""
    children: dict[int, list[int]] = {}
    for pid, entry in table.items():
        children.setdefault(entry[0], []).append(pid)
    found: set[int] = set()
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in found or pid == root:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return {pid for pid in found if table[pid][1] not in ("Z", "X")}


def start_ticks(pid: int) -> int | None:
    found = process_table_entry(pid)
    return None if found is None else found[2]


def _ignore(*_: Any) -> None:
    pass


# -- the supervisor --------------------------------------------------------------------------


class Supervisor:
    """Starts the command, then waits for the moment to stop everything below it."""

    def __init__(self, orders: dict[str, Any], status_fd: int, control: bytes) -> None:
        self.orders = orders
        self.status_fd = status_fd
        self.control = control  # what was read from stdin after the orders' line
        self.control_open = True
        self.stop_requested = False
        self.child: subprocess.Popen[bytes] | None = None
        self.main_status: int | None = None
        self.main_exited_first = False
        self.terminated: set[int] = set()
        self.told_again = False
        """Whether what was left when the main process exited on a stop got its own SIGTERM."""
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, _ignore)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        # Handled, not ignored: an ignored signal would stay ignored in the command.
        for unwanted in (signal.SIGINT, signal.SIGHUP):
            signal.signal(unwanted, _ignore)

    @property
    def main(self) -> int | None:
        return None if self.child is None else self.child.pid

    def _on_sigterm(self, *_: Any) -> None:
        self.stop_requested = True

    def report(self, **message: Any) -> None:
        with contextlib.suppress(OSError):
            os.write(self.status_fd, json.dumps(message).encode() + b"\n")

    def start(self, in_namespace: bool) -> bool:
        """Start the command; False (reported) when it cannot be."""
        orders = self.orders
        user: dict[str, Any] = {}
        if orders.get("uid") is not None:
            user = {
                "user": orders["uid"],
                "group": orders["gid"],
                "extra_groups": list(orders.get("groups") or [orders["gid"]]),
            }
        try:
            child = subprocess.Popen(
                orders["argv"],
                stdin=subprocess.DEVNULL,
                cwd=None if in_namespace else orders["cwd"],  # PID 1 is already there
                env=orders["env"],
                start_new_session=True,
                close_fds=True,
                **user,
            )
        except OSError as error:
            self.report(exec_failed=error.strerror or str(error))
            return False
        except subprocess.SubprocessError as error:
            self.report(exec_failed=str(error))
            return False
        self.child = child  # kept: a collected Popen could reap the main process itself
        # The command holds Run's output pipes now; this process lets go of its copies, so
        # that they close when the command's processes are gone.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
        self.report(started=child.pid, ticks=start_ticks(child.pid))
        return True

    def run(self) -> None:
        """Wait for the main process to exit or for a stop, then stop everything below."""
        deadline: float | None = None
        grace_s = float(self.orders.get("grace_s", 10.0))
        self._read_control(wait=False)
        while True:
            self._reap()
            stopping = self.main_status is not None or self.stop_requested
            if stopping:
                if deadline is None:
                    deadline = time.monotonic() + grace_s
                    self.main_exited_first = self.main_status is not None
                table = process_table()
                alive = descendants(os.getpid(), table)
                late = time.monotonic() >= deadline
                if not alive or time.monotonic() >= deadline + KILL_WAIT_S:
                    break
                if not late and self.main_status is None and self.main not in self.terminated:
                    # The main process's group first, at once, as a terminal would: a shell
                    # must not see its child die of SIGTERM before it gets its own (it would
                    # say "Terminated"). Its pid is not reused: it is not reaped yet.
                    assert self.main is not None
                    with contextlib.suppress(OSError):
                        os.killpg(self.main, signal.SIGTERM)
                    self.terminated |= {pid for pid in alive if table[pid][3] == self.main}
                    self.terminated.add(self.main)
                if not late and self.main_status is not None and not self.main_exited_first:
                    self._tell_again(alive)
                for pid in alive:
                    if late:
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)
                    elif pid not in self.terminated:
                        self.terminated.add(pid)
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGTERM)
                if late:
                    self.terminated |= alive
            self._wait(TICK_S if stopping else None)
        stopped = len(self.terminated - {self.main})
        ended = None
        if self.main_status is not None:
            ended = os.waitstatus_to_exitcode(self.main_status)
        self.report(ended=ended, stopped=stopped, requested=not self.main_exited_first)

    def _tell_again(self, alive: set[int]) -> None:
        """Once the main process has exited on a stop: one more SIGTERM to each process left.
        The group's SIGTERM can miss a process: a shell's child between its fork and its exec
        takes the signal with the shell's trap, then drops the trap, and what it execs never
        hears of it; without this it would keep the attempt until the grace is over."""
        if self.told_again:
            return
        self.told_again = True
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.child is not None and pid == self.child.pid and self.main_status is None:
                self.main_status = status
                self.child.returncode = os.waitstatus_to_exitcode(status)

    def _wait(self, timeout: float | None) -> None:
        readable = [self.wake_r] + ([0] if self.control_open else [])
        ready, _, _ = select.select(readable, [], [], timeout)
        if self.wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.wake_r, 512):
                    pass
        if 0 in ready:
            self._read_control(wait=True)

    def _read_control(self, *, wait: bool) -> None:
        if wait and self.control_open:
            data = os.read(0, 4096)
            if not data:  # Run is gone: nobody is left to report to
                self.control_open = False
                self.stop_requested = True
            self.control += data
        *lines, self.control = self.control.split(b"\n")
        if any(line.strip() == b"stop" for line in lines):
            self.stop_requested = True


def read_orders() -> tuple[dict[str, Any], bytes]:
    """The orders (stdin's first line) and whatever followed them."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(0, 65536)
        if not chunk:
            raise SystemExit(1)  # Run went away before it gave any orders
        data += chunk
    line, _, rest = data.partition(b"\n")
    orders: dict[str, Any] = json.loads(line)
    return orders, rest


def private_mounts(cwd: str) -> None:
    """In a new mount namespace: nothing propagates back to the host, a private /tmp,
    /var/tmp and /dev/shm, and a /proc of this PID namespace."""
    mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    os.chdir(cwd)  # first: the working directory may lie under a directory about to be hidden
    for path in PRIVATE_DIRECTORIES:
        if os.path.isdir(path) and not os.path.islink(path):
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)


def wait_for_namespace(child: int) -> int:
    """The outer process, in a namespaced attempt: reap until PID 1 of the attempt ended;
    its exit status."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the attempt's PID 1 handles it
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    status = 0
    while True:
        try:
            pid, found = os.waitpid(-1, 0)
        except ChildProcessError:
            return status
        if pid == child:
            status = os.waitstatus_to_exitcode(found)


def main() -> int:
    if sys.argv[1:] == ["--probe-namespaces"]:
        return probe_namespaces()
    orders, rest = read_orders()
    status_fd = int(orders["status_fd"])

    def setup_failed(error: OSError) -> int:
        with contextlib.suppress(OSError):
            os.write(status_fd, json.dumps({"setup_failed": str(error)}).encode() + b"\n")
        return 1

    try:
        if orders.get("cgroup"):
            with open(os.path.join(orders["cgroup"], "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
        become_subreaper()
        namespaced = bool(orders.get("namespaces"))
        if namespaced:
            unshare(CLONE_NEWNS | CLONE_NEWPID)
            child = os.fork()
            if child:
                os.close(status_fd)
                status = wait_for_namespace(child)
                leave_cgroup(orders.get("cgroup"))
                return status
            private_mounts(orders["cwd"])
    except OSError as error:
        return setup_failed(error)
    supervisor = Supervisor(orders, status_fd, rest)
    if supervisor.start(namespaced):
        supervisor.run()
    if not namespaced:  # else the outer process leaves it, once this one (PID 1) is gone
        leave_cgroup(orders.get("cgroup"))
    return 0


def leave_cgroup(cgroup: str | None) -> None:
    """Once everything below it is gone: move to the parent cgroup and remove the attempt's,
    so that none is left even when Run is gone (Run removes it otherwise)."""
    if not cgroup:
        return
    with contextlib.suppress(OSError):
        with open(os.path.join(os.path.dirname(cgroup), "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
        os.rmdir(cgroup)


def probe_namespaces() -> int:
    """Exit 0 when a new PID and mount namespace with private mounts can be made here."""
    try:
        unshare(CLONE_NEWNS | CLONE_NEWPID)
        child = os.fork()
        if child == 0:
            try:
                private_mounts("/")
            except OSError as error:
                print(error, file=sys.stderr)
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(child, 0)
        return 0 if os.waitstatus_to_exitcode(status) == 0 else 1
    except OSError as error:
        print(error, file=sys.stderr)
        return 1


def command_line(*arguments: str) -> list[str]:
    """How Run starts a supervisor: `python -I -S -c` importing this module from its own
    directory, appended to the path (after the stdlib), so that its compiled form is read
    from `__pycache__` (a script's never is: that saves a compile, about 20 ms, per attempt)."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import sys; sys.path.append({here!r}); import supervisor; supervisor.run()"
    return [sys.executable, "-I", "-S", "-c", code, *arguments]


def run() -> None:
    try:
        sys.exit(main())
    except OSError as error:
        if error.errno != errno.EPIPE:
            raise
        sys.exit(1)


if __name__ == "__main__":
    run()
