"""`--run-as-range`: one uid, and a group of the same number, per owner on this host.

An owner gets the lowest number of the range that no other owner holds and that names no
user in passwd and no group in the group database, on its first job here; the map is kept
in Run's data directory (`owner-ids.json`, 0600, replaced atomically and durably), so that
an owner keeps its uid across restarts and the files its jobs left stay its own. A full
range is `OwnerRangeFull`, which fails the attempt; Run goes on.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import threading
from pathlib import Path

from moonrun.errors import InvalidRequest, MoonrunError

FILE_NAME = "owner-ids.json"
FORMAT = "moonrun-owner-ids/1"
NO_OWNER = "-"
"""The key of jobs whose claim named no owner (a platform older than this Run): they share
one uid of the range."""
MAX_ID = 2**31 - 2


class OwnerRangeFull(MoonrunError):
    """Every uid of --run-as-range is taken: this owner's job cannot run on this host."""


def parse_range(text: str) -> tuple[int, int]:
    """`FIRST-LAST` (inclusive), both above 0 and below 2^31 - 1."""
    first, dash, last = text.partition("-")
    if not dash or not first.isdigit() or not last.isdigit():
        raise InvalidRequest(f"--run-as-range must be FIRST-LAST, e.g. 60000-60999, not {text!r}")
    low, high = int(first), int(last)
    if not 0 < low <= high <= MAX_ID:
        raise InvalidRequest(
            f"--run-as-range {text}: FIRST must be above 0 and at most LAST, LAST at most {MAX_ID}"
        )
    return low, high


def number_taken_on_host(number: int) -> bool:
    """Whether a user or a group of this number exists in the host's databases."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(number)
            return True
        except KeyError:
            pass
    return False


class OwnerIds:
    """The owner -> uid map of one Run, loaded from and saved to its data directory."""

    def __init__(self, data_dir: Path, first: int, last: int) -> None:
        self.path = data_dir / FILE_NAME
        self.first, self.last = first, last
        self._lock = threading.Lock()
        self._ids: dict[str, int] = {}
        if self.path.exists():
            document = json.loads(self.path.read_text())
            if document.get("format") != FORMAT:
                raise InvalidRequest(f"{self.path} is not a moonrun owner-ids file")
            self._ids = {str(k): int(v) for k, v in document["owners"].items()}

    def uids(self) -> set[int]:
        """Every uid given to an owner (in the range or not: an older, wider one)."""
        with self._lock:
            return set(self._ids.values())

    def uid_for(self, owner: str | None) -> int:
        """The owner's uid, mapped now (and saved, blocking) on its first use."""
        key = owner or NO_OWNER
        with self._lock:
            known = self._ids.get(key)
            if known is not None and self.first <= known <= self.last:
                return known
            held = set(self._ids.values())
            for number in range(self.first, self.last + 1):
                if number not in held and not number_taken_on_host(number):
                    self._ids[key] = number
                    self._save()
                    return number
        raise OwnerRangeFull(
            f"every uid of --run-as-range {self.first}-{self.last} is taken ({len(held)} owners "
            "hold one, the rest name users or groups of this host): widen the range"
        )

    def _save(self) -> None:
        document = {"format": FORMAT, "owners": self._ids}
        temporary = self.path.with_name(FILE_NAME + ".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = memoryview(json.dumps(document, sort_keys=True).encode())
            while data:
                data = data[os.write(descriptor, data) :]
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        with contextlib.suppress(OSError):
            os.chmod(self.path, 0o600)
