"""The environment a model server child starts with: glibc keeps freed memory unless told otherwise."""

from __future__ import annotations

import os

from udfserve.services.model_server.launcher import ALLOCATOR_ENV, server_env


def test_a_server_keeps_freed_memory_by_default() -> None:
    env = server_env({"PATH": "/usr/bin"})
    assert env == {
        "PATH": "/usr/bin",
        "MALLOC_MMAP_THRESHOLD_": "33554432",
        "MALLOC_TRIM_THRESHOLD_": "1073741824",
    }


def test_a_value_already_in_the_environment_wins() -> None:
    env = server_env({"MALLOC_TRIM_THRESHOLD_": "268435456"})
    assert env["MALLOC_TRIM_THRESHOLD_"] == "268435456"
    assert env["MALLOC_MMAP_THRESHOLD_"] == ALLOCATOR_ENV["MALLOC_MMAP_THRESHOLD_"]


def test_an_empty_value_leaves_glibcs_default() -> None:
    env = server_env({"MALLOC_MMAP_THRESHOLD_": "", "MALLOC_TRIM_THRESHOLD_": ""})
    assert "MALLOC_MMAP_THRESHOLD_" not in env and "MALLOC_TRIM_THRESHOLD_" not in env


def test_without_an_environment_this_processs_is_used_and_left_unchanged() -> None:
    before = dict(os.environ)
    env = server_env()
    assert dict(os.environ) == before
    others = {name: value for name, value in before.items() if name not in ALLOCATOR_ENV}
    assert {name: value for name, value in env.items() if name not in ALLOCATOR_ENV} == others
