"""A job's history row keeps an attempt's `silent` (docs/protocol.md, "Silent attempts") and
reads rows written before it (five fields an attempt) as not silent."""

from __future__ import annotations

import json
from dataclasses import replace

from moonrun.scheduling.jobs import AttemptSummary
from moonrun.store.codec import job_to_row, row_to_job
from tests.support.jobkit import T0, queued_job


def test_a_silent_attempt_survives_its_row_and_a_row_of_before_reads_as_not_silent() -> None:
    history = (
        AttemptSummary(1, T0, T0 + 5, "failed", "x", silent=True),
        AttemptSummary(2, T0 + 6, T0 + 9, "failed", "x"),
    )
    row = job_to_row(replace(queued_job(), history=history))
    older = {**row, "history_json": json.dumps([[1, T0, T0 + 5, "failed", "x"]])}
    assert row_to_job(row).history == history
    assert [past.silent for past in row_to_job(older).history] == [False]
