"""Declaring tasks: kinds, duplicates and bad declarations are errors at import time."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta

import pytest

import django_venturi as venturi
from django_venturi.registry import registry


@pytest.fixture
def scratch_kinds() -> Iterator[list[str]]:
    kinds: list[str] = []
    yield kinds
    for kind in kinds:
        registry.unregister(kind)


def test_the_default_kind_is_app_label_and_class_name(scratch_kinds: list[str]) -> None:
    @venturi.task
    @dataclasses.dataclass
    class Rebuild:
        def handle(self, ctx: venturi.Context) -> venturi.Outcome:
            return venturi.Outcome.completed()

    scratch_kinds.append("tests.Rebuild")
    assert Rebuild.venturi_spec.kind == "tests.Rebuild"  # type: ignore[attr-defined]
    assert registry.get("tests.Rebuild").cls is Rebuild
    assert callable(Rebuild().enqueue)  # type: ignore[attr-defined]


def test_a_second_class_with_the_same_kind_names_both(scratch_kinds: list[str]) -> None:
    @venturi.task(kind="tests.clash")
    @dataclasses.dataclass
    class First:
        def handle(self, ctx: venturi.Context) -> venturi.Outcome:
            return venturi.Outcome.completed()

    scratch_kinds.append("tests.clash")
    with pytest.raises(venturi.RegistrationError) as raised:

        @venturi.task(kind="tests.clash")
        @dataclasses.dataclass
        class Second:
            def handle(self, ctx: venturi.Context) -> venturi.Outcome:
                return venturi.Outcome.completed()

    message = str(raised.value)
    assert "First" in message and "Second" in message and "tests.clash" in message


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kind": "has space"}, "kind 'has space' may contain only"),
        ({"queue": "x" * 101}, "longer than 100"),
        ({"max_attempts": 0}, "max_attempts must be a positive int"),
        ({"lease": timedelta(0)}, "lease must be a positive timedelta"),
        ({"priority": 7}, "priority must be a venturi.Priority"),
    ],
)
def test_bad_declarations_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(venturi.RegistrationError, match=message):

        @venturi.task(**options)  # type: ignore[call-overload]
        @dataclasses.dataclass
        class Bad:
            def handle(self, ctx: venturi.Context) -> venturi.Outcome:
                return venturi.Outcome.completed()


def test_a_task_must_be_a_dataclass_with_a_handler() -> None:
    with pytest.raises(venturi.RegistrationError, match="needs a dataclass"):

        @venturi.task(kind="tests.plain")
        class Plain:
            def handle(self, ctx: venturi.Context) -> venturi.Outcome:
                return venturi.Outcome.completed()

    with pytest.raises(venturi.RegistrationError, match="needs a handle"):

        @venturi.task(kind="tests.no_handler")
        @dataclasses.dataclass
        class NoHandler:
            pass


def test_workers_import_each_apps_tasks_module() -> None:
    # tests.testapp.tasks was imported by AppConfig.ready(), not by this test module.
    assert "tests.noop" in registry.kinds() and "tests.pausing" in registry.kinds()
