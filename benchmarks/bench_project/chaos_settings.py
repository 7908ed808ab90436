"""Settings of the chaos soak (benchmarks/chaos.py): the benchmark project's, plus its tasks.

The soak's workers reach the database through a fault-injecting proxy
(VENTURI_BENCH_PORT names the proxy's port for them, the server's for the harness).
"""

from __future__ import annotations

from benchmarks.bench_project.settings import *  # noqa: F403

VENTURI = {"TASK_MODULES": ["benchmarks.bench_project.benchapp.chaos_tasks"]}
