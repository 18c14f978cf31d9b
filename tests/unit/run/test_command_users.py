"""Whom commands run as: a named user with its groups, an owner's uid of `--run-as-range`,
Run's own user (with or without a passwd entry), and the warning Run gives at start when
commands could reach its secrets."""

from __future__ import annotations

import os
import pwd

import pytest

from moonrun.errors import InvalidRequest
from moonrun.run import confinement
from moonrun.run.confinement import CommandUser, command_user_warning

ADVICE = "start Run with --run-as USER, an unprivileged user other than Run's own"


def test_commands_as_root_are_warned_about_in_full() -> None:
    warning = command_user_warning(CommandUser("root", 0, 0, (0,), "/root"), euid=0)
    assert warning == (
        "commands run as root: a command job can read and change everything on this host, "
        f"Run's identity key and journal included; {ADVICE}"
    )


def test_commands_as_runs_own_user_are_warned_about_in_full() -> None:
    warning = command_user_warning(CommandUser("run", 1000, 1000, (), "/"), euid=1000)
    assert warning == (
        "commands run as Run's own user: a command job can read Run's identity key and "
        f"journal; {ADVICE}"
    )


def test_commands_as_another_unprivileged_user_are_not_warned_about() -> None:
    assert command_user_warning(CommandUser("nobody", 65534, 65534, (), "/"), euid=0) is None


def test_a_user_is_named_with_its_groups_and_home() -> None:
    entry = pwd.getpwnam("nobody")
    by_name, by_uid = CommandUser.named("nobody"), CommandUser.named(str(entry.pw_uid))
    expected = CommandUser(
        "nobody",
        entry.pw_uid,
        entry.pw_gid,
        tuple(os.getgrouplist("nobody", entry.pw_gid)),
        entry.pw_dir,
    )
    assert (by_name, by_uid) == (expected, expected)


@pytest.mark.parametrize("name", ["no-such-user-here", "99999999999999999999"])
def test_a_user_not_on_this_host_is_a_one_line_error(name: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        CommandUser.named(name)
    assert raised.value.message == f"--run-as: there is no user {name!r} on this host"


def test_an_owners_user_has_a_uid_and_group_of_its_own_and_no_home() -> None:
    assert CommandUser.of_owner(70001) == CommandUser("moonrun-70001", 70001, 70001, (70001,), "")


def test_runs_own_user_is_its_passwd_entry() -> None:
    uid = os.geteuid()
    assert CommandUser.effective() == CommandUser.named(str(uid))


def test_runs_own_user_without_a_passwd_entry_is_its_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Some containers run as a uid no passwd entry names: its number, its groups, home /."""

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.setattr(confinement.pwd, "getpwuid", no_entry)
    uid = os.geteuid()
    assert CommandUser.effective() == CommandUser(
        str(uid), uid, os.getegid(), tuple(os.getgroups()), "/"
    )
