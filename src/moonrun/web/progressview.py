"""How the console shows a job's progress: the last reading, read in the light of its state."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# A handler's estimate of time remaining ("10.9 s left", the sleep handler's) is only true while
# the attempt runs: once the job has ended it would be a false promise.
TIME_LEFT = re.compile(r"[,;]?\s*\d+(?:\.\d+)?\s*s left\s*")


@dataclass(frozen=True, slots=True)
class ProgressShown:
    """What the console draws: a bar (None: no bar, the amount is unknown) and a line of text."""

    bar: float | None
    text: str
    stopped: bool = False


def progress_shown(state: str, progress: dict[str, Any] | None) -> ProgressShown | None:
    """The display of a job view's `state` and `progress`; None when there is nothing to show.

    Succeeded is complete whatever was last reported; failed and cancelled keep the last
    reading, marked as stopped and without time left; a null percent draws no bar."""
    if state == "succeeded":
        return ProgressShown(100.0, "100% · complete")
    if progress is None:
        return None
    percent = progress.get("percent")
    message = progress.get("message") or ""
    stopped = state in ("failed", "cancelled")
    if stopped:
        message = TIME_LEFT.sub("", message)
    amount = "progress unknown" if percent is None else f"{round(percent)}%"
    if not stopped and percent is None:
        amount = "in progress, amount unknown"
    parts = [amount, message, f"stopped ({state})" if stopped else ""]
    return ProgressShown(
        None if percent is None else float(percent),
        " · ".join(part for part in parts if part),
        stopped,
    )
