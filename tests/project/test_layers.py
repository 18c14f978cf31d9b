"""The import rules of the architecture (docs/architecture.md, "Layers"): the rooms of the
package stand on levels and every import runs down a level or more, never up or sideways; a few
rooms keep one rule of their own besides; only the wiring and `cli.py` choose implementations
or read the environment. Each rule is proven by an import planted where it is banned."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "moonrun"

LEVELS: tuple[tuple[str, ...], ...] = (
    ("moonrun", "errors", "backoff", "jsonlog"),  # the package's version and the leaves
    ("wire",),  # the answers' shapes, declared once
    ("scheduling",),  # the pure domain
    ("clock", "security"),
    ("store", "logs", "artifacts"),  # the stores, each behind its seam (protocol.py)
    ("service",),  # the use cases
    ("http", "web"),  # the HTTP service and the console, each given what it asks for
    ("wiring", "run", "client"),  # builds and serves the platform; Run; the user client
    ("cli",),
    ("__main__",),
)
"""Bottom to top. A module imports its own room and the rooms of lower levels only: never a
room of a higher level (no import runs back up) nor of its own (http/ and web/ never import
each other, nor store/, logs/ and artifacts/)."""
LEVEL_OF = {room: level for level, rooms in enumerate(LEVELS) for room in rooms}

# Modules that do I/O, read clocks or draw random numbers; the domain may import none.
IMPURE_MODULES = {
    "asyncio",
    "io",
    "os",
    "pathlib",
    "random",
    "secrets",
    "shutil",
    "socket",
    "sqlite3",
    "subprocess",
    "threading",
    "time",
    "urllib",
    "uuid",
    "logging",
    "tempfile",
}
IMPURE_CALLS = {"now", "utcnow", "today", "time", "time_ns", "monotonic", "urandom"}

HTTP_AND_TEMPLATES = {"fastapi", "starlette", "jinja2", "markupsafe", "uvicorn", "pydantic"}
THE_PLATFORM = {f"moonrun.{room}" for room in ("store", "logs", "artifacts", "service")}
THE_PLATFORM |= {"moonrun.http", "moonrun.web", "moonrun.wiring"}

ROOM_RULES: dict[str, set[str]] = {
    # The answers' shapes, declared once: plain TypedDicts that the platform and Run load.
    "wire": HTTP_AND_TEMPLATES | {"aiohttp", "httpx"},
    # A use case is a method call: values in, values (or a typed error) out.
    "service": HTTP_AND_TEMPLATES,
    # The HTTP service and the console reach the store only through the use cases (the log
    # and artifact stores through their seams); the HTTP service renders no templates.
    "http": {"moonrun.store", "jinja2"},
    "web": {"moonrun.store"},
    # Run and the user client reach the platform over HTTP only; the client is for any
    # script, so it needs neither the domain nor the keys.
    # Run loads no HTTP framework or pydantic either (its start-up time).
    "run": THE_PLATFORM | HTTP_AND_TEMPLATES,
    "client": THE_PLATFORM | {"moonrun.scheduling", "moonrun.security"},
}
"""What a room may not import besides what its level forbids."""
MODULE_RULES: dict[str, set[str]] = {
    # The library is for any script: no typer, no rich, nothing of the CLI's verbs (the saved
    # profiles it may read: `Client.from_profile`).
    "client/library.py": {
        "typer",
        "rich",
        "click",
        "moonrun.client.verbs",
    },
    "client/async_library.py": {"typer", "rich", "click", "moonrun.client.verbs"},
    # The user API without I/O, which both clients send: what a request is and what its
    # answer means, never how it travels.
    "client/calls.py": {
        "httpx",
        "moonrun.client.library",
        "moonrun.client.async_library",
        "moonrun.client.verbs",
    },
    "client/records.py": {
        "httpx",
        "moonrun.client.calls",
        "moonrun.client.library",
        "moonrun.client.async_library",
        "moonrun.client.verbs",
    },
    # The clients' decisions (retries, outages, following): neither client's loop.
    "client/policy.py": {
        "moonrun.client.library",
        "moonrun.client.async_library",
        "moonrun.client.verbs",
    },
    "client/profiles.py": {"httpx", "moonrun.client.library", "moonrun.client.verbs"},
}
"""What a module may not import besides its room's rules."""
CHOOSERS = {"wiring", "cli"}
"""The only rooms that choose implementations or read the environment."""
STORES = ("store", "logs", "artifacts")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(("moonrun", *parts)).removesuffix(".__init__")


def implementations(root: Path = SRC) -> set[str]:
    """Every module of the stores but their seams: the wiring chooses among them."""
    return {
        module_name(path, root)
        for room in STORES
        for path in (root / room).rglob("*.py")
        if path.name not in ("protocol.py", "__init__.py") or room == "store"
    } - {"moonrun.store.protocol"}


def is_module(name: str) -> bool:
    path = SRC.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports_of(path: Path) -> set[str]:
    """The modules `path` imports (`from moonrun import cli` imports `moonrun.cli`)."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if is_module(name) else node.module)
    return found


def room_of(relative: str) -> str:
    """The room of a module, by its path in the package."""
    room = relative.split("/")[0].removesuffix(".py")
    return "moonrun" if room == "__init__" else room


def room_named(name: str) -> str | None:
    """The room an imported module belongs to; None outside the package."""
    if name == "moonrun" or not name.startswith("moonrun."):
        return "moonrun" if name == "moonrun" else None
    return name.split(".")[1]


def bans(name: str, banned: set[str]) -> bool:
    return any(name == ban or name.startswith(ban + ".") for ban in banned)


def modules(root: Path) -> list[tuple[str, Path]]:
    return [(path.relative_to(root).as_posix(), path) for path in sorted(root.rglob("*.py"))]


def upwards(root: Path = SRC) -> set[str]:
    """Every import of another room that is not on a lower level."""
    found = set()
    for relative, path in modules(root):
        room = room_of(relative)
        for name in imports_of(path):
            target = room_named(name)
            if target not in (None, room) and LEVEL_OF[target] >= LEVEL_OF[room]:
                found.add(f"{relative}: {name}")
    return found


def broken_room_rules(root: Path = SRC) -> set[str]:
    """Every import a room's or a module's own rule bans."""
    found = set()
    for relative, path in modules(root):
        banned = ROOM_RULES.get(room_of(relative), set()) | MODULE_RULES.get(relative, set())
        found.update(f"{relative}: {name}" for name in imports_of(path) if bans(name, banned))
    return found


def chosen_outside_the_wiring(root: Path = SRC) -> set[str]:
    """Every import of a store's implementation outside the wiring, cli.py and that store."""
    chosen = implementations()
    return {
        f"{relative}: {name}"
        for relative, path in modules(root)
        if room_of(relative) not in CHOOSERS
        for name in imports_of(path)
        if name in chosen and room_named(name) != room_of(relative)
    }


def environment_readers(root: Path = SRC) -> set[str]:
    """Every read of the process environment (`os.environ`, `os.getenv`) outside the wiring
    and cli.py."""
    found = set()
    for relative, path in modules(root):
        if room_of(relative) in CHOOSERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            named = node.attr if isinstance(node, ast.Attribute) else None
            if isinstance(node, ast.alias):
                named = node.name
            if named in ("environ", "environb", "getenv", "getenvb"):
                found.add(f"{relative}:{getattr(node, 'lineno', 0)} {named}")
    return found


def test_every_module_stands_in_a_room_on_a_level() -> None:
    """A new room has to be given its level before anything can import it."""
    rooms = {room_of(relative) for relative, _ in modules(SRC)}
    assert set() == rooms - set(LEVEL_OF)
    assert set() == set(LEVEL_OF) - rooms


def test_no_import_runs_from_a_lower_room_to_a_higher_one() -> None:
    """Over the whole package: the wiring may import everything below it and nothing imports
    the wiring but cli.py; http/ and web/ import neither each other nor anything above them;
    service/ none of them; the stores no use case; the domain only errors.py."""
    assert set() == upwards()


@pytest.mark.parametrize("room", sorted(ROOM_RULES))
def test_each_room_keeps_its_own_rule(room: str) -> None:
    """Besides its level: no HTTP library in a use case, no store in a route or a page, no
    platform room in Run or the user client."""
    assert set() == {found for found in broken_room_rules() if found.startswith(room + "/")}


def test_only_the_wiring_and_cli_choose_implementations() -> None:
    """The use cases, routes and pages know the stores' seams only (store/protocol.py,
    logs/protocol.py, artifacts/protocol.py); which store serves them is the wiring's choice."""
    assert set() == chosen_outside_the_wiring()


def test_only_the_wiring_and_cli_read_the_environment() -> None:
    assert set() == environment_readers()


def test_scheduling_imports_no_io_clock_or_randomness() -> None:
    """`moonrun.scheduling` is pure: no I/O, clock or randomness modules."""
    offenders = {
        f"{relative}: {name}"
        for relative, path in modules(SRC / "scheduling")
        for name in imports_of(path)
        if name.split(".")[0] in IMPURE_MODULES
    }
    assert set() == offenders


def test_scheduling_never_reads_the_clock() -> None:
    """Even through `datetime`, the domain never asks what time it is."""
    offenders = set()
    for relative, path in modules(SRC / "scheduling"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in IMPURE_CALLS
            ):
                offenders.add(f"{relative}:{node.lineno} .{node.func.attr}()")
    assert set() == offenders


def test_the_import_checker_sees_modules_however_they_are_imported(tmp_path: Path) -> None:
    """`import`, `from package import module` and `from module import name` all count."""
    module = tmp_path / "bad.py"
    module.write_text(
        "import time\nfrom moonrun.store.memory import MemoryStore\n"
        "from moonrun import cli, __version__\nfrom moonrun.web import pages\n"
    )
    expected = {"time", "moonrun.store.memory", "moonrun.cli", "moonrun", "moonrun.web.pages"}
    assert expected == imports_of(module)


PLANTED = {
    "scheduling/planted.py": "from moonrun.clock import Clock\n",
    "store/planted.py": (
        "from moonrun.service.scheduling import SchedulingService\n"
        "from moonrun.logs.protocol import LogStore\n"
    ),
    "logs/planted.py": "from moonrun.web import pages\nfrom moonrun.store import open_store\n",
    "artifacts/planted.py": "from moonrun.http.platform import HttpPlatform\n",
    "service/planted.py": (
        "import os\nfrom fastapi import Request\nimport jinja2\nfrom moonrun.http import api\n"
        "from moonrun.wiring.platform import Platform\n"
        "from moonrun.store.memory import MemoryStore\n"
        "TOKEN = os.environ.get('MOONRUN_TOKEN')\n"
    ),
    "http/run_api.py": "from moonrun.store.protocol import Store\nfrom moonrun.web import jobs\n",
    "http/planted.py": (
        "import moonrun.store.sql\nfrom moonrun.wiring import app\n"
        "from moonrun.logs.file import FileLogStore\nfrom os import getenv\n"
    ),
    "web/planted.py": (
        "from moonrun.store import open_store\nfrom moonrun.http.user_api import ROUTES\n"
        "from moonrun.wiring.settings import build_platform\n"
    ),
    "wiring/planted.py": "from moonrun.cli import main\nfrom moonrun.run.agent import Agent\n",
    "run/planted.py": "from moonrun.store.protocol import Store\nimport pydantic\n",
    "wire/planted.py": "import pydantic\nfrom moonrun.scheduling.jobs import Job\n",
    "client/library.py": "import typer\nfrom moonrun.scheduling.jobs import Job\n",
    "client/calls.py": "import httpx\n",
}
CAUGHT: dict[Callable[[Path], set[str]], set[str]] = {
    upwards: {
        "scheduling/planted.py: moonrun.clock",
        "store/planted.py: moonrun.service.scheduling",
        "store/planted.py: moonrun.logs.protocol",
        "logs/planted.py: moonrun.web.pages",
        "logs/planted.py: moonrun.store",
        "artifacts/planted.py: moonrun.http.platform",
        "service/planted.py: moonrun.http.api",
        "service/planted.py: moonrun.wiring.platform",
        "http/run_api.py: moonrun.web.jobs",
        "http/planted.py: moonrun.wiring.app",
        "web/planted.py: moonrun.http.user_api",
        "web/planted.py: moonrun.wiring.settings",
        "wiring/planted.py: moonrun.cli",
        "wiring/planted.py: moonrun.run.agent",
        "wire/planted.py: moonrun.scheduling.jobs",
    },
    broken_room_rules: {
        "service/planted.py: fastapi",
        "service/planted.py: jinja2",
        "http/run_api.py: moonrun.store.protocol",
        "http/planted.py: moonrun.store.sql",
        "web/planted.py: moonrun.store",
        "run/planted.py: moonrun.store.protocol",
        "run/planted.py: pydantic",
        "wire/planted.py: pydantic",
        "client/library.py: typer",
        "client/library.py: moonrun.scheduling.jobs",
        "client/calls.py: httpx",
    },
    chosen_outside_the_wiring: {
        "logs/planted.py: moonrun.store",
        "service/planted.py: moonrun.store.memory",
        "http/planted.py: moonrun.store.sql",
        "http/planted.py: moonrun.logs.file",
        "web/planted.py: moonrun.store",
    },
    environment_readers: {"service/planted.py:7 environ", "http/planted.py:4 getenv"},
}


@pytest.mark.parametrize("checker", CAUGHT, ids=lambda checker: checker.__name__)
def test_the_room_rules_catch_an_import_planted_in_each_room(
    tmp_path: Path, checker: Callable[[Path], set[str]]
) -> None:
    """An import that runs up or sideways, one a room's own rule bans, an implementation
    chosen below the wiring and an environment read below it are each reported, and nothing
    else is."""
    for relative, source in PLANTED.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(source)
    assert CAUGHT[checker] == checker(tmp_path)


LOADED_AFTER = """
import sys
from moonrun import cli
sys.argv = ["moonrun", *sys.argv[1:]]
try:
    cli.main()
except SystemExit:
    pass
client = ("httpx", "moonrun.client.verbs", "moonrun.client")
print("loaded:" + ",".join(sorted(name for name in client if name in sys.modules)))
"""


def loaded_by(*argv: str) -> str:
    """Which of the user client's modules `moonrun ARGV` loaded, in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", LOADED_AFTER, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.rpartition("loaded:")[2].strip()


@pytest.mark.parametrize(
    "argv",
    [("run", "start", "--help"), ("platform", "serve", "--help"), ("store", "check", "--help")],
    ids=lambda argv: " ".join(argv),
)
def test_the_service_verbs_start_without_the_user_client(argv: tuple[str, ...]) -> None:
    """Run and the platform start without loading the user verbs or httpx (start-up time)."""
    expected = ""
    assert expected == loaded_by(*argv)


def test_the_user_verbs_are_there_for_every_other_command_line() -> None:
    """`moonrun job ...` (and `moonrun --help`) load the user verbs."""
    expected = "httpx,moonrun.client,moonrun.client.verbs"
    assert expected == loaded_by("job", "list", "--help")


RUN_LOADS = """
import sys
import moonrun.run.agent, moonrun.run.client, moonrun.run.handlers
print("loaded:" + ",".join(sorted(name for name in sys.modules if name.split(".")[0] in NAMES)))
"""


def test_run_loads_neither_pydantic_nor_the_web_framework() -> None:
    """Run parses the platform's answers with moonrun.wire alone: its agent, client and
    handlers load none of the platform's HTTP and template libraries (start-up time)."""
    names = {name.split(".")[0] for name in HTTP_AND_TEMPLATES}
    done = subprocess.run(
        [sys.executable, "-c", f"NAMES = {sorted(names)!r}" + RUN_LOADS],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.rpartition("loaded:")[2].strip() == ""
