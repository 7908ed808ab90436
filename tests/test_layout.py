"""The package's layout keeps its rules: which subpackage may import which.

Read from the source with `ast` (every import, at module level or inside a
function, under TYPE_CHECKING too), so nothing is imported or run. The rules,
as docs/architecture.md draws them:

- `payloads/` imports nothing else of django_venturi;
- `store/` reaches no subpackage but `payloads/`;
- `observe/` and `tasks_backend/` reach only `store/` and `payloads/`;
- `worker/` reaches `store/`, `payloads/`, `observe/` and `tasks_backend/`;
- nothing imports `admin/` (Django does, by autodiscovery);
- the public face at the top may import any subpackage but `admin/`.

"Reaches" is transitive, through the top-level modules as well: a store module
that imports a top-level module that imports the worker breaks the rule as
surely as a direct import would.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from pathlib import Path

from django.core.management import get_commands
from django.template.loader import get_template
from django.utils.module_loading import import_string

PACKAGE = Path(__file__).resolve().parent.parent / "django_venturi"

SUBPACKAGES = ("payloads", "store", "observe", "tasks_backend", "worker", "admin")
ALLOWED: dict[str, set[str]] = {
    "payloads": set(),
    "store": {"payloads"},
    "observe": {"store", "payloads"},
    "tasks_backend": {"store", "payloads"},
    "worker": {"store", "payloads", "observe", "tasks_backend"},
    "admin": set(SUBPACKAGES) - {"admin"},
}
"""Each subpackage and the other subpackages it may reach."""

LONG_FILE = 500
"""A module longer than this says at its top why it is one file."""
LONG_FILE_REASON = "Why one file:"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for path in sorted(PACKAGE.rglob("*.py"))
        if "migrations" not in path.relative_to(PACKAGE).parts
    }


def imports_of(path: Path, known: Iterable[str]) -> set[str]:
    """The django_venturi modules `path` imports (`from package import module` names one)."""
    known = set(known)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    # Every import of a submodule runs the package's own __init__ first: the root is
    # no edge of its own (it is the public face, which imports everything).
    return {name for name in found if name in known and name != "django_venturi"}


def import_graph() -> dict[str, set[str]]:
    modules = source_modules()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def layer(module: str) -> str | None:
    """The subpackage that holds `module`, or None for the top level (and `management/`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in SUBPACKAGES else None


def reached(graph: Mapping[str, set[str]], start: str) -> dict[str, list[str]]:
    """Every module `start` reaches, each with one import path to it."""
    paths: dict[str, list[str]] = {start: [start]}
    todo = [start]
    while todo:
        current = todo.pop()
        for target in sorted(graph.get(current, ())):
            if target not in paths:
                paths[target] = [*paths[current], target]
                todo.append(target)
    return paths


def violations(graph: Mapping[str, set[str]]) -> list[str]:
    """Each import path that breaks a rule, as text."""
    found = []
    for module in sorted(graph):
        own = layer(module)
        if own is None:
            allowed = set(SUBPACKAGES) - {"admin"}
        elif own == "admin":
            continue
        else:
            allowed = ALLOWED[own] | {own}
        for target, path in sorted(reached(graph, module).items()):
            other = layer(target)
            if other is not None and other not in allowed:
                found.append(" -> ".join(path))
    return found


def test_no_import_breaks_the_layout_rules() -> None:
    assert violations(import_graph()) == []


def test_the_rules_catch_a_direct_and_an_indirect_import() -> None:
    """The check itself: an import across the rules is found, directly or through the top."""
    graph = import_graph()
    direct = {**graph, "django_venturi.store.claim": {"django_venturi.worker.claimer"}}
    assert "django_venturi.store.claim -> django_venturi.worker.claimer" in violations(direct)
    through_the_top = {
        **graph,
        "django_venturi.store.claim": {"django_venturi.registry"},
        "django_venturi.registry": {"django_venturi.admin.jobs"},
    }
    found = violations(through_the_top)
    assert "django_venturi.store.claim -> django_venturi.registry -> django_venturi.admin.jobs" in (
        found
    )
    assert "django_venturi.registry -> django_venturi.admin.jobs" in found


def test_the_graph_sees_every_kind_of_import() -> None:
    """Module-level, deferred and `from package import module` imports are all read."""
    graph = import_graph()
    # `from django_venturi.store import registration, verdicts` at module level
    assert "django_venturi.store.verdicts" in graph["django_venturi.worker.process"]
    # deferred, inside a function: `from django_venturi.models import Job`
    assert "django_venturi.models" in graph["django_venturi.store.progress"]


def test_each_subpackage_says_what_it_owns_and_may_import() -> None:
    for name in SUBPACKAGES:
        docstring = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
        assert docstring, f"{name}/__init__.py has no docstring"
        assert "import" in docstring.lower(), f"{name}/__init__.py does not say what it may import"


def test_a_long_module_says_why_it_is_one_file() -> None:
    files = sorted(PACKAGE.rglob("*.py")) + sorted((PACKAGE.parent / "benchmarks").rglob("*.py"))
    long = [
        path
        for path in files
        if "migrations" not in path.parts and len(path.read_text().splitlines()) > LONG_FILE
    ]
    unexplained = [
        str(path.relative_to(PACKAGE.parent))
        for path in long
        if LONG_FILE_REASON not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert unexplained == []


def test_the_public_paths_stay_importable() -> None:
    """What settings, users' code and Django name: the layout must not move them."""
    import django_venturi as venturi
    from django_venturi.tasks_backend.backend import VenturiBackend
    from django_venturi.worker.process import Worker

    assert import_string("django_venturi.backend.VenturiBackend") is VenturiBackend
    assert import_string("django_venturi.worker.Worker") is Worker
    missing = [name for name in venturi.__all__ if not hasattr(venturi, name)]
    assert missing == []
    for module in ("models", "testing", "migration_operations", "migration_state"):
        importlib.import_module(f"django_venturi.{module}")
    plugins = {entry.name: entry.value for entry in entry_points(group="pytest11")}
    assert plugins["venturi"] == "django_venturi.testing"
    commands = get_commands()
    for command in ("venturi_worker", "venturi_stats", "venturi_cleanup", "venturi_queue"):
        assert commands[command] == "django_venturi"
    templates = PACKAGE / "templates"
    for path in sorted(templates.rglob("*.html")):
        get_template(str(path.relative_to(templates)))
