"""What FileStore and MySQLStore promise beyond the contract: files, schema, clear failures."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import pymysql
import pytest

from moonrun.errors import SchemaTooNew, StoreUnavailable
from moonrun.scheduling.jobs import JobState
from moonrun.scheduling.records import Server
from moonrun.store import DEFAULT_STORE_URL, open_store
from moonrun.store.file import FileStore
from moonrun.store.memory import MemoryStore
from moonrun.store.mysql import MySQLStore, redact
from moonrun.store.postgres import PostgresStore
from moonrun.store.protocol import IdempotencyRecord
from moonrun.store.schema import SCHEMA_VERSION
from tests.support import launcher
from tests.support.jobkit import T0, queued_job
from tests.support.jobkit import claimed as claimed_job
from tests.support.stores import StoreFactory, mysql_test_database

ROOT = Path(__file__).resolve().parents[3]
CANARY = "canary-pass-7f3a"


def moonrun(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run the real `moonrun` command line (tests/support/launcher.py)."""
    return subprocess.run(
        launcher.moonrun(*args),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env=launcher.command_env(None),
    )


def test_open_store_picks_the_store_from_the_url(tmp_path: Path, mysql_url: str) -> None:
    """memory://, file:PATH and mysql://... open the matching store."""
    stores = [
        open_store("memory://"),
        open_store(f"file:{tmp_path / 'p.db'}"),
        open_store(mysql_url),
    ]
    assert [MemoryStore, FileStore, MySQLStore] == [type(store) for store in stores]
    for store in stores:
        store.close()


def test_default_store_is_a_file_under_dot_moonrun(tmp_path: Path) -> None:
    """Without --store the platform uses file:.moonrun/platform.db, in a 0700 directory."""
    result = moonrun("store", "check", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    assert DEFAULT_STORE_URL == "file:.moonrun/platform.db"
    assert (tmp_path / ".moonrun" / "platform.db").is_file()
    assert stat.S_IMODE((tmp_path / ".moonrun").stat().st_mode) == 0o700


def test_file_store_runs_wal_with_full_sync(tmp_path: Path) -> None:
    """The file is in WAL mode and every store connection syncs fully on commit."""
    store = FileStore(tmp_path / "p.db")
    connection = store._open()  # how every connection of the store is opened
    synchronous = connection.execute("PRAGMA synchronous").fetchone()[0]
    busy_timeout = connection.execute("PRAGMA busy_timeout").fetchone()[0]
    connection.close()
    store.close()
    with sqlite3.connect(tmp_path / "p.db") as raw:
        journal_mode = raw.execute("PRAGMA journal_mode").fetchone()[0]
    assert (journal_mode, synchronous, busy_timeout) == ("wal", 2, 5000)


def test_schema_is_migrated_on_open_and_versioned(durable_factory: StoreFactory) -> None:
    """Opening creates the schema and records its version."""
    store = durable_factory.open()
    assert isinstance(store, FileStore | MySQLStore | PostgresStore)
    assert store.schema_version() == SCHEMA_VERSION
    store.close()
    again = durable_factory.reopen(store)
    assert isinstance(again, FileStore | MySQLStore | PostgresStore)
    assert again.schema_version() == SCHEMA_VERSION
    again.close()


def test_a_newer_schema_than_the_code_knows_is_refused(tmp_path: Path) -> None:
    """A store written by a newer moonrun is a clear error, not a guess."""
    FileStore(tmp_path / "p.db").close()
    with sqlite3.connect(tmp_path / "p.db") as raw:
        raw.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(SchemaTooNew) as refused:
        FileStore(tmp_path / "p.db")
    assert "schema version 99" in refused.value.message
    assert "upgrade moonrun" in refused.value.message


def test_mysql_urls_are_redacted() -> None:
    """Descriptions and errors name the server and user, never the password."""
    assert redact(f"mysql://bob:{CANARY}@db:3306/moonrun") == "mysql://bob:***@db:3306/moonrun"


def test_mysql_store_without_a_driver_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing driver is an install hint, not an ImportError."""
    import importlib.util

    real = importlib.util.find_spec
    missing_drivers = {"pymysql", "MySQLdb"}
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in missing_drivers else real(name),
    )
    with pytest.raises(StoreUnavailable) as missing:
        MySQLStore("mysql://root@127.0.0.1:3306/test")
    assert "pip install 'moonrun[mysql]'" in missing.value.message


def test_a_mysql_url_may_name_its_driver() -> None:
    """`mysql+pymysql://` and `mysql+mysqldb://` force a driver; plain `mysql://` takes the
    fastest one installed."""
    from moonrun.store.mysql import DRIVERS, _driver_url

    assert _driver_url("mysql+pymysql://u@h/db").drivername == "mysql+pymysql"
    assert _driver_url("mysql+mysqldb://u@h/db").drivername == "mysql+mysqldb"
    assert _driver_url("mysql://u@h/db").drivername in DRIVERS


def bad_stores(tmp_path: Path, mysql_url: str) -> dict[str, tuple[str, str]]:
    """Bad store URLs and a fragment of the one-line error each must give."""
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not an sqlite file at all" * 100)
    parts = urlsplit(mysql_url)
    host = f"{parts.hostname}:{parts.port or 3306}"
    return {
        "directory": (f"file:{tmp_path}", "it is a directory"),
        "not sqlite": (f"file:{garbage}", "is not an SQLite database"),
        "parent is a file": (f"file:{garbage}/p.db", "is not a directory"),
        "unreachable mysql": (
            f"mysql://root:{CANARY}@127.0.0.1:1/moonrun",
            "cannot reach MySQL at 127.0.0.1:1",
        ),
        "bad credentials": (
            f"mysql://nobody:{CANARY}@{host}/test",
            "refused user 'nobody': wrong user or password",
        ),
        "unknown database": (
            f"mysql://{parts.username or 'root'}@{host}/moonrun_nowhere_{os.getpid()}",
            "has no database",
        ),
        "unknown scheme": ("redis://db/moonrun", "unknown store 'redis'"),
        "mysql port not a number": (f"mysql://u:{CANARY}@127.0.0.1:port/x", "not a MySQL URL"),
        "postgres port not a number": (
            f"postgresql://u:{CANARY}@127.0.0.1:port/x",
            "not a PostgreSQL URL",
        ),
        "unreachable postgres": (
            f"postgresql://postgres:{CANARY}@127.0.0.1:1/moonrun",
            "cannot reach PostgreSQL at 127.0.0.1:1",
        ),
        "postgres bad credentials": (
            f"postgresql://nobody:{CANARY}@127.0.0.1:5432/postgres",
            "refused user 'nobody': wrong user or password",
        ),
        "postgres unknown database": (
            f"postgresql://postgres@127.0.0.1:5432/moonrun_nowhere_{os.getpid()}",
            "has no database",
        ),
        "bad file option": (f"file:{tmp_path / 'x.db'}?cache=1", "unknown file store option"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "directory",
        "not sqlite",
        "parent is a file",
        "unreachable mysql",
        "bad credentials",
        "unknown database",
        "unknown scheme",
        "mysql port not a number",
        "postgres port not a number",
        "unreachable postgres",
        "postgres bad credentials",
        "postgres unknown database",
        "bad file option",
    ],
)
def test_a_bad_store_is_one_clear_line_and_a_nonzero_exit(
    case: str, tmp_path: Path, mysql_url: str, request: pytest.FixtureRequest
) -> None:
    """No traceback, no password, exit 1, and a line that says what is wrong."""
    if case.startswith("postgres "):
        request.getfixturevalue("postgres_url")  # PostgreSQL must answer (skipped without)
    url, expected = bad_stores(tmp_path, mysql_url)[case]
    result = moonrun("store", "check", "--store", url)
    lines = result.stderr.splitlines()
    assert (result.returncode, len(lines)) == (1, 1), result.stderr
    assert lines[0].startswith("moonrun: error: ")
    assert expected in lines[0]
    assert CANARY not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_a_locked_file_is_one_clear_line(tmp_path: Path) -> None:
    """A store file another process holds an exclusive lock on is reported as locked."""
    path = tmp_path / "p.db"
    FileStore(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        result = moonrun("store", "check", "--store", f"file:{path}?busy_timeout_ms=100")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.returncode == 1
    said = f"{path} is locked by another process (database is locked)"
    assert [f"moonrun: error: store_unavailable: {said}"] == result.stderr.splitlines()


def test_an_older_schema_is_migrated_forward_on_open(tmp_path: Path) -> None:
    """A store at schema version 1 gains the later tables and records the new version."""
    from sqlalchemy import create_engine, insert

    from moonrun.store.schema import MIGRATIONS, schema_version

    path = tmp_path / "old.db"
    engine = create_engine(f"sqlite+pysqlite:///{path}")
    with engine.begin() as connection:
        schema_version.create(connection)
        connection.execute(insert(schema_version).values(version=1))
        MIGRATIONS[0](connection)
    engine.dispose()
    store = FileStore(path)
    try:
        record = IdempotencyRecord("usr-1", "key", "fp", ("job-1",), 0)
        store.insert_jobs([], record)
        assert (
            store.schema_version(),
            store.idempotency_record("usr-1", "key"),
        ) == (SCHEMA_VERSION, record)
    finally:
        store.close()


@pytest.fixture(params=["file", "mysql"])
def private_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL of its own (a MySQL database apart from the session's, since a test that
    changes the schema must not change it under the others)."""
    if request.param == "file":
        yield f"file:{tmp_path / 'p.db'}"
        return
    request.getfixturevalue("mysql_url")  # skips (or fails in CI) without MariaDB
    databases = mysql_test_database()
    yield next(databases)
    databases.close()


def _raw_sql(url: str, *statements: str) -> None:
    """Run `statements` on the store's database, past the store."""
    if url.startswith("file:"):
        with closing(sqlite3.connect(url.removeprefix("file:"), isolation_level=None)) as raw:
            for statement in statements:
                raw.execute(statement)
        return
    parts = urlsplit(url)
    connection = pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=parts.path.lstrip("/"),
        autocommit=True,
    )
    try:
        with connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
    finally:
        connection.close()


def test_an_older_store_learns_each_jobs_owner_from_its_server_on_open(
    private_store_url: str,
) -> None:
    """Opening a store of schema 6 (jobs without `owner_id`, claims without owners' turns)
    gives each stored job the owner of its server, a job whose server was removed (it had
    ended) an empty owner, and the waiting jobs their place in their owner's turns."""
    store = open_store(private_store_url)
    store.insert_server(Server("srv-kept", "web", "ep-1", "usr-alice", T0))
    kept = replace(queued_job(job_id="job-kept", endpoint_id="ep-1"), server_id="srv-kept")
    orphan = replace(kept, id="job-orphan", server_id="srv-gone", state=JobState.CANCELLED)
    store.insert_jobs([kept, orphan])
    store.close()
    on_jobs = "" if private_store_url.startswith("file:") else " ON jobs"
    _raw_sql(
        private_store_url,
        # The indexes over owner_id (migrations 12 and 15, in place of 8's) go before it.
        *(
            f"DROP INDEX {index}{on_jobs}"
            for index in ("ix_jobs_priority_claim", "ix_jobs_key_held", "ix_jobs_key_live")
        ),
        "ALTER TABLE jobs DROP COLUMN claimable_owner_id",
        "ALTER TABLE jobs DROP COLUMN owner_id",
        "UPDATE schema_version SET version = 6",
    )
    store = open_store(private_store_url)
    try:
        jobs = store.get_jobs(["job-kept", "job-orphan"])
        assert isinstance(store, FileStore | MySQLStore | PostgresStore)
        assert (
            store.schema_version(),
            jobs["job-kept"].owner_id,
            jobs["job-orphan"].owner_id,
        ) == (SCHEMA_VERSION, "usr-alice", "")
        claimed = store.claim_jobs("ep-1", T0 + 1, 2, lambda job: claimed_job(job, now=T0 + 1))
        assert [(job.id, job.owner_id) for job in claimed] == [("job-kept", "usr-alice")]
    finally:
        store.close()
