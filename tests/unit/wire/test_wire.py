"""Each answer is declared once (moonrun/wire): what the platform sends, the served OpenAPI
document and what Run parses are the same shape, and Run refuses any other with a typed error."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NotRequired

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jsonschema import Draft202012Validator
from typing_extensions import TypedDict, is_typeddict

from moonrun.errors import ForeignAnswer, PlatformUnreachable
from moonrun.http import run_api, user_api
from moonrun.http.api import JsonReply, Route, Stream
from moonrun.wire import error_body, parse, run, user
from moonrun.wire.parse import check_of
from tests.support.http_harness import Cast, SignedRun, http_world, public_key_of
from tests.support.stores import memory_factory

ROUTES = (*run_api.ROUTES, *user_api.ROUTES)
SHAPES = sorted(
    {
        value
        for module in (run, user, error_body)
        for value in vars(module).values()
        if is_typeddict(value) and value.__module__ == module.__name__
    },
    key=lambda shape: shape.__name__,
)


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


# -- declarations ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.__name__)
def test_every_declared_shape_is_one_run_can_parse(shape: type[Any]) -> None:
    """Each shape keeps to the grammar Run's parse knows (compiling its check would fail)."""
    check_of(shape)


def contents(annotation: Any) -> set[Any]:
    """What a handler's return annotation sends as a JSON body (None: no body)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return {content for option in typing.get_args(annotation) for content in contents(option)}
    if typing.get_origin(annotation) is JsonReply:
        return contents(typing.get_args(annotation)[0])
    if annotation in (Stream, type(None)):
        return {None}
    return {annotation}


@pytest.mark.parametrize("route", ROUTES, ids=lambda route: f"{route.method} {route.path}")
def test_each_route_documents_the_shape_its_handler_is_typed_to_return(route: Route) -> None:
    """mypy checks every key and type a handler builds against its return annotation; the
    route documents exactly that annotation's shapes, all declared in moonrun/wire."""
    returned = typing.get_type_hints(route.handler)["return"]
    documented = {route.answer, *(shape for shape, _ in route.also.values())}
    assert contents(returned) == documented
    assert all(
        shape is None or shape.__module__.startswith("moonrun.wire.") for shape in documented
    )


# -- what is sent is what the document says and what Run parses --------------------------------


class Sent:
    """Every answer of a scenario, as sent, with its route."""

    def __init__(self, cast: Cast) -> None:
        self.cast = cast
        self.answers: list[tuple[Route, int, Any]] = []
        self.routes = {(route.method, route.path): route for route in ROUTES}

    def note(self, method: str, template: str, response: Any) -> Any:
        assert response.status_code < 300, response.text
        body = response.json()
        self.answers.append((self.routes[(method, template)], response.status_code, body))
        return body


def every_run_answer(cast: Cast) -> Sent:
    """A scenario that makes every Run route answer, each field of each answer set at least
    once (a cancel intent, a retry, an entry refused in each batch, confirmed, discarded and
    lost attempts)."""
    world, sent = cast.world, Sent(cast)
    owner = cast.owner[1]
    made = world.api("POST", "/api/v1/endpoints", json={"name": "host-c"}).json()
    key = public_key_of(Ed25519PrivateKey.generate())
    joined = world.client.post(
        "/run/v1/join", json={"join_token": made["join_token"], "identity_public_key": key}
    )
    sent.note("POST", "/run/v1/join", joined)
    runner: SignedRun = cast.run
    sent.note("POST", "/run/v1/sessions", runner.register())
    sent.note("POST", "/run/v1/reconcile", runner.reconcile([]))
    sent.note("POST", "/run/v1/heartbeat", runner.heartbeat())
    ids = [world.submit(cast.server_id, owner)["id"] for _ in range(4)]
    claim = runner.post("/run/v1/jobs/claim", {"max_jobs": 4})
    granted = sent.note("POST", "/run/v1/jobs/claim", claim)["jobs"]
    attempts = {grant["job_id"]: grant["attempt"] for grant in granted}
    for grant in granted:
        runner.leases[(grant["job_id"], grant["attempt"])] = grant["lease"]
    failing, cancelled, batched, lost = ids
    world.api("POST", f"/api/v1/jobs/{cancelled}/cancel", token=owner)
    for job_id in (failing, cancelled):
        template = "/run/v1/jobs/{job_id}/ack"
        sent.note("POST", template, runner.ack(job_id, attempts[job_id]))
    unknown = {"job_id": "job_unknown", "attempt": 1, "lease": "mrl_x"}
    acks = [runner.entry(batched, attempts[batched]), unknown]
    sent.note("POST", "/run/v1/jobs/acks", runner.post("/run/v1/jobs/acks", {"acks": acks}))
    progress = runner.progress(failing, attempts[failing], 1, percent=50.0, message="half")
    sent.note("POST", "/run/v1/jobs/{job_id}/progress", progress)
    poll = runner.cancel_poll(cancelled, attempts[cancelled])
    sent.note("POST", "/run/v1/jobs/{job_id}/cancel-poll", poll)
    watched = runner.post("/run/v1/jobs/cancels", {"wait_s": 0})
    assert sent.note("POST", "/run/v1/jobs/cancels", watched)["cancels"], watched.text
    failed = runner.result(failing, attempts[failing], "failed", retryable=True)
    sent.note("POST", "/run/v1/jobs/{job_id}/result", failed)
    results = [
        {**entry, "outcome": "succeeded", "retryable": False}
        for entry in (runner.entry(batched, attempts[batched]), unknown)
    ]
    claiming = {"results": results, "claim": {"max_jobs": 1}}  # "Claims with results"
    answer = runner.post("/run/v1/jobs/results", claiming)
    sent.note("POST", "/run/v1/jobs/results", answer)
    logs = runner.send_logs(cancelled, attempts[cancelled], 1, "a line")
    sent.note("POST", "/run/v1/logs", logs)
    line = {"ts": "2026-11-30T00:00:00.000Z", "stream": "stdout", "text": "another"}
    together = [
        {**runner.entry(cancelled, attempts[cancelled]), "seq": 2, "lines": [line]},
        {
            "job_id": cancelled,
            "attempt": attempts[cancelled] + 1,
            "lease": "lease_not_this_one",
            "seq": 2,
            "lines": [],
        },  # refused alone: its entry's `error`
    ]
    answer = runner.post("/run/v1/logs/batches", {"batches": together})
    sent.note("POST", "/run/v1/logs/batches", answer)
    chunk = runner.put_chunk(cancelled, attempts[cancelled], "out", 0, b"bytes", final=True)
    sent.note("PUT", "/run/v1/artifacts/{job_id}/{attempt}/{name}/{chunk_index}", chunk)
    assert runner.register(boot_id="boot-2").status_code == 201  # a restart: reconcile again
    entries = [runner.entry(cancelled, attempts[cancelled]), unknown]  # and `lost` left out
    reconciled = sent.note("POST", "/run/v1/reconcile", runner.reconcile(entries))
    assert [attempt["job_id"] for attempt in reconciled["lost"]] == [lost]
    sent.note("POST", "/run/v1/sessions/end", runner.post("/run/v1/sessions/end", {}))
    return sent


def keys_seen(
    schema: Any, value: Any, components: dict[str, Any], seen: dict[str, set[str]]
) -> None:
    """Note, for each declared object `value` holds (walked along its schema), which of its
    properties it had."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        if isinstance(value, dict):
            seen.setdefault(name, set()).update(value)
        keys_seen(components[name], value, components, seen)
    elif "anyOf" in schema:
        for option in schema["anyOf"]:
            if (value is None) == (option.get("type") == "null"):
                keys_seen(option, value, components, seen)
    elif schema.get("type") == "array":
        for item in value:
            keys_seen(schema["items"], item, components, seen)
    elif schema.get("type") == "object":
        for name, property_schema in schema.get("properties", {}).items():
            if name in value:
                keys_seen(property_schema, value[name], components, seen)


def check_answers(cast: Cast, answers: list[tuple[Route, int, Any]]) -> dict[str, set[str]]:
    """Every answer fits its route's schema in the served document (objects closed, required
    keys required) and parses as Run reads it; which properties each declared object had."""
    document = cast.world.client.get("/openapi.json").json()
    components = document["components"]["schemas"]
    seen: dict[str, set[str]] = {}
    for route, status, body in answers:
        operation = document["paths"][route.path][route.method.lower()]
        schema = operation["responses"][str(status)]["content"]["application/json"]["schema"]
        validator = Draft202012Validator({**schema, "components": document["components"]})
        problems = [error.message for error in validator.iter_errors(body)]
        assert problems == [], f"{route.method} {route.path}"
        documented = route.answer if status == route.status else route.also[status][0]
        assert body is parse.parse(documented, body, route.path)
        keys_seen(schema, body, components, seen)
    return seen


def test_every_run_answer_is_its_documented_shape_exactly_and_parses_as_run_reads_it(
    cast: Cast,
) -> None:
    """Each Run route's answer, as sent, fits the served document's schema for it (no key it
    does not name, none it requires missing, each of its type) and Run's parse of its declared
    shape; every key any shape declares is sent by some answer."""
    sent = every_run_answer(cast)
    seen = check_answers(cast, sent.answers)

    answered = {(route.method, route.path) for route, _, _ in sent.answers}
    assert {(route.method, route.path) for route in run_api.ROUTES} == answered
    components = cast.world.client.get("/openapi.json").json()["components"]["schemas"]
    unsent = {
        name: set(components[name]["properties"]) - keys
        for name, keys in seen.items()
        if set(components[name]["properties"]) - keys
    }
    assert {"ErrorDetail": {"fields"}} == unsent  # fields: only with invalid_payload


def test_every_job_view_is_its_documented_shape_exactly(cast: Cast) -> None:
    """Jobs that failed, retry, were cancelled and were lost in reconciliation, read, listed
    (with their payloads too) and cancelled in bulk: each answer fits the document's schema,
    and every key of JobView, its parts and the bulk cancel's entries is sent."""
    world, runner, owner = cast.world, cast.run.start(), cast.owner[1]
    once = {"max_attempts": 1}
    failed, retrying, cancelled = (
        world.submit(cast.server_id, owner, **once)["id"],
        world.submit(cast.server_id, owner)["id"],
        world.submit(cast.server_id, owner)["id"],
    )
    lost = world.submit(cast.server_id, owner)["id"]
    attempts = {grant["job_id"]: grant["attempt"] for grant in runner.claim(4)}
    for job_id in (failed, retrying, cancelled):
        assert runner.ack(job_id, attempts[job_id]).status_code == 200
    assert (
        runner.progress(failed, attempts[failed], 1, percent=10.0, message="m").status_code == 200
    )
    error = {"code": "exit_status", "message": "exit 1"}
    for job_id in (failed, retrying):
        answer = runner.result(job_id, attempts[job_id], "failed", retryable=True, error=error)
        assert answer.status_code == 200
    assert world.api("POST", f"/api/v1/jobs/{cancelled}/cancel", token=owner).status_code == 202
    assert runner.result(cancelled, attempts[cancelled], "cancelled").status_code == 200
    assert runner.register(boot_id="boot-2").status_code == 201
    assert runner.reconcile([]).status_code == 200  # `lost` was left out: lost
    sent = Sent(cast)
    for job_id in (failed, retrying, cancelled, lost):
        sent.note("GET", "/api/v1/jobs/{job_id}", world.api("GET", f"/api/v1/jobs/{job_id}"))
    sent.note("GET", "/api/v1/jobs", world.api("GET", "/api/v1/jobs"))
    for path in (f"/api/v1/jobs/{failed}", "/api/v1/jobs"):  # with their payloads
        sent.note(
            "GET", path.replace(failed, "{job_id}"), world.api("GET", f"{path}?include=payload")
        )
    queued = world.submit(cast.server_id, owner)["id"]
    bulk = world.api("POST", "/api/v1/jobs/cancel", json={"job_ids": [queued, "job_unknown"]})
    sent.note("POST", "/api/v1/jobs/cancel", bulk)

    seen = check_answers(cast, sent.answers)

    declared = {
        shape.__name__: set(typing.get_type_hints(shape))
        for shape in (
            user.JobView,
            user.RetryView,
            user.LastFailureView,
            user.ProgressView,
            user.CancelView,
            user.TerminalView,
            user.TerminalErrorView,
            user.ReconcileView,
            user.PastAttemptView,
            user.CancelEntry,
        )
    }
    assert declared == {name: seen.get(name, set()) for name in declared}


# -- Run's parse ---------------------------------------------------------------------------------


class Part(TypedDict):
    name: str
    size: int


class Whole(TypedDict):
    id: str
    ratio: float
    done: bool
    note: str | None
    parts: list[Part]
    extra: Any
    later: NotRequired[int]


WHOLE: dict[str, Any] = {
    "id": "w",
    "ratio": 0.5,
    "done": False,
    "note": None,
    "parts": [{"name": "a", "size": 1}],
    "extra": {"anything": [1]},
}


def test_a_value_of_its_shape_parses_as_itself_more_keys_and_all() -> None:
    """The value itself comes back (no copy); a key the shape does not name is left alone (a
    newer platform may send more); a NotRequired key may be absent; a float may be written as
    an integer."""
    value = {**WHOLE, "ratio": 1, "newer": True}
    assert parse.parse(Whole, value, "GET /whole") is value


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({**WHOLE, "id": None}, " at id: expected a string, got null"),
        ({k: v for k, v in WHOLE.items() if k != "done"}, " at done: missing"),
        ({**WHOLE, "done": 0}, " at done: expected a boolean, got an integer"),
        ({**WHOLE, "note": 5}, " at note: expected a string or null, got an integer"),
        (
            {**WHOLE, "parts": [{"name": "a", "size": True}]},
            " at parts[0].size: expected an integer, got a boolean",
        ),
        ({**WHOLE, "parts": {}}, " at parts: expected an array, got an object"),
        ({**WHOLE, "ratio": "0.5"}, " at ratio: expected a number, got a string"),
        ({**WHOLE, "later": 1.5}, " at later: expected an integer, got a number"),
        ([WHOLE], ": expected an object, got an array"),
        (None, ": expected an object, got null"),
    ],
    ids=[
        "null",
        "missing",
        "bool",
        "optional",
        "nested",
        "array",
        "number",
        "later",
        "array of",
        "none",
    ],
)
def test_a_value_of_another_shape_is_a_foreign_answer_naming_the_field(
    value: Any, named: str
) -> None:
    """Refused with ForeignAnswer (a kind of Unreachable: as good as no answer), which names
    the first field that does not fit and its JSON type, never its value."""
    with pytest.raises(ForeignAnswer) as raised:
        parse.parse(Whole, value, "GET /whole")
    assert isinstance(raised.value, PlatformUnreachable)
    assert str(raised.value).endswith(f"GET /whole in a foreign shape{named}")
    assert "0.5" not in str(raised.value)


def test_a_shape_outside_the_grammar_is_refused_when_its_check_is_compiled() -> None:
    """A declaration Run could not check (here a set) fails at once, not in the field."""

    class Loose(TypedDict):
        table: set[str]

    with pytest.raises(TypeError, match="outside the wire shapes' grammar"):
        check_of(Loose)
