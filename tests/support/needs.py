"""What a test needs from the machine: skipped on a developer machine without it, failed in CI.

CI (`CI=true`) has every service and runs as root, so a missing one there is a broken
environment, never a reason to pass silently.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(reason: str) -> NoReturn:
    """Stop the test for want of `reason`: skip it, or fail it under `CI=true`."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def root(why: str) -> None:
    """Carry on only as root (another uid for a command needs Run to run as root)."""
    if os.geteuid() != 0:
        missing(f"needs root: {why}")
