"""Artifacts out (docs/protocol.md, "Artifacts"): a job's artifacts are listed and downloaded over
the user API, under the job read's authorization, a chunk at a time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory

CHUNKS = (b"first chunk;", b"second chunk;", b"third.")
WHOLE = b"".join(CHUNKS)


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def running_job(cast: Cast) -> tuple[str, int]:
    """A job of the owner's on web-1, claimed and acked by Run: (job id, attempt)."""
    job_id = cast.world.submit(cast.server_id, cast.owner[1])["id"]
    return job_id, cast.run.start().run_to_running(job_id)


def upload(cast: Cast, job_id: str, attempt: int, name: str, *, final: bool = True) -> None:
    """Upload CHUNKS as `name`, as Run does; the last one final unless `final` is False."""
    for index, data in enumerate(CHUNKS):
        last = final and index == len(CHUNKS) - 1
        response = cast.run.put_chunk(job_id, attempt, name, index, data, last)
        assert response.status_code == 202, response.text


def test_a_jobs_artifacts_are_listed_with_size_and_completeness(cast: Cast) -> None:
    """Every artifact of the job: its attempt, name, bytes so far, and whether it is complete."""
    job_id, attempt = running_job(cast)
    upload(cast, job_id, attempt, "result.txt")
    upload(cast, job_id, attempt, "partial.log", final=False)
    response = cast.world.api("GET", f"/api/v1/jobs/{job_id}/artifacts", token=cast.owner[1])
    assert response.status_code == 200, response.text
    assert response.json() == {
        "artifacts": [
            {"attempt": attempt, "name": "partial.log", "size": len(WHOLE), "complete": False},
            {"attempt": attempt, "name": "result.txt", "size": len(WHOLE), "complete": True},
        ]
    }


def test_a_job_without_artifacts_lists_none(cast: Cast) -> None:
    """A job nothing was uploaded for has an empty list."""
    job_id = cast.world.submit(cast.server_id, cast.owner[1])["id"]
    response = cast.world.api("GET", f"/api/v1/jobs/{job_id}/artifacts", token=cast.owner[1])
    assert response.json() == {"artifacts": []}


def test_a_complete_artifact_downloads_byte_identical_as_an_attachment(cast: Cast) -> None:
    """200 with the bytes, octet-stream, its length, an attachment name and an ETag."""
    job_id, attempt = running_job(cast)
    upload(cast, job_id, attempt, "result.txt")
    path = f"/api/v1/jobs/{job_id}/artifacts/result.txt"
    response = cast.world.api("GET", path, token=cast.owner[1])
    assert response.status_code == 200, response.text
    assert response.content == WHOLE
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["content-length"] == str(len(WHOLE))
    assert response.headers["content-disposition"] == 'attachment; filename="result.txt"'
    assert response.headers["etag"].startswith('"')


def test_the_latest_attempt_that_has_the_artifact_is_the_default(cast: Cast) -> None:
    """Without `attempt`, the newest attempt's copy; with it, that attempt's."""
    job_id, attempt = running_job(cast)
    upload(cast, job_id, attempt, "result.txt")
    cast.run.put_chunk(job_id, attempt, "other.txt", 0, b"one", True)
    path = f"/api/v1/jobs/{job_id}/artifacts/other.txt"
    assert cast.world.api("GET", path, token=cast.owner[1]).content == b"one"
    chosen = cast.world.api("GET", f"{path}?attempt={attempt}", token=cast.owner[1])
    assert chosen.content == b"one"
    missing = cast.world.api("GET", f"{path}?attempt={attempt + 1}", token=cast.owner[1])
    assert missing.status_code == 404


def test_if_none_match_with_the_etag_is_304_without_a_body(cast: Cast) -> None:
    """The artifact's ETag sent back as If-None-Match: 304, nothing sent again."""
    job_id, attempt = running_job(cast)
    upload(cast, job_id, attempt, "result.txt")
    path = f"/api/v1/jobs/{job_id}/artifacts/result.txt"
    tag = cast.world.api("GET", path, token=cast.owner[1]).headers["etag"]
    again = cast.world.api("GET", path, token=cast.owner[1], headers={"If-None-Match": tag})
    assert again.status_code == 304
    assert again.content == b""
    assert again.headers["etag"] == tag


@pytest.mark.parametrize(
    ("asked", "start", "end"),
    [
        ("bytes=5-20", 5, 20),
        ("bytes=30-", 30, len(WHOLE) - 1),
        ("bytes=-4", len(WHOLE) - 4, len(WHOLE) - 1),
    ],
)
def test_one_byte_range_is_206_with_just_those_bytes(
    cast: Cast, asked: str, start: int, end: int
) -> None:
    """A single range, across chunk boundaries or not: 206 with Content-Range."""
    job_id, attempt = running_job(cast)
    upload(cast, job_id, attempt, "result.txt")
    path = f"/api/v1/jobs/{job_id}/artifacts/result.txt"
    response = cast.world.api("GET", path, token=cast.owner[1], headers={"Range": asked})
    assert response.status_code == 206
    assert response.content == WHOLE[start : end + 1]
    assert response.headers["content-range"] == f"bytes {start}-{end}/{len(WHOLE)}"


@pytest.mark.parametrize("asked", ["bytes=0-1,4-5", "bytes=1000-", "lines=1-2"])
def test_a_range_that_is_not_one_satisfiable_byte_range_is_ignored(cast: Cast, asked: str) -> None:
    """Several ranges, one past the end, another unit: the whole artifact, 200."""
    job_id, attempt = running_job(cast)
    upload(cast, job_id, attempt, "result.txt")
    path = f"/api/v1/jobs/{job_id}/artifacts/result.txt"
    response = cast.world.api("GET", path, token=cast.owner[1], headers={"Range": asked})
    assert response.status_code == 200
    assert response.content == WHOLE


def test_an_incomplete_artifact_is_409_artifact_incomplete(cast: Cast) -> None:
    """Its final chunk has not arrived: nothing to download yet."""
    job_id, attempt = running_job(cast)
    upload(cast, job_id, attempt, "result.txt", final=False)
    path = f"/api/v1/jobs/{job_id}/artifacts/result.txt"
    response = cast.world.api("GET", path, token=cast.owner[1])
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "artifact_incomplete"


def test_an_unknown_artifact_is_404(cast: Cast) -> None:
    """A name the job has no artifact of."""
    job_id, _ = running_job(cast)
    path = f"/api/v1/jobs/{job_id}/artifacts/nothing.txt"
    response = cast.world.api("GET", path, token=cast.owner[1])
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_name_outside_the_artifact_pattern_is_422(cast: Cast) -> None:
    """The names Run may upload are the only names there are to ask for."""
    job_id, _ = running_job(cast)
    response = cast.world.api(
        "GET", f"/api/v1/jobs/{job_id}/artifacts/.hidden", token=cast.owner[1]
    )
    assert response.status_code == 422


def test_another_owner_may_neither_list_nor_download_the_artifacts(cast: Cast) -> None:
    """As with the job read: 403 forbidden for a user with no right on the job's server."""
    job_id, attempt = running_job(cast)
    upload(cast, job_id, attempt, "result.txt")
    for path in (f"/api/v1/jobs/{job_id}/artifacts", f"/api/v1/jobs/{job_id}/artifacts/result.txt"):
        response = cast.world.api("GET", path, token=cast.stranger[1])
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "forbidden"


def test_the_artifact_routes_are_in_the_openapi_document(cast: Cast) -> None:
    """The route table feeds the served document."""
    paths = cast.world.client.get("/openapi.json").json()["paths"]
    assert "get" in paths["/api/v1/jobs/{job_id}/artifacts"]
    assert "get" in paths["/api/v1/jobs/{job_id}/artifacts/{name}"]
