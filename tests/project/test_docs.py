"""The docs that make promises are checked: the requirements map, the roadmap boundary, the
job kinds, and every citation of the wire contract (docs/protocol.md, by section name)."""

from __future__ import annotations

import ast
import functools
import inspect
import re
from pathlib import Path

from moonrun.errors import ERROR_TABLE
from moonrun.run.handlers import load_handlers

ROOT = Path(__file__).resolve().parents[2]
BOUNDARY = [
    "process supervision",
    "real config/file execution",
    "durable log/artifact/metric/backup storage",
    "dependency installation",
    "run self-update",
    "client-manager lifecycle",
    "production multi-replica scaling",
]


@functools.cache
def test_function_names(path: Path) -> frozenset[str]:
    """The test functions a file defines (parsed once: the maps name hundreds of tests)."""
    tree = ast.parse(path.read_text())
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    )


test_function_names.__test__ = False  # type: ignore[attr-defined]


def test_requirements_map_names_only_tests_that_exist() -> None:
    """Every `tests/file.py::test_name` in docs/requirements.md is a real test function."""
    text = (ROOT / "docs" / "requirements.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", text)
    assert named, "the requirements map names no tests"
    missing = {
        f"{file}::{name}"
        for file, name in named
        if not (ROOT / file).exists() or name not in test_function_names(ROOT / file)
    }
    assert set() == missing


def test_the_testing_notes_name_only_tests_that_exist() -> None:
    """Every `tests/file.py::test_name` in docs/testing.md is a real test function."""
    text = (ROOT / "docs" / "testing.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", text)
    assert named, "docs/testing.md names no tests"
    missing = {
        f"{file}::{name}"
        for file, name in named
        if not (ROOT / file).exists() or name not in test_function_names(ROOT / file)
    }
    assert set() == missing


def test_every_spec_scenario_is_in_the_requirements_map() -> None:
    """Each of the spec's 23 scenarios has a row naming a test of the scenario's own name."""
    text = (ROOT / "docs" / "requirements.md").read_text()
    rows = re.findall(r"^\| ([A-Z][^|]+?) \| (.+) \|$", text, flags=re.MULTILINE)
    rows = [(scenario, tests) for scenario, tests in rows if scenario != "scenario"]
    assert len(rows) == 23
    unnamed = [
        scenario
        for scenario, tests in rows
        if "::test_"
        + re.sub(r"[^a-z0-9]+", "_", scenario.lower().replace("'", "")).strip("_")
        + "`"
        not in tests
    ]
    assert unnamed == []


def test_completion_is_reported() -> None:
    """The roadmap names every capability the spec keeps out of this change as later work."""
    text = (ROOT / "docs" / "roadmap.md").read_text().lower()
    assert "does **not** claim production readiness" in text
    assert [item for item in BOUNDARY if item not in text] == []


def payload_fields(handler: object) -> set[str]:
    """The keys a handler class reads with `.get("key")`: its payload's fields."""
    tree = ast.parse(inspect.getsource(type(handler)))
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    }


def kind_sections() -> dict[str, str]:
    """docs/kinds.md's `## name` sections by name."""
    text = (ROOT / "docs" / "kinds.md").read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_handler_is_documented_in_kinds_md() -> None:
    """Each kind Run loads has a `## kind` section in docs/kinds.md naming every payload field."""
    sections = kind_sections()
    handlers = load_handlers()
    assert {"command", "sleep", "noop"} - set(handlers) == set()
    missing = {
        kind: sorted(payload_fields(handler) - set(re.findall(r"`(\w+)`", sections.get(kind, ""))))
        for kind, handler in handlers.items()
    }
    undocumented = {
        kind: fields for kind, fields in missing.items() if kind not in sections or fields
    }
    assert undocumented == {}


# -- citations of docs/protocol.md ---------------------------------------------------------------

CITING = ("src", "tests", "docs", "bench", "scripts", "README.md")
PROTOCOL = ROOT / "docs" / "protocol.md"

CITATION = re.compile(
    r'protocol\.md(?:\]\([^)]*\))?,\s*((?:"[^"\n]{1,60}"(?:\s*,\s*|\s+and\s+|\s+to\s+)?)+)'
)
"""`docs/protocol.md, "Claims", "Acks" and "Results"` (or `[protocol.md](protocol.md), "..."`):
the names of the sections cited."""
BY_NUMBER = re.compile(r"protocol\.md(?:\]\([^)]*\))?[,:]?\s*(?:items?\s*|section\s*|§\s*)?\d")
"""A citation of the old numbered items (`docs/protocol.md 83`, `protocol.md, item 18`)."""
MISSING_FILE = "PROTOCOL" + ".md"
"""The wire contract's first text, which was never in the repository (built here so that this
file does not name it)."""


def citing_files() -> list[Path]:
    """Every text file that may cite docs/protocol.md, but this one (its planted citations)."""
    found: list[Path] = []
    for name in CITING:
        path = ROOT / name
        found += [path] if path.is_file() else sorted(path.rglob("*"))
    return [
        path
        for path in found
        if path.is_file()
        and path.suffix in {".py", ".md", ".sh", ".toml", ".txt", ".html"}
        and path != Path(__file__).resolve()
    ]


def flat(path: Path) -> str:
    """The file's text on one line: a citation may wrap, in a comment (`#`) or not."""
    text = path.read_text(errors="replace")
    if path.suffix == ".py":
        text = re.sub(r"\n[ \t]*#[ \t]*", " ", text)
    return " ".join(text.split())


def cited_sections(text: str) -> list[str]:
    return [name for run in CITATION.findall(text) for name in re.findall(r'"([^"]+)"', run)]


def protocol_headings() -> set[str]:
    return set(re.findall(r"^#{2,4} (.+)$", PROTOCOL.read_text(), flags=re.MULTILINE))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation gone, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_a_citation_is_read_by_its_section_names_and_one_by_number_is_caught() -> None:
    """The readers below on planted text: names are found however the citation runs, and the
    old numbered form is caught in each of its spellings."""
    assert cited_sections(
        'see docs/protocol.md, "Claims", "Acks" and "Results"; and [protocol.md](protocol.md), '
        '"Edge" (not "Quoted later") or docs/protocol.md, "Signing" to "Artifacts".'
    ) == ["Claims", "Acks", "Results", "Edge", "Signing", "Artifacts"]
    for old in ("docs/protocol.md 83", "protocol.md, 41", "[protocol.md](protocol.md) item 18"):
        assert BY_NUMBER.search(old), old
    assert not BY_NUMBER.search('docs/protocol.md, "Claims"')


def test_every_section_of_docs_protocol_md_that_is_cited_is_one_of_its_headings() -> None:
    """src/, tests/, docs/, bench/, scripts/ and the README cite the wire contract by section
    name; each name is a heading of docs/protocol.md, and each `#anchor` link into it is one of
    its headings' anchors."""
    headings = protocol_headings()
    anchors = {slug(heading) for heading in headings}
    cited: dict[str, set[str]] = {}
    links: dict[str, set[str]] = {}
    for path in citing_files():
        text = flat(path)
        where = str(path.relative_to(ROOT))
        for name in cited_sections(text):
            cited.setdefault(name, set()).add(where)
        own = re.findall(r"\]\(#([\w-]+)\)", text) if path == PROTOCOL else []
        for anchor in own + re.findall(r"protocol\.md#([\w-]+)", text):
            links.setdefault(anchor, set()).add(where)
    assert len(cited) > 20, "hardly any citation found: has the citation form changed?"
    assert {name: files for name, files in cited.items() if name not in headings} == {}
    assert {anchor: files for anchor, files in links.items() if anchor not in anchors} == {}


def test_nothing_names_a_protocol_file_outside_the_repository_or_an_item_by_number() -> None:
    """The wire contract is docs/protocol.md, by topic: no file names the first text's file, and
    none cites a numbered item (docs/protocol.md has none left, and no `item N` of its own)."""
    offending = {
        str(path.relative_to(ROOT))
        for path in citing_files()
        if MISSING_FILE in path.read_text(errors="replace") or BY_NUMBER.search(flat(path))
    }
    assert offending == set()
    text = PROTOCOL.read_text()
    assert re.findall(r"^\d+[a-z]?\. .{0,40}", text, flags=re.MULTILINE) == []
    assert re.findall(r".{0,40}\b(?:items? \d+|§ ?\d).{0,20}", text) == []


def test_every_heading_of_docs_protocol_md_is_named_once() -> None:
    """Sections are cited by name, so no two share one (`## User API` was there twice)."""
    names = re.findall(r"^#{1,4} (.+)$", PROTOCOL.read_text(), flags=re.MULTILINE)
    assert sorted({name for name in names if names.count(name) > 1}) == []


def test_every_error_code_is_in_the_one_table_of_docs_protocol_md_with_its_status() -> None:
    """`ERROR_TABLE` and docs/protocol.md's "Error codes" list the same codes with the same
    statuses (`rejected` is only the root of job-message rejections, never sent; `/healthz`'s
    `starting` is the one code sent without an error class)."""
    section = PROTOCOL.read_text().split("\n## Error codes\n", 1)[1].split("\n## ", 1)[0]
    documented: set[tuple[int, str]] = set()
    for status, codes in re.findall(r"^\| (\d{3}) \| ([^|]+) \|", section, flags=re.MULTILINE):
        for own_status, code in re.findall(r"(?:(\d{3}) )?`(\w+)`", codes):
            documented.add((int(own_status or status), code))
    sent = {(status, code) for status, code in ERROR_TABLE.values() if code != "rejected"}
    assert (sent - documented, documented - sent) == (set(), {(503, "starting")})
