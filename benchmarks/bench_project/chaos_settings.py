"""Settings of the chaos soak (benchmarks/chaos.py): the benchmark project's, plus its tasks.

The soak's workers reach the database through a fault-injecting proxy
(VENTURI_BENCH_PORT names the proxy's port for them, the server's for the harness).
"""

from __future__ import annotations

from benchmarks.bench_project.settings import *  # noqa: F403

# STALL_TIMEOUT (60 s by default) shortened so that a worker a fault wedged (every
# connection of it forgotten by a dead NAT: a statement waiting for ever) stops and
# exits non-zero well within the soak's bound on silent workers (30 s).
VENTURI = {
    "TASK_MODULES": ["benchmarks.bench_project.benchapp.chaos_tasks"],
    "STALL_TIMEOUT": 10,  # chaos_faults.SOAK_STALL_TIMEOUT
}
