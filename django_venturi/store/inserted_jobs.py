"""`Job` instances of rows just inserted, built from the values sent, without a query.

Django's keyword `__init__` looks up the default of every field not given, and
even its positional one (`Model.from_db`) sets the 27 fields one by one: that made
up half of `enqueue_many`. Unless someone listens to `pre_init` or `post_init` for
`Job`, each instance is assembled as `from_db` would leave it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from django.db.models import NOT_PROVIDED, signals
from django.db.models.base import ModelState

from django_venturi.models import Job


def loaded(alias: str, rows: Sequence[dict[str, Any]]) -> list[Job]:
    """The `Job`s of rows just inserted on `alias`: each row's values by field name
    (every field not named holds its default)."""
    heard = signals.pre_init.has_listeners(Job) or signals.post_init.has_listeners(Job)
    build = _initialized if heard else _assembled
    return [build(alias, values) for values in rows]


def _assembled(alias: str, values: dict[str, Any]) -> Job:
    """A loaded `Job` without `Model.__init__`: its state, then each field's value."""
    job: Job = Job.__new__(Job)
    state = ModelState()
    state.adding = False
    state.db = alias
    job.__dict__["_state"] = state
    _fill_row(job.__dict__, values)
    return job


def _initialized(alias: str, values: dict[str, Any]) -> Job:
    """A loaded `Job` made by `Model.from_db`, which sends `pre_init` and `post_init`."""
    names, _ = _fields_and_defaults()
    row = _fill_row({}, values)
    return Job.from_db(alias, names, [row[name] for name in names])


def _fill_row(row: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Put every field of a new row in `row` by name: `values`, and the default of
    each other one; return `row`."""
    fixed, made_per_row = _defaults_by_name()
    row.update(fixed)
    for name, make in made_per_row:
        row[name] = make()
    row.update(values)
    return row


@functools.cache
def _defaults_by_name() -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """The defaults that are one value, by field name; and those made per row (callables)."""
    fixed: dict[str, Any] = {}
    made_per_row: list[tuple[str, Any]] = []
    for name, default in zip(*_fields_and_defaults(), strict=True):
        if callable(default):
            made_per_row.append((name, default))
        else:
            fixed[name] = default
    return fixed, made_per_row


@functools.cache
def _fields_and_defaults() -> tuple[list[str], list[Any]]:
    """`Job`'s concrete fields in order, with what a new row holds when not told.

    A default is the value itself, or a callable for a new value per row (a
    field's callable `default`, such as `dict`).
    """
    names: list[str] = []
    defaults: list[Any] = []
    for field in Job._meta.concrete_fields:
        names.append(field.attname)
        db_default = getattr(field, "db_default", NOT_PROVIDED)
        if db_default is not NOT_PROVIDED and not hasattr(db_default, "resolve_expression"):
            defaults.append(db_default)
        elif field.has_default() and callable(field.default):
            defaults.append(field.default)
        else:
            defaults.append(field.get_default())
    return names, defaults
