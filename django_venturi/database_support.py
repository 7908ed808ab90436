"""What venturi does on each database, and the system check that refuses the rest.

PostgreSQL does everything. MariaDB and MySQL run the ORM's paths (the claim of
`store/claim_orm.py` with `SKIP LOCKED`, polling for wake-ups), and lack what
three features stand on:

- dedup (a task's `dedup_key()`): at most one live job per kind and key is a
  partial unique index, which MariaDB and MySQL cannot build;
- `concurrency=` caps and `rate_limit=`: the ORM's claim counts running jobs and
  starts, which is exact only where claims serialise (SQLite's write lock); on
  MariaDB and MySQL workers claim at once.

A task that uses one of them is refused (`venturi.E060`) by `manage.py check` when
`VENTURI["DATABASE"]` is MariaDB or MySQL, and by `venturi_worker` on such a
`--database` for the tasks of the queues it serves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Tags, register
from django.db import connections

from django_venturi.conf import venturi_settings
from django_venturi.registry import TaskSpec, registry

DEFAULT_QUEUE = "default"


def refused_features(spec: TaskSpec) -> list[str]:
    """The features of `spec` that venturi refuses on MariaDB and MySQL."""
    uses = {
        "dedup_key()": spec.has_dedup,
        "concurrency=": spec.concurrency is not None,
        "rate_limit=": spec.rate_limit is not None,
    }
    return [feature for feature, used in uses.items() if used]


def on_mysql(alias: str) -> bool:
    """Whether `alias` is a MariaDB or MySQL database (read from its backend, no query)."""
    return alias in connections and connections[alias].vendor == "mysql"


def unsupported_feature_errors(alias: str, specs: Iterable[TaskSpec]) -> list[CheckMessage]:
    """One `venturi.E060` per task of `specs` that uses a feature `alias` cannot hold."""
    if not on_mysql(alias):
        return []
    errors: list[CheckMessage] = []
    for spec in specs:
        if features := refused_features(spec):
            errors.append(
                Error(
                    f"task {spec.kind!r} uses {', '.join(features)}, which venturi does not "
                    f"support on MariaDB or MySQL yet (DATABASES[{alias!r}])",
                    hint="See 'Database support' in the django-venturi guide: run this task "
                    "on PostgreSQL, or without those options.",
                    obj=spec.origin,
                    id="venturi.E060",
                )
            )
    return errors


def served_specs(queues: Sequence[str] | None) -> list[TaskSpec]:
    """The registered tasks whose queue a worker serving `queues` (None: all) claims."""
    if queues is None:
        return registry.specs()
    return [spec for spec in registry.specs() if (spec.queue or DEFAULT_QUEUE) in queues]


@register(Tags.compatibility)
def check_database_support(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """`venturi.E060` for the tasks whose features the jobs database cannot hold."""
    return unsupported_feature_errors(venturi_settings.DATABASE, registry.specs())
