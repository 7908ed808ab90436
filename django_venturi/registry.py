"""Task kinds known to this process, and what each one's decorator said."""

from __future__ import annotations

import dataclasses
import inspect
import re
from datetime import timedelta
from typing import Any

from django.apps import apps

from django_venturi.payloads import codec
from django_venturi.states import Priority
from django_venturi.store.backoff import Fibonacci
from django_venturi.store.concurrency import Concurrency, field_text
from django_venturi.store.rate_limits import RateLimit

NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]*")
"""What a kind or queue name is made of; the whole name must match (`fullmatch`)."""
MAX_KIND_LENGTH = 200
MAX_QUEUE_LENGTH = 100
TASKS_KIND_PREFIX = "tasks:"
"""Kinds of Django Tasks jobs: this, then the task function's module path (see backend.py).
Reserved: `@venturi.task` refuses kinds that start with it."""


class UnknownKind(LookupError):
    """No task is registered under this kind in this process."""


class RegistrationError(Exception):
    """A task declaration is invalid, or clashes with another one."""


def validate_name(value: object, *, field: str, max_length: int) -> str:
    """Check a kind or queue name: non-empty, short, letters, digits and `_.:-`."""
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a str, got {type(value).__name__}")
    if len(value) > max_length:
        raise ValueError(f"{field} {value[:40]!r}... is longer than {max_length} characters")
    if not NAME_PATTERN.fullmatch(value):
        raise ValueError(
            f"{field} {value!r} may contain only letters, digits and _ . : - "
            "(and must not start with a punctuation mark)"
        )
    return value


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Everything the `@venturi.task(...)` decorator said about one task class."""

    cls: type
    kind: str
    queue: str | None
    priority: Priority
    max_attempts: int | None
    give_up_after: timedelta | None
    backoff: Fibonacci
    lease: timedelta | None
    concurrency: Concurrency | None
    """Running jobs of the kind at once, across all workers (per key, with one)."""
    carry: Any
    timeout: timedelta | None = None
    """How long one run may take before it is asked to stop (see worker timeouts)."""
    rate_limit: RateLimit | None = None
    """At most so many starts per window, across all workers (see `rate_limits.py`)."""
    atomic: bool = False
    """Whether the handler runs in a transaction that also writes its verdict (see
    `atomic.py`)."""
    fair_by: str | None = None
    """The payload field whose values take turns in the claims (`scheduling.py`)."""

    def fair_key(self, payload: Any) -> str | None:
        """The value a job's turns are kept by (`field_text` of `fair_by`); None if the
        task is not fair."""
        return None if self.fair_by is None else field_text(self.fair_by, payload)

    @property
    def is_async(self) -> bool:
        """Whether `handle` is an `async def` (run on the worker's event loop)."""
        return inspect.iscoroutinefunction(getattr(self.cls, "handle", None))

    @property
    def has_dedup(self) -> bool:
        return callable(getattr(self.cls, "dedup_key", None))

    @property
    def origin(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}"

    def encode(self, instance: object) -> dict[str, Any]:
        return codec.encode(instance)

    def decode(self, data: Any) -> Any:
        return codec.decode(self.cls, data)

    def encode_carry(self, carry: Any) -> Any:
        if carry is None:
            return None  # "no checkpoint" is always allowed, whatever the carry type
        hint = self.carry if self.carry is not None else Any
        return codec.encode_value(carry, hint, f"{self.cls.__name__}.carry")

    def decode_carry(self, data: Any) -> Any:
        if data is None:
            return None
        hint = self.carry if self.carry is not None else Any
        return codec.decode_value(hint, data, f"{self.cls.__name__}.carry")


class Registry:
    """Maps kinds to task specs. One per process; filled when task modules import."""

    def __init__(self) -> None:
        self._by_kind: dict[str, TaskSpec] = {}

    def register(self, spec: TaskSpec) -> None:
        existing = self._by_kind.get(spec.kind)
        if existing is not None and existing.origin != spec.origin:
            raise RegistrationError(
                f"task kind {spec.kind!r} is declared twice: by {existing.origin} "
                f"and by {spec.origin}; give one of them another kind="
            )
        self._by_kind[spec.kind] = spec

    def get(self, kind: str) -> TaskSpec:
        try:
            return self._by_kind[kind]
        except KeyError:
            raise UnknownKind(f"no task is registered under kind {kind!r}") from None

    def find(self, kind: str) -> TaskSpec | None:
        """`get` without the exception, for callers on the per-job path."""
        return self._by_kind.get(kind)

    def declared_types(self, kind: str) -> tuple[Any, Any] | None:
        """The declared types of a kind's stored (payload, carry): the task class and its
        `carry=` type (`object` for an untyped carry, and for both of a Django Tasks job,
        whose arguments are plain JSON); None for a kind not registered here."""
        if kind.startswith(TASKS_KIND_PREFIX):
            return object, object
        spec = self._by_kind.get(kind)
        if spec is None:
            return None
        return spec.cls, spec.carry if spec.carry is not None else object

    def kinds(self) -> list[str]:
        return sorted(self._by_kind)

    def specs(self) -> list[TaskSpec]:
        return [self._by_kind[kind] for kind in self.kinds()]

    def unregister(self, kind: str) -> None:
        self._by_kind.pop(kind, None)


registry = Registry()


def default_kind(cls: type) -> str:
    """`<app_label>.<ClassName>`, or `<top package>.<ClassName>` outside any app."""
    label = cls.__module__.partition(".")[0]
    if apps.apps_ready:
        config = apps.get_containing_app_config(cls.__module__)
        if config is not None:
            label = config.label
    return f"{label}.{cls.__name__}"


def spec_of(instance_or_class: object) -> TaskSpec:
    """Return the spec of a task instance or class, or explain that it is not a task."""
    cls = instance_or_class if isinstance(instance_or_class, type) else type(instance_or_class)
    spec = getattr(cls, "venturi_spec", None)
    if not isinstance(spec, TaskSpec) or spec.cls is not cls:
        raise TypeError(f"{cls.__qualname__} is not a task: decorate it with @venturi.task")
    return spec
