"""The browser the dashboard's browser tests drive (:mod:`dashboard_browser`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dashboard_browser import chromium


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver
