"""Fixtures the unit tests share."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A fresh event loop for futures a test resolves by hand, run only when a test turns it."""
    new_loop = asyncio.new_event_loop()
    yield new_loop
    new_loop.close()
