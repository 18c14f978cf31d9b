"""Every store reads a job together with its server (and the server's admins, in order):
each job a user reads is checked against them, and reading them apart cost a round trip
more per read on the database stores."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from moonrun.scheduling.records import Server
from moonrun.store.protocol import Store
from tests.support.jobkit import T0, queued_job
from tests.support.stores import StoreFactory


@pytest.fixture
def store(store_factory: StoreFactory) -> Iterator[Store]:
    opened = store_factory.open()
    yield opened
    opened.close()


def test_a_job_comes_with_its_server_and_the_admins_in_their_order(store: Store) -> None:
    server = Server("srv-1", "web-1", "end-1", "usr-1", T0, admin_ids=("usr-9", "usr-3", "usr-5"))
    store.insert_server(server)
    job = queued_job(job_id="job-a")
    store.insert_job(job)

    assert store.job_and_server("job-a") == (job, server)


def test_a_job_whose_server_has_no_admins_comes_with_it(store: Store) -> None:
    server = Server("srv-1", "web-1", "end-1", "usr-1", T0)
    store.insert_server(server)
    store.insert_job(queued_job(job_id="job-a"))

    assert store.job_and_server("job-a") == (queued_job(job_id="job-a"), server)


def test_a_job_whose_server_is_gone_comes_with_none(store: Store) -> None:
    store.insert_job(queued_job(job_id="job-a"))  # srv-1 never stored

    assert store.job_and_server("job-a") == (queued_job(job_id="job-a"), None)


def test_no_such_job_is_none(store: Store) -> None:
    store.insert_server(Server("srv-1", "web-1", "end-1", "usr-1", T0))

    assert store.job_and_server("job-missing") is None
