"""The worker process: a supervisor and its services, each one module with one loop.

Claiming (`claimer`), running handlers (`handlers`, `execution`), writing
results (`results`), heartbeating (`heartbeats`), listening (`listener`), the
sweeper, pause watch, timeouts and the orphan-kind watch; `process.Worker`
builds them and owns their lives. `probes` says whether the worker is alive and
ready, and `health_server` answers that over HTTP (`--health-port`). `inline`
runs a job the same way in the caller's thread (eager mode, `testing.drain()`).

May import: `store/`, `payloads/`, `observe/` (the telemetry it reports) and
`tasks_backend/` (the runner of Django Tasks jobs), and the top-level modules.
Never `admin/`.

`Worker` is importable from here (`from django_venturi.worker import Worker`,
the path the docs give), loaded on first use: the testing helpers import
`inline` before Django is set up, and the worker's modules need the models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_venturi.worker.process import Worker

__all__ = ["Worker"]


def __getattr__(name: str) -> Any:
    if name == "Worker":
        from django_venturi.worker.process import Worker

        return Worker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
