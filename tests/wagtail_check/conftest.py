"""Fixtures of the Wagtail check."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from django.conf import settings


@pytest.fixture(scope="session", autouse=True)
def media_root() -> Iterator[str]:
    """The run's own MEDIA_ROOT (tests.wagtail_check.settings), removed at the end."""
    yield settings.MEDIA_ROOT
    shutil.rmtree(settings.MEDIA_ROOT, ignore_errors=True)
