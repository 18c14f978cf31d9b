"""Why Run will not upload an artifact path, in the words the job's log shows: a '..'
component, a missing file (the system's words), not owned by the command user (the user the
attempt ran as, not only `--run-as`)."""

from __future__ import annotations

import os
from pathlib import Path

from moonrun.run.confinement import CommandUser, Confinement

SOMEONE = CommandUser("someone", os.geteuid() + 1, os.getegid(), (), "/")


def test_a_path_through_dot_dot_is_refused_as_such(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "outside").write_text("x")
    why = Confinement().open_artifact(tmp_path / "work", "../outside")
    assert why == "a path with a '..' component"


def test_a_missing_file_is_refused_in_the_systems_words(tmp_path: Path) -> None:
    assert Confinement().open_artifact(tmp_path, "absent.txt") == "No such file or directory"


def test_a_file_not_owned_by_the_attempts_user_is_refused(tmp_path: Path) -> None:
    """The attempt's user (an owner's uid) decides, even where Run has no `--run-as`."""
    (tmp_path / "mine.txt").write_text("Run's own file")
    why = Confinement(run_as=None).open_artifact(tmp_path, "mine.txt", SOMEONE)
    opened = Confinement(run_as=SOMEONE).open_artifact(tmp_path, "mine.txt", None)
    assert (why, opened) == ("not owned by the command user", "not owned by the command user")
