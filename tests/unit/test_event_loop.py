"""Which event loop a server runs on: uvloop when installed, asyncio's own on request."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from udfserve.services.model_server.event_loop import EventLoopUnavailable, resolve, run, running_loop_kind


def test_auto_takes_uvloop_where_it_is_installed() -> None:
    assert resolve("auto") == "uvloop"


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what Python records for a package it cannot import
    assert resolve("auto") == "asyncio"


def test_asyncio_is_kept_even_where_uvloop_is_installed() -> None:
    assert resolve("asyncio") == "asyncio"


def test_required_uvloop_missing_names_the_package_and_the_alternatives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(EventLoopUnavailable, match=r"uvloop package is not installed.*auto or asyncio"):
        resolve("uvloop")


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_run_runs_the_coroutine_on_the_loop_it_was_given(kind: str) -> None:
    async def report() -> tuple[str, type]:
        return running_loop_kind(), type(asyncio.get_running_loop())

    name, loop_type = run(report(), kind)  # type: ignore[arg-type]
    assert name == kind
    assert (loop_type is uvloop.Loop) == (kind == "uvloop")
