"""What a Django Tasks job's row holds, and how a worker finds its Task again.

The kind is `tasks:` and the function's module path; the payload is an
envelope: the framework, the JSON arguments and the options the Task was
enqueued with. A worker imports a Task's module only if it is inside an
installed app, listed in `VENTURI["TASK_MODULES"]`, or signed: at enqueue the
producer signs the module path with the project's SECRET_KEY
(`module_signature`), so the modules of a library that is not an installed app
(Wagtail's search enqueues `modelsearch.tasks`) are admitted while a tampered
row, which cannot sign, can never make a worker import an arbitrary module or
call anything that is not a declared Task.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from typing import Any

from django.apps import apps
from django.core.signing import BadSignature, Signer
from django.utils.dateparse import parse_datetime

from django_venturi.conf import venturi_settings
from django_venturi.payloads import text
from django_venturi.payloads.codec import UnstorableValue, int_problem, too_deep
from django_venturi.payloads.size import check_size
from django_venturi.registry import TASKS_KIND_PREFIX
from django_venturi.tasks_backend.frameworks import (
    Framework,
    UnrunnableTask,
    by_name,
)


def kind_of(task: Any) -> str:
    """The venturi kind of a Task's jobs: the prefix, then the function's module path."""
    return f"{TASKS_KIND_PREFIX}{task.func.__module__}.{task.func.__qualname__}"


def module_is_allowed(module: str) -> bool:
    """Whether workers may import `module` to find a Task without a signature: inside
    an installed app, or listed (or under a module listed) in `VENTURI["TASK_MODULES"]`."""
    listed = venturi_settings.TASK_MODULES
    if any(module == name or module.startswith(f"{name}.") for name in listed):
        return True
    return apps.get_containing_app_config(module) is not None


MODULE_SIGNATURE_SALT = "django_venturi.task-module"
"""Keeps these signatures apart from every other use of SECRET_KEY."""


def module_signature(module: str) -> str:
    """Sign a Task's module path: this project's own code enqueued a Task of `module`.

    Made at enqueue with SECRET_KEY; a worker checks it with its SECRET_KEY and
    SECRET_KEY_FALLBACKS, so producers and workers must share the key.
    """
    return str(Signer(salt=MODULE_SIGNATURE_SALT).signature(module))


def import_refusal(module: str, signature: object) -> str | None:
    """Why a worker must not import `module` for a job carrying `signature`, or None.

    A job written before signatures (no `module_signature`) keeps the old rule:
    installed apps and `VENTURI["TASK_MODULES"]` only.
    """
    if module_is_allowed(module):
        return None
    outside = f"{module!r} is not inside an installed app or VENTURI['TASK_MODULES']"
    if signature is None:
        return f"{outside}, and the job carries no signature of it: not imported"
    if not isinstance(signature, str) or not _signed(module, signature):
        return (
            f"{outside}, and the job's signature of it is not valid (made for another "
            "module, or with a SECRET_KEY that is neither SECRET_KEY nor in "
            "SECRET_KEY_FALLBACKS here): not imported"
        )
    return None


def _signed(module: str, signature: str) -> bool:
    signer = Signer(salt=MODULE_SIGNATURE_SALT)
    try:
        signer.unsign(f"{module}{signer.sep}{signature}")
    except BadSignature:
        return False
    return True


def check_json(value: Any, where: str) -> Any:
    """Return Task arguments as plain JSON (tuples become lists), or raise naming what does
    not fit.

    Django requires Task arguments and return values to be JSON; venturi refuses
    anything that would not reach the task equal (non-str keys, NaN, other types) or
    that the database cannot store (NUL, surrogates: see `django_venturi.payloads.text`).
    UTF-8 bytes become text, as Django's own `TaskResult` makes them.
    """
    return _checked(value, where, _str_key)


def stored_result(value: Any) -> Any:
    """Return a Task's return value as it is stored, or raise naming what does not fit.

    As `check_json`, except that dict keys of the types JSON writes as text (int,
    float, bool, None) become that text, as a round trip through `json` makes them:
    `{1: "a"}` is stored and read back as `{"1": "a"}`, as Django's database-backed
    backends store it. NaN and infinities stay refused: PostgreSQL's jsonb holds none.
    """
    return _checked(value, "the return value", _json_key)


KeyRule = Callable[[object, str], str]
"""How dict keys become JSON keys: the key and where its dict is, to the key's text."""


def _checked(value: Any, where: str, key_rule: KeyRule) -> Any:
    try:
        return _check_json(value, where, key_rule)
    except RecursionError:
        raise too_deep(where) from None


def _check_json(value: Any, where: str, key_rule: KeyRule) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        problem = int_problem(value)
        if problem:
            raise UnstorableValue(where, problem)
        return value
    if isinstance(value, str):
        return _storable_text(value, where)
    if isinstance(value, bytes):
        try:
            return _storable_text(value.decode(), where)
        except UnicodeDecodeError:
            raise ValueError(f"{where} is bytes that are not UTF-8 text") from None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(
                f"{where} is {value!r}, which JSON cannot hold (nor can PostgreSQL's jsonb)"
            )
        return value
    if isinstance(value, Mapping):
        return _check_mapping(value, where, key_rule)
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return [
            _check_json(item, f"{where}[{index}]", key_rule) for index, item in enumerate(value)
        ]
    raise TypeError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which is not "
        "JSON-serialisable (Django Tasks take str, int, float, bool, None, list and dict)"
    )


def _check_mapping(value: Mapping[Any, Any], where: str, key_rule: KeyRule) -> dict[str, Any]:
    checked: dict[str, Any] = {}
    original: dict[str, object] = {}
    for key, item in value.items():
        name = key_rule(key, where)
        problem = text.problem(name)
        if problem:
            raise UnstorableValue(f"{where}[{key!r}]", f"the key {problem}")
        if name in original:
            raise ValueError(
                f"{where} has the keys {original[name]!r} and {key!r}, which JSON writes "
                f"as one key {name!r}"
            )
        original[name] = key
        checked[name] = _check_json(item, f"{where}[{key!r}]", key_rule)
    return checked


def _str_key(key: object, where: str) -> str:
    if not isinstance(key, str):
        raise TypeError(
            f"{where} has the key {key!r} ({type(key).__name__}); JSON keys must be str"
        )
    return key


def _json_key(key: object, where: str) -> str:
    """The text `json.dumps` writes for the dict key `key` (it refuses other types)."""
    if isinstance(key, str):
        return key
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        problem = int_problem(key)
        if problem:
            raise UnstorableValue(f"{where}'s key", problem)
        return int.__repr__(key)
    if isinstance(key, float) and math.isfinite(key):
        return float.__repr__(key)
    raise TypeError(
        f"{where} has the key {key!r} ({type(key).__name__}); JSON keys must be str, "
        "or an int, a finite float, a bool or None (written as text)"
    )


def _storable_text(value: str, where: str) -> str:
    problem = text.problem(value)
    if problem:
        raise UnstorableValue(where, problem)
    return value


def envelope(
    framework: Framework, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The payload of a Tasks job: the framework, the Task's options and its arguments.

    Raises `PayloadTooLarge` when it is over `VENTURI["MAX_PAYLOAD_BYTES"]`.
    """
    payload = {
        "framework": framework.name,
        "backend": task.backend,
        "priority": task.priority,
        "queue_name": task.queue_name,
        "run_after": None if task.run_after is None else task.run_after.isoformat(),
        "module_signature": module_signature(task.func.__module__),
        "args": check_json(list(args), "args"),
        "kwargs": check_json(dict(kwargs), "kwargs"),
    }
    where = f"{task.func.__module__}.{task.func.__qualname__}(...)"
    check_size(payload, where, venturi_settings.MAX_PAYLOAD_BYTES)
    return payload


# ---------------------------------------------------------------- finding the Task of a row


@dataclasses.dataclass(frozen=True, slots=True)
class Resolved:
    """The Task a Tasks job names, with the options it was enqueued with."""

    framework: Framework
    task: Any
    args: list[Any]
    kwargs: dict[str, Any]


def resolve(kind: str, payload: Any) -> Resolved:
    """Find the Task of a job row, or raise `UnrunnableTask` saying why (nothing is called)."""
    if not kind.startswith(TASKS_KIND_PREFIX):
        raise UnrunnableTask(f"{kind!r} is not a Django Tasks job")
    if not isinstance(payload, dict):
        raise UnrunnableTask("the stored payload is not a Tasks envelope (expected an object)")
    framework = by_name(payload.get("framework"))
    args, kwargs = payload.get("args"), payload.get("kwargs")
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise UnrunnableTask("the stored payload has no args list and kwargs object")
    path = kind.removeprefix(TASKS_KIND_PREFIX)
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute.isidentifier():
        raise UnrunnableTask(f"{path!r} is not a module path")
    refusal = import_refusal(module_name, payload.get("module_signature"))
    if refusal:
        raise UnrunnableTask(refusal)
    try:
        module = import_module(module_name)
    except ImportError as error:
        raise UnrunnableTask(f"cannot import {module_name!r}: {error}") from None
    task = getattr(module, attribute, None)
    if not framework.owns(task):
        raise UnrunnableTask(
            f"{path} is a {type(task).__qualname__}, not a {framework.name} Task: not called"
        )
    return Resolved(framework, _as_enqueued(framework, task, payload), args, kwargs)


def _as_enqueued(framework: Framework, task: Any, payload: dict[str, Any]) -> Any:
    """The Task with the options it was enqueued with (`Task.using(...)`)."""
    run_after = payload.get("run_after")
    try:
        return task.using(
            priority=payload.get("priority"),
            queue_name=payload.get("queue_name"),
            run_after=parse_datetime(run_after) if isinstance(run_after, str) else None,
            backend=payload.get("backend"),
        )
    except (framework.invalid_task, TypeError, ValueError) as error:
        raise UnrunnableTask(f"{task.module_path}: {error}") from None
    except Exception as error:  # e.g. the backend alias is no longer in TASKS
        raise UnrunnableTask(f"{task.module_path}: {type(error).__name__}: {error}") from None


def is_async(task: Any) -> bool:
    return inspect.iscoroutinefunction(task.func)
