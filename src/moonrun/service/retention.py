"""What deleting a job deletes beside the job store: its log lines and its artifacts."""

from __future__ import annotations

from collections.abc import Callable

from moonrun.artifacts.protocol import ArtifactStore
from moonrun.logs.protocol import LogStore
from moonrun.scheduling.jobs import Job


def job_data(logs: LogStore, artifacts: ArtifactStore) -> Callable[[Job], None]:
    """The `forget` that `SchedulingService.prune` and `delete_job` call for each job they
    delete, before its record goes (so that no file outlives the job that reaches it)."""

    def forget(job: Job) -> None:
        logs.delete_job(job.id, job.attempt)
        artifacts.delete_job(job.id, job.attempt)

    return forget
