"""The import rules of the architecture: the domain stays pure, layers point downwards, and
the platform's three rooms (use cases, HTTP, console) keep to their own rules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "moonrun"

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

# The platform's three rooms (docs/architecture.md, "Rooms").
PLATFORM = ("moonrun.service", "moonrun.http", "moonrun.web")
ABOVE_THE_PLATFORM = ("moonrun.cli", "moonrun.settings", "moonrun.client")
HTTP_AND_TEMPLATES = ("fastapi", "starlette", "jinja2", "markupsafe", "uvicorn", "pydantic")
# The HTTP room's modules that answer routes; only app.py and error_handlers.py, which
# assemble the service, mount the console and render its error pages, may import moonrun.web.
ROUTE_MODULES = ("moonrun.http.api", "moonrun.http.run_api", "moonrun.http.user_api")

LAYER_RULES: dict[str, set[str]] = {
    # The answers' shapes, declared once: plain TypedDicts both the platform and Run load.
    "wire": {
        "moonrun.scheduling",
        "moonrun.store",
        *PLATFORM,
        "moonrun.run",
        "moonrun.clock",
        "moonrun.security",
        *ABOVE_THE_PLATFORM,
        *HTTP_AND_TEMPLATES,
        "aiohttp",
        "httpx",
    },
    "scheduling": {
        "moonrun.store",
        *PLATFORM,
        "moonrun.run",
        "moonrun.clock",
        "moonrun.security",
        *ABOVE_THE_PLATFORM,
    },
    "store": {*PLATFORM, "moonrun.run", *ABOVE_THE_PLATFORM},
    "security": {*PLATFORM, "moonrun.run", "moonrun.store", *ABOVE_THE_PLATFORM},
    "run": {*PLATFORM, "moonrun.store", *ABOVE_THE_PLATFORM, *HTTP_AND_TEMPLATES},
    # The use cases: the only code above store/ that touches a store, and no HTTP or templates.
    "service": {
        "moonrun.http",
        "moonrun.web",
        "moonrun.run",
        *ABOVE_THE_PLATFORM,
        *HTTP_AND_TEMPLATES,
    },
    # HTTP and console reach the store only through the use cases.
    "http": {"moonrun.store", "moonrun.run", *ABOVE_THE_PLATFORM, "jinja2"},
    "web": {"moonrun.store", "moonrun.run", *ABOVE_THE_PLATFORM, *ROUTE_MODULES},
    # The user client is a client of the API like any other: the library, the user verbs built
    # on it and their profiles reach the platform only over HTTP.
    "client": {
        *PLATFORM,
        "moonrun.store",
        "moonrun.run",
        "moonrun.cli",
        "moonrun.settings",
        "moonrun.scheduling",
        "moonrun.security",
    },
}
# Per module, beyond its room's rule: the route modules never import the console.
MODULE_RULES: dict[str, set[str]] = {
    **{
        f"{name.removeprefix('moonrun.').replace('.', '/')}.py": {"moonrun.web"}
        for name in ROUTE_MODULES
    },
    # The library is for any script: no typer, no rich, no profiles of the CLI.
    "client/library.py": {
        "typer",
        "rich",
        "click",
        "moonrun.client.verbs",
        "moonrun.client.profiles",
    },
    "client/profiles.py": {"httpx", "moonrun.client.library", "moonrun.client.verbs"},
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def modules_of(package: str, root: Path = SRC) -> list[Path]:
    """The modules of a package, or the one module of that name."""
    module = root / f"{package}.py"
    return [module] if module.exists() else sorted((root / package).rglob("*.py"))


def offenders_in(package: str, root: Path = SRC) -> set[str]:
    """Every import in `package` (under `root`) that its room's or its module's rule bans."""
    found = set()
    for path in modules_of(package, root):
        relative = path.relative_to(root).as_posix()
        banned = LAYER_RULES[package] | MODULE_RULES.get(relative, set())
        for name in imports_of(path):
            if any(name == ban or name.startswith(ban + ".") for ban in banned):
                found.add(f"{relative}: {name}")
    return found


def test_scheduling_imports_no_io_clock_or_randomness() -> None:
    """`moonrun.scheduling` is pure: no I/O, clock or randomness modules."""
    offenders = {
        f"{path.name}: {name}"
        for path in modules_of("scheduling")
        for name in imports_of(path)
        if name.split(".")[0] in IMPURE_MODULES
    }
    assert set() == offenders


def test_scheduling_never_reads_the_clock() -> None:
    """Even through `datetime`, the domain never asks what time it is."""
    offenders = set()
    for path in modules_of("scheduling"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in IMPURE_CALLS
            ):
                offenders.add(f"{path.name}:{node.lineno} .{node.func.attr}()")
    assert set() == offenders


@pytest.mark.parametrize("package", sorted(LAYER_RULES))
def test_layers_import_only_downwards(package: str) -> None:
    """Each layer imports nothing from the layers above it (DESIGN.md, "Layers")."""
    assert modules_of(package), f"no modules found for {package}"
    assert set() == offenders_in(package)


def test_the_import_checker_sees_violations(tmp_path: Path) -> None:
    """The checker itself flags a forbidden import (so a green run means something)."""
    module = tmp_path / "bad.py"
    module.write_text("import time\nfrom moonrun.store.memory import MemoryStore\n")
    assert {"time", "moonrun.store.memory"} == imports_of(module)


PLANTED = {
    "http/run_api.py": "from moonrun.store.protocol import Store\nfrom moonrun.web import views\n",
    "http/planted.py": "import moonrun.store.sql\n",
    "web/planted.py": (
        "from moonrun.store import open_store\nfrom moonrun.http.user_api import ROUTES\n"
    ),
    "service/planted.py": (
        "from fastapi import Request\nimport jinja2\nfrom moonrun.http import api\n"
    ),
}


def test_the_room_rules_catch_an_import_planted_in_each_room(tmp_path: Path) -> None:
    """A route or console module that imports the store, a route module that imports the
    console, and a use case that imports an HTTP or template library are each reported."""
    for relative, source in PLANTED.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(source)
    expected = {
        "http": {
            "http/run_api.py: moonrun.store.protocol",
            "http/run_api.py: moonrun.web",
            "http/planted.py: moonrun.store.sql",
        },
        "web": {"web/planted.py: moonrun.store", "web/planted.py: moonrun.http.user_api"},
        "service": {
            "service/planted.py: fastapi",
            "service/planted.py: jinja2",
            "service/planted.py: moonrun.http",
        },
    }
    actual = {room: offenders_in(room, root=tmp_path) for room in expected}
    assert expected == actual


def test_the_console_may_use_the_platform_bundle_but_no_route_module() -> None:
    """The console shares the HTTP room's `Platform` bundle (http/platform.py), and the HTTP
    room's wiring (app.py, error_handlers.py) mounts the console: neither is a route module."""
    assert "moonrun.http.platform" not in LAYER_RULES["web"]
    assert {"moonrun.http.api", "moonrun.http.run_api", "moonrun.http.user_api"} <= LAYER_RULES[
        "web"
    ]


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
