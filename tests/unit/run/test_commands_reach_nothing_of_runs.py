"""A command reaches none of Run's settings and no other attempt's files: every `MOONRUN_*`
name the code reads is kept from its environment, and its working directory is its own (0700,
owned by the command user)."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.run.confinement import CommandUser, Confinement, child_environment, make_work_root
from tests.support import needs

SRC = Path(__file__).resolve().parents[3] / "src" / "moonrun"
SOMEONE = CommandUser("someone", 1234, 1234, (1234,), "/home/someone")


def moonrun_names() -> set[str]:
    """Every `MOONRUN_*` name written anywhere in src/ (settings, tokens, test hooks)."""
    pattern = re.compile(r"\bMOONRUN_[A-Z0-9_]+")
    return {name for path in SRC.rglob("*.py") for name in pattern.findall(path.read_text())}


@pytest.fixture
def umask_022() -> Iterator[None]:
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def test_every_moonrun_name_in_the_code_is_kept_from_a_commands_environment() -> None:
    names = moonrun_names()
    runs = dict.fromkeys(names, "mr_secret") | {"PATH": "/usr/bin", "LC_ALL": "C"}

    environment = child_environment(runs, SOMEONE)

    assert {"MOONRUN_JOIN_TOKEN", "MOONRUN_STORE", "MOONRUN_LOG_LEVEL"} <= names
    assert sorted(name for name in environment if name.startswith("MOONRUN")) == []
    assert "mr_secret" not in environment.values()
    assert environment == {
        "PATH": "/usr/bin",
        "LC_ALL": "C",
        "HOME": "/home/someone",
        "USER": "someone",
        "LOGNAME": "someone",
    }


def test_a_command_without_a_path_gets_the_default_one() -> None:
    environment = child_environment({"MOONRUN_PLATFORM": "http://p"}, SOMEONE)
    assert environment["PATH"] == "/usr/local/bin:/usr/bin:/bin"


@pytest.mark.usefixtures("umask_022")
def test_an_attempts_working_directory_is_0700_under_umask_022(tmp_path: Path) -> None:
    """Readable by nobody but the command user, whatever Run's umask would give."""
    workdir = Confinement(work_root=tmp_path).make_workdir("job_a", 1)
    found = workdir.stat()
    assert (workdir.parent, stat.S_IMODE(found.st_mode)) == (tmp_path, 0o700)
    assert workdir.name.startswith("moonrun-job_a-1-")


def test_an_attempts_working_directory_belongs_to_its_command_user(tmp_path: Path) -> None:
    """Another uid (`--run-as`): the command owns its directory, group and all."""
    needs.root("chown to another user needs Run to run as root")
    workdir = Confinement(run_as=SOMEONE, work_root=tmp_path).make_workdir("job_a", 2)
    found = workdir.stat()
    assert (found.st_uid, found.st_gid, stat.S_IMODE(found.st_mode)) == (1234, 1234, 0o700)


def test_an_owners_user_gets_the_directory_made_for_it_not_the_run_as_user(
    tmp_path: Path,
) -> None:
    needs.root("chown to another user needs Run to run as root")
    owner = CommandUser.of_owner(4321)
    confinement = Confinement(run_as=SOMEONE, work_root=tmp_path)
    found = confinement.make_workdir("job_b", 1, owner).stat()
    assert (found.st_uid, found.st_gid) == (4321, 4321)


@pytest.mark.usefixtures("umask_022")
def test_a_new_work_root_is_0711(tmp_path: Path) -> None:
    """Others may pass through to their own attempt's directory, never list the root."""
    make_work_root(tmp_path / "work")
    assert stat.S_IMODE((tmp_path / "work").stat().st_mode) == 0o711


def test_an_owners_user_is_at_home_in_its_working_directory(tmp_path: Path) -> None:
    """An owner's user has no passwd entry: HOME is the attempt's directory."""
    confinement = Confinement(environment={"PATH": "/usr/bin", "HOME": "/root"})
    owner = CommandUser.of_owner(4321)
    environment = confinement.environment_for(owner, tmp_path)
    named = confinement.environment_for(SOMEONE, tmp_path)
    assert environment == {
        "PATH": "/usr/bin",
        "HOME": str(tmp_path),
        "USER": "moonrun-4321",
        "LOGNAME": "moonrun-4321",
    }
    assert named == {"PATH": "/usr/bin", "HOME": "/root"}
