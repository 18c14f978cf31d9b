"""Jobs are checked at submit against what their server's Run advertised (docs/protocol.md,
"Kinds").

The checker itself (`moonrun.scheduling.jsonschema_subset`) is pure; the HTTP tests play a Run that
advertises kinds at registration, then submit as the server's owner.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx2 as httpx
import pytest

from moonrun.errors import InvalidPayload, InvalidRequest, TooLarge, UnknownKind
from moonrun.run.handlers import ANY_PAYLOAD, advertised_kinds, load_handlers, refuse_payload
from moonrun.run.handlers.command import PAYLOAD_SCHEMA as COMMAND
from moonrun.run.handlers.sleep import PAYLOAD_SCHEMA as SLEEP
from moonrun.scheduling.jsonschema_subset import (
    Problem,
    compile_schema,
    payload_problems,
    schema_problems,
)
from moonrun.scheduling.kinds import MAX_KINDS, check_advertisement, check_job
from tests.support.http_harness import Cast, http_world
from tests.support.stores import file_factory, memory_factory

BUILT_INS = {"command": COMMAND, "noop": ANY_PAYLOAD, "sleep": SLEEP}


def problems(schema: Any, payload: Any) -> list[tuple[str, str]]:
    return [(p.field, p.message) for p in payload_problems(schema, payload)]


# -- the checker -------------------------------------------------------------------------------


def test_a_payload_that_fits_its_schema_has_no_problems() -> None:
    """A command with argv, a timeout and artifacts fits the command schema."""
    payload = {
        "argv": ["sh", "-c", "echo hi > out.txt"],
        "timeout_s": 30,
        "artifacts": [{"path": "out.txt", "name": "out.txt"}],
    }
    assert problems(COMMAND, payload) == []


@pytest.mark.parametrize(
    ("schema", "payload", "expected"),
    [
        (COMMAND, {"argv": "echo hi"}, [("argv", "must be an array, not a string")]),
        (COMMAND, {}, [("argv", "is required")]),
        (COMMAND, {"argv": []}, [("argv", "must hold at least 1 item")]),
        (COMMAND, {"argv": ["echo", 3]}, [("argv[1]", "must be a string, not an integer")]),
        (COMMAND, {"argv": ["true"], "timeout_s": 0}, [("timeout_s", "must be more than 0")]),
        (
            COMMAND,
            {"argv": ["true"], "timeout": 5},
            [("timeout", "is not a field of this kind (fields: argv, artifacts, timeout_s)")],
        ),
        (
            COMMAND,
            {"argv": ["true"], "artifacts": [{"path": "a"}]},
            [("artifacts[0].name", "is required")],
        ),
        (SLEEP, {"seconds": -1}, [("seconds", "must be at least 0")]),
        (SLEEP, {"seconds": True}, [("seconds", "must be a number, not a boolean")]),
        (SLEEP, {"seconds": 604_801}, [("seconds", "must be at most 604800")]),
        (SLEEP, {"fail": "sometimes"}, [("fail", 'must be one of "retryable", "fatal", null')]),
        (SLEEP, ["seconds", 1], [("", "must be an object, not an array")]),
    ],
    ids=repr,
)
def test_each_misfit_is_named_by_its_field(
    schema: Any, payload: Any, expected: list[tuple[str, str]]
) -> None:
    """Every problem says which field (from the payload's top) and what is wrong with it."""
    assert expected == problems(schema, payload)


def test_a_problem_describes_itself_from_the_payload() -> None:
    """`payload.argv[1] must be ...`: the whole path, as the error message says it."""
    described = [
        Problem("argv[1]", "must be a string").describe(),
        Problem("", "must be an object").describe(),
    ]
    assert described == ["payload.argv[1] must be a string", "payload must be an object"]


def test_a_field_name_that_is_not_plain_is_shown_escaped_and_cut() -> None:
    """A key with spaces, control characters or 100 kB is named as short escaped JSON."""
    closed = {"type": "object", "additionalProperties": False}
    names = [p.field for p in payload_problems(closed, {"a b": 1, "\x1b[2J": 2, "k" * 100_000: 3})]
    expected = ['["a b"]', '["\\u001b[2J"]', '["' + "k" * 64 + '..."]']
    assert expected == names


def test_json_equality_keeps_booleans_apart_from_numbers() -> None:
    """`true` is not `1` (as Python would say), while `1` is `1.0`."""
    schema = {"enum": [1, "x"]}
    verdicts = [problems(schema, value) == [] for value in (True, 1.0, 1, "x", False)]
    assert verdicts == [False, True, True, True, False]


def test_keywords_the_checker_does_not_know_are_ignored() -> None:
    """`pattern` (a hostile Run's regular expression) and `format` are never evaluated."""
    schema = {"type": "string", "pattern": "^(a+)+$", "format": "email", "title": "x"}
    assert problems(schema, "a" * 64 + "!") == []


def test_local_refs_and_any_of_are_followed_as_pydantic_writes_them() -> None:
    """A schema with `$defs`, `$ref` and `anyOf` (an optional nested model) is checked."""
    schema = {
        "$defs": {"Target": {"type": "object", "properties": {"host": {"type": "string"}}}},
        "type": "object",
        "required": ["target"],
        "properties": {"target": {"anyOf": [{"$ref": "#/$defs/Target"}, {"type": "null"}]}},
    }
    fits = [problems(schema, {"target": {"host": "a"}}), problems(schema, {"target": None})]
    misfit = problems(schema, {"target": {"host": 1}})
    assert (fits, misfit) == ([[], []], [("target", "matches none of the forms this kind allows")])


def test_one_of_needs_exactly_one_match_and_not_none() -> None:
    """`oneOf` refuses a value that fits two forms; `not` refuses one that fits its form."""
    one_of = {"oneOf": [{"type": "number"}, {"type": "integer"}]}
    never_null = {"not": {"type": "null"}}
    found = [problems(one_of, 1.5), problems(one_of, 2), problems(never_null, None)]
    expected = [
        [],
        [("", "matches more than one of the forms this kind allows")],
        [("", "has a form this kind does not allow")],
    ]
    assert expected == found


def test_a_schema_that_refers_to_itself_forever_gives_up_and_accepts() -> None:
    """A `$ref` cycle that never reaches the payload ends at the depth bound: accepted."""
    schema = {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "$ref": "#/$defs/a",
    }
    assert problems(schema, {"anything": 1}) == []


def test_a_schema_that_branches_exponentially_gives_up_within_its_budget() -> None:
    """Forty levels of two-way `anyOf` ending in `false` would take 2^40 steps: the check
    stops at its step budget and accepts (Run checks again before running)."""
    defs: dict[str, Any] = {"level40": False}
    for n in range(40):
        below = {"$ref": f"#/$defs/level{n + 1}"}
        defs[f"level{n}"] = {"anyOf": [below, below]}
    schema = {"$defs": defs, "$ref": "#/$defs/level0"}
    assert problems(schema, 1) == []


def test_without_an_advertisement_every_job_is_accepted() -> None:
    """`None` (an older Run, or one that never registered) checks nothing."""
    check_job(None, "comand", {"argv": "echo hi"})


def test_an_unknown_kind_names_the_kinds_there_are_and_the_closest() -> None:
    """`comand` on a Run of command, noop and sleep: did you mean 'command'?"""
    with pytest.raises(UnknownKind) as refused:
        check_job(BUILT_INS, "comand", {})
    expected = (
        "this server's Run does not run 'comand' jobs (did you mean 'command'?); "
        "it runs command, noop, sleep"
    )
    assert expected == refused.value.message


def test_an_invalid_payload_carries_each_field() -> None:
    """InvalidPayload's message says every problem; its fields list them one by one."""
    with pytest.raises(InvalidPayload) as refused:
        check_job(BUILT_INS, "command", {"argv": ["x", 1], "extra": True})
    fields = (
        ("argv[1]", "must be a string, not an integer"),
        ("extra", "is not a field of this kind (fields: argv, artifacts, timeout_s)"),
    )
    assert fields == refused.value.fields
    assert refused.value.message.startswith("payload.argv[1] must be a string")


@pytest.mark.parametrize(
    ("kinds", "error"),
    [
        (["noop"], InvalidRequest),
        ({"Bad Kind": {}}, InvalidRequest),
        ({f"k{n}": {} for n in range(MAX_KINDS + 1)}, InvalidRequest),
        ({"noop": {"type": "str"}}, InvalidRequest),
        ({"noop": {"required": "argv"}}, InvalidRequest),
        ({"noop": {"$ref": "#/$defs/missing"}}, InvalidRequest),
        ({"noop": {"minItems": -1}}, InvalidRequest),
        ({"noop": {"description": "x" * 20_000}}, TooLarge),
        ({"noop": {"anyOf": []}}, InvalidRequest),
    ],
    ids=[
        "not an object",
        "bad kind name",
        "too many kinds",
        "unknown type",
        "required not a list",
        "dangling ref",
        "negative bound",
        "schema too large",
        "empty anyOf",
    ],
)
def test_a_malformed_advertisement_is_refused(kinds: Any, error: type[Exception]) -> None:
    """What a Run advertises is checked like any input: a typed error, never stored."""
    with pytest.raises(error):
        check_advertisement(kinds)


def test_every_built_in_schema_is_usable_and_advertised() -> None:
    """The built-in handlers' schemas pass the platform's checks, and Run advertises them."""
    advertised = advertised_kinds(load_handlers())
    assert advertised == BUILT_INS
    assert {kind: [] for kind in BUILT_INS} == {k: schema_problems(s) for k, s in BUILT_INS.items()}


# -- Run: handlers declare, Run advertises ----------------------------------------------------


class Greet:
    """A plugin handler that declares its own payload schema."""

    resumable = True
    payload_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string", "minLength": 1}},
    }


class Undeclared:
    """A plugin handler that declares no schema."""

    resumable = True


class Broken:
    """A plugin handler whose schema the platform would refuse."""

    resumable = True
    payload_schema: ClassVar[dict[str, Any]] = {"type": "text"}


def test_a_plugin_handler_advertises_the_schema_it_declares(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its own schema; none declared is any object; an unusable one is any object, warned."""
    handlers: Any = {"greet": Greet(), "plain": Undeclared(), "broken": Broken()}
    with caplog.at_level(logging.WARNING, logger="moonrun.run.handlers"):
        advertised = advertised_kinds(handlers)
    expected = {"broken": ANY_PAYLOAD, "greet": Greet.payload_schema, "plain": ANY_PAYLOAD}
    assert expected == advertised
    assert [r.getMessage() for r in caplog.records] == ["handler payload schema not advertised"]


def test_too_many_handlers_advertise_nothing() -> None:
    """Past MAX_KINDS kinds Run advertises nothing rather than leave kinds out (which the
    platform would refuse as unknown)."""
    handlers: Any = {f"kind{n}": Undeclared() for n in range(MAX_KINDS + 1)}
    assert advertised_kinds(handlers) is None


def test_run_refuses_a_payload_that_does_not_fit_as_bad_payload() -> None:
    """The same check on the host: failed, bad_payload, naming the field, not retryable."""
    refused = refuse_payload(compile_schema(Greet.payload_schema), {"name": ""})
    assert refused is not None
    expected = ("failed", False, "bad_payload", "payload.name must be at least 1 character long")
    assert expected == (refused.outcome, refused.retryable, *refused.error.values())


# -- over HTTP -----------------------------------------------------------------------------------


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def submit(cast: Cast, body: dict[str, Any]) -> httpx.Response:
    path = f"/api/v1/servers/{cast.server_id}/jobs"
    return cast.world.api("POST", path, token=cast.owner[1], json=body)


def error_of(response: httpx.Response) -> tuple[int, str, dict[str, Any]]:
    error: dict[str, Any] = response.json()["error"]
    return response.status_code, error["code"], error


def test_jobs_that_do_not_fit_the_advertised_kinds_are_422_at_submit(cast: Cast) -> None:
    """After the Run advertised: a misspelt kind is unknown_kind, a bad argv is
    invalid_payload naming `argv`; nothing is queued; a job that fits is 201."""
    cast.run.start(kinds=BUILT_INS)
    misspelt = submit(cast, {"kind": "comand"})
    bad_argv = submit(cast, {"kind": "command", "payload": {"argv": "echo hi"}})
    fits = submit(cast, {"kind": "command", "payload": {"argv": ["echo", "hi"]}})
    listed = cast.world.api("GET", "/api/v1/jobs", token=cast.owner[1]).json()["jobs"]

    status, code, _ = error_of(misspelt)
    assert (status, code) == (422, "unknown_kind")
    status, code, error = error_of(bad_argv)
    assert (status, code) == (422, "invalid_payload")
    assert error["fields"] == [{"field": "argv", "message": "must be an array, not a string"}]
    assert error["message"] == "payload.argv must be an array, not a string"
    assert [fits.json()["id"]] == [job["id"] for job in listed]


def test_a_run_that_advertised_nothing_has_every_job_accepted(cast: Cast) -> None:
    """An older Run (no `kinds` at registration): the platform checks nothing at submit."""
    cast.run.start()
    response = submit(cast, {"kind": "comand", "payload": {"argv": "echo hi"}})
    assert response.status_code == 201


def test_a_new_registration_replaces_what_was_advertised(cast: Cast) -> None:
    """The kinds a Run advertises at its latest registration are the ones checked; a Run
    that then registers without any clears the check."""
    cast.run.start(kinds={"noop": ANY_PAYLOAD})
    before = submit(cast, {"kind": "sleep"}).status_code
    cast.run.register(boot_id="boot-2", kinds={"noop": ANY_PAYLOAD, "sleep": SLEEP})
    after = submit(cast, {"kind": "sleep"}).status_code
    cast.run.register(boot_id="boot-3")
    older = submit(cast, {"kind": "anything"}).status_code
    assert (before, after, older) == (422, 201, 201)


def test_a_batch_names_the_job_that_does_not_fit_and_queues_none(cast: Cast) -> None:
    """In a batch the refusal names `jobs[i]`, and no job of the batch is queued."""
    cast.run.start(kinds=BUILT_INS)
    jobs = [{"kind": "noop"}, {"kind": "sleep", "payload": {"seconds": "5"}}]
    path = f"/api/v1/servers/{cast.server_id}/jobs/batch"
    response = cast.world.api("POST", path, token=cast.owner[1], json={"jobs": jobs})
    listed = cast.world.api("GET", "/api/v1/jobs", token=cast.owner[1]).json()["jobs"]

    status, code, error = error_of(response)
    assert (status, code) == (422, "invalid_payload")
    assert error["fields"] == [
        {"field": "jobs[1].seconds", "message": "must be a number, not a string"}
    ]
    assert listed == []


def test_a_malformed_advertisement_is_refused_at_registration(cast: Cast) -> None:
    """A registration whose kinds are not usable is 422 and makes no session."""
    response = cast.run.register(kinds={"noop": {"type": "text"}})
    status, code, _ = error_of(response)
    assert (status, code) == (422, "invalid_request")
    assert (cast.run.generation, cast.run.session_id) == (0, "")


def test_the_advertised_kinds_are_readable_by_who_may_submit(cast: Cast) -> None:
    """`GET /servers/{id}/kinds` lists each kind with its schema, sorted, for the owner."""
    path = f"/api/v1/servers/{cast.server_id}/kinds"
    unadvertised = cast.world.api("GET", path, token=cast.owner[1]).json()
    cast.run.start(kinds=BUILT_INS)
    advertised = cast.world.api("GET", path, token=cast.owner[1]).json()

    assert unadvertised == {"advertised": False, "advertised_at": None, "kinds": []}
    listed = [(kind["kind"], kind["payload_schema"]) for kind in advertised["kinds"]]
    assert sorted(BUILT_INS.items()) == listed
    assert advertised["advertised"] is True


def test_what_was_advertised_survives_a_platform_restart(tmp_path: Path) -> None:
    """The advertisement is in the store: a restarted platform checks jobs just the same."""
    with http_world(file_factory(lambda: tmp_path), tmp_path) as cast:
        cast.run.start(kinds=BUILT_INS)
        cast.world.restart()
        response = submit(cast, {"kind": "command", "payload": {"argv": "echo hi"}})
    assert error_of(response)[:2] == (422, "invalid_payload")


# -- finding jobs, and running one again ---------------------------------------------------------


def test_jobs_are_found_by_kind_and_by_id_prefix(cast: Cast) -> None:
    """`kind=` lists that kind only; `id_prefix=` the jobs whose id starts with it."""
    owner = cast.owner[1]
    sleep = cast.world.submit(cast.server_id, owner, kind="sleep")
    noop = cast.world.submit(cast.server_id, owner, kind="noop")

    def listed(query: str) -> list[str]:
        answer = cast.world.api("GET", f"/api/v1/jobs?{query}", token=owner).json()
        return [job["id"] for job in answer["jobs"]]

    assert [sleep["id"]] == listed("kind=sleep")
    assert [noop["id"]] == listed(f"id_prefix={noop['id'][:9]}&kind=noop")
    assert [noop["id"]] == listed(f"id_prefix={noop['id']}")


@pytest.mark.parametrize(
    "query", ["id_prefix=job_", "id_prefix=job_a%2Fb", "kind=Not%20A%20Kind", "kind="]
)
def test_a_search_too_broad_or_malformed_is_422(cast: Cast, query: str) -> None:
    """An id prefix must hold job_ and three more characters; a kind must be a kind name."""
    response = cast.world.api("GET", f"/api/v1/jobs?{query}")
    assert error_of(response)[:2] == (422, "invalid_request")


def test_a_finished_job_runs_again_as_a_new_job_with_its_payload(cast: Cast) -> None:
    """Rerun queues a new job on the same server with the same kind, payload and policy;
    the same Idempotency-Key gives the same new job."""
    owner = cast.owner[1]
    body = {
        "kind": "sleep",
        "payload": {"seconds": 2},
        "max_attempts": 2,
        "backoff": {"initial_s": 3, "multiplier": 4, "max_s": 50},
    }
    old = cast.world.submit(cast.server_id, owner, **body)
    cast.world.api("POST", f"/api/v1/jobs/{old['id']}/cancel", token=owner)
    headers = {"Idempotency-Key": "rerun-1"}
    path = f"/api/v1/jobs/{old['id']}/rerun"
    first = cast.world.api("POST", path, token=owner, headers=headers)
    again = cast.world.api("POST", path, token=owner, headers=headers)

    new = first.json()
    assert (201, 201, new["id"]) == (first.status_code, again.status_code, again.json()["id"])
    policy = {k: old["retry"][k] for k in ("initial_s", "multiplier", "max_s")}
    same = ("sleep", cast.server_id, "queued", 2, policy)
    assert same == (
        new["kind"],
        new["server_id"],
        new["state"],
        new["max_attempts"],
        {k: new["retry"][k] for k in policy},
    )
    assert cast.world.stored(old["id"]).payload() == cast.world.stored(new["id"]).payload()
    assert new["id"] != old["id"]


def test_a_job_that_has_not_ended_cannot_be_rerun(cast: Cast) -> None:
    """Rerunning a queued job is 409 job_not_finished, and queues nothing."""
    job = cast.world.submit(cast.server_id, cast.owner[1])
    response = cast.world.api("POST", f"/api/v1/jobs/{job['id']}/rerun", token=cast.owner[1])
    listed = cast.world.api("GET", "/api/v1/jobs", token=cast.owner[1]).json()["jobs"]
    assert (error_of(response)[:2], len(listed)) == ((409, "job_not_finished"), 1)


def test_a_rerun_is_checked_against_what_the_run_advertises_now(cast: Cast) -> None:
    """A job queued before its Run advertised, rerun after, is refused if it does not fit."""
    old = cast.world.submit(cast.server_id, cast.owner[1], kind="comand")
    cast.world.api("POST", f"/api/v1/jobs/{old['id']}/cancel", token=cast.owner[1])
    cast.run.start(kinds=BUILT_INS)
    response = cast.world.api("POST", f"/api/v1/jobs/{old['id']}/rerun", token=cast.owner[1])
    assert error_of(response)[:2] == (422, "unknown_kind")
