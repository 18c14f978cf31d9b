"""PostgreSQL's SSL settings (docs/operations.md, "PostgreSQL"): the store URL's query reaches
every connection, and an SSL mismatch is one line saying what to do, not "is the server
running?". Against the PostgreSQL the tests use, which offers no SSL."""

from __future__ import annotations

import pytest

from moonrun.errors import StoreUnavailable
from moonrun.store.postgres import PostgresStore


def refusal(url: str) -> str:
    try:
        PostgresStore(url).close()
    except StoreUnavailable as error:
        return error.message
    pytest.skip("this PostgreSQL accepts SSL: no mismatch to say")


def test_sslmode_require_on_a_server_without_ssl_says_to_turn_it_on_or_disable_it(
    postgres_url: str,
) -> None:
    said = refusal(postgres_url + "?sslmode=require")
    assert "does not accept SSL, but the store URL asks for it (sslmode=require)" in said
    assert "`ssl = on` in postgresql.conf" in said
    assert "?sslmode=disable" in said
    assert "is the server running" not in said


def test_an_unknown_sslmode_lists_the_six_there_are(postgres_url: str) -> None:
    said = refusal(postgres_url + "?sslmode=requird")
    assert said.startswith(
        "sslmode must be one of disable, allow, prefer, require, verify-ca, verify-full, "
        "not 'requird'"
    )


def test_an_option_libpq_does_not_know_is_said_as_such(postgres_url: str) -> None:
    said = refusal(postgres_url + "?ssl_mode=require")
    assert said.startswith("the store URL's query has an option PostgreSQL does not know")
    assert "ssl_mode" in said


def test_the_pool_connects_with_the_urls_options(postgres_url: str) -> None:
    store = PostgresStore(postgres_url + "?options=-c%20statement_timeout%3D4321")
    try:
        shown = store._read(lambda cursor: cursor.execute("SHOW statement_timeout").fetchone())
    finally:
        store.close()
    assert shown == ("4321ms",)
