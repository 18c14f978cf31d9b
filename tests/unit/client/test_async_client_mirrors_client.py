"""`AsyncClient` has every public method of `Client`, with the same signature: a coroutine
where `Client`'s returns a value, an async iterator where it returns an iterator (issue 28,
point 11); it is built like `Client` (the constructor's options, `from_env`, `from_profile`)
and used as an async context manager."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import httpx
import pytest

import moonrun.client
from moonrun.client import AsyncClient, Client, profiles
from moonrun.errors import Unauthenticated


def public(cls: type) -> dict[str, Any]:
    return {
        name: getattr(cls, name)
        for name in dir(cls)
        if not name.startswith("_") and callable(getattr(cls, name))
    }


def is_classmethod(cls: type, name: str) -> bool:
    return isinstance(inspect.getattr_static(cls, name), classmethod)


def test_every_public_method_of_client_is_on_async_client_and_nothing_else_but_aclose() -> None:
    assert set(public(Client)) - set(public(AsyncClient)) == set()
    assert set(public(AsyncClient)) - set(public(Client)) == {"aclose"}


def test_each_method_takes_the_same_parameters_and_answers_the_same_records() -> None:
    """Parameters (names, kinds, defaults, annotations) equal; the return annotation equal,
    but `AsyncIterator[X]` for `Iterator[X]`."""
    mismatched = []
    for name, method in public(Client).items():
        sync, asynchronous = (
            inspect.signature(method),
            inspect.signature(getattr(AsyncClient, name)),
        )
        returns = str(sync.return_annotation).replace("Iterator[", "AsyncIterator[")
        if (sync.parameters, returns) != (asynchronous.parameters, asynchronous.return_annotation):
            mismatched.append(f"{name}{sync} / {name}{asynchronous}")
    assert mismatched == []


def test_methods_are_coroutines_or_async_iterators_where_client_returns_iterators() -> None:
    kinds = {}
    for name, method in public(Client).items():
        twin = getattr(AsyncClient, name)
        if is_classmethod(Client, name):
            kinds[name] = ("classmethod", is_classmethod(AsyncClient, name))
        elif str(inspect.signature(method).return_annotation).startswith("Iterator["):
            kinds[name] = ("iterator", inspect.isasyncgenfunction(twin))
        else:
            kinds[name] = ("coroutine", inspect.iscoroutinefunction(twin))
    assert {name for name, (_, alike) in kinds.items() if not alike} == set()
    assert {name for name, (kind, _) in kinds.items() if kind == "iterator"} == {"jobs", "logs"}
    assert {name for name, (kind, _) in kinds.items() if kind == "classmethod"} == {
        "from_env",
        "from_profile",
    }


def test_the_constructors_take_the_same_options_and_each_method_says_what_clients_does() -> None:
    """Only the transport's and the sleep's types differ (async ones)."""
    sync = inspect.signature(Client.__init__).parameters
    asynchronous = inspect.signature(AsyncClient.__init__).parameters
    assert list(sync) == list(asynchronous)
    defaults = {n for n in sync if sync[n].default != asynchronous[n].default}
    assert defaults == {"sleep"}  # time.sleep, asyncio.sleep
    differ = {n for n in sync if sync[n].annotation != asynchronous[n].annotation}
    assert differ == {"transport", "sleep"}
    undocumented = {
        name
        for name, method in public(AsyncClient).items()
        if name != "aclose" and method.__doc__ != getattr(Client, name).__doc__
    }
    assert undocumented == set()


def test_async_client_is_exported_where_client_is() -> None:
    assert moonrun.client.AsyncClient is AsyncClient
    assert "AsyncClient" in moonrun.client.__all__


def test_an_async_client_comes_from_the_environment_or_a_profile(tmp_path: Path) -> None:
    environ = {"MOONRUN_PLATFORM": "http://127.0.0.1:8470", "MOONRUN_TOKEN": "mru_x"}
    config = {"XDG_CONFIG_HOME": str(tmp_path)}
    path = profiles.config_path(profiles.config_home(config))
    profiles.save(path, {"ci": profiles.Profile("https://moonrun.example", "mru_ci")})

    async def build() -> list[tuple[str, float, str]]:
        made = []
        async with AsyncClient.from_env(environ, timeout_s=5) as client:
            made.append((client.platform, client.timeout_s, repr(client)))
        async with AsyncClient.from_profile("ci", environ=config) as client:
            made.append((client.platform, client.timeout_s, repr(client)))
        return made

    assert asyncio.run(build()) == [
        ("http://127.0.0.1:8470", 5, "AsyncClient('http://127.0.0.1:8470')"),
        ("https://moonrun.example", 30.0, "AsyncClient('https://moonrun.example')"),
    ]
    with pytest.raises(Unauthenticated, match="MOONRUN_PLATFORM and MOONRUN_TOKEN"):
        AsyncClient.from_env({"MOONRUN_PLATFORM": "http://127.0.0.1:8470"})
    with pytest.raises(Unauthenticated, match="no profile 'default'"):
        AsyncClient.from_profile(environ=config)


def test_async_with_closes_the_client_and_its_transport() -> None:
    closed: list[str] = []

    class Closing(httpx.MockTransport):
        async def aclose(self) -> None:
            closed.append("transport")

    transport = Closing(lambda request: httpx.Response(200, json={}))

    async def use() -> None:
        async with AsyncClient("http://platform", "t", transport=transport):
            pass

    asyncio.run(use())
    assert closed == ["transport"]
