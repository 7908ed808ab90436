"""The skips a CI run may have, each with its reason; any other skip fails the run.

A skipped test proves nothing, so CI (`CI=true`) must know each one it sees. A test
skips only where what it needs cannot exist in that environment (Django 5.2 has no
`django.tasks`); a test whose tool is merely missing (Chromium, PgBouncer, root for a
private PostgreSQL cluster) skips on a developer's machine and fails in CI, except on the
embedded PostgreSQL (`tests/embedded_server.py`): that server means a bare machine, where
such tools are not expected. Each allowed skip names the condition under which it holds,
so the same skip on another version fails.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import NoReturn

import django

from tests.database import on_embedded_server

CI_VALUES_THAT_MEAN_NO = ("", "0", "false", "no")


def in_ci() -> bool:
    """The one reading of the `CI` variable: set to anything but empty, 0, false or no."""
    return os.environ.get("CI", "").strip().lower() not in CI_VALUES_THAT_MEAN_NO


def without_django_tasks() -> bool:
    """Django's own Tasks framework (`django.tasks`) came with Django 6.0."""
    return django.VERSION < (6, 0)


def missing_tool(reason: str) -> NoReturn:
    """A tool a test needs is missing: skip with `reason`, or fail in CI, where it must run,
    unless the suite's server is the embedded one (a bare machine)."""
    import pytest

    if in_ci() and not on_embedded_server():
        pytest.fail(reason)
    pytest.skip(reason)


@dataclass(frozen=True)
class AllowedSkip:
    reason: str
    """A regular expression the skip's whole reason must match."""
    holds: bool
    """Whether this environment is one where the skip is expected."""
    why: str

    def allows(self, reason: str) -> bool:
        return self.holds and re.fullmatch(self.reason, reason) is not None


ALLOWED = [
    AllowedSkip(
        r"django\.tasks is not installed",
        without_django_tasks(),
        "Django 5.2 has no django.tasks: the Tasks tests run there on the django-tasks "
        "backport, and on django.tasks under Django 6 (tox)",
    ),
    AllowedSkip(
        r"needs Django 6\+ and the backport",
        without_django_tasks(),
        "both Tasks frameworks in one project needs django.tasks (Django 6)",
    ),
    AllowedSkip(
        r"private PostgreSQL clusters need root.*|pg_createcluster not found.*",
        on_embedded_server(),
        "a bare machine (the embedded PostgreSQL) has no root or Debian's postgresql-common",
    ),
    AllowedSkip(
        r"pgbouncer is not installed.*",
        on_embedded_server(),
        "a bare machine (the embedded PostgreSQL) has no PgBouncer",
    ),
    AllowedSkip(
        r"(?s)BROWSER TEST NOT RUN: .*",
        on_embedded_server(),
        "a bare machine (the embedded PostgreSQL) has no Chromium",
    ),
]


def unexpected(skips: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (test id, reason) pairs of `skips` that no allowed skip allows here."""
    return [
        (test, reason)
        for test, reason in skips
        if not any(allowed.allows(reason) for allowed in ALLOWED)
    ]


def reason_of(longrepr: object) -> str:
    """A skip report's reason, without pytest's "Skipped: " prefix."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(text).removeprefix("Skipped: ")
