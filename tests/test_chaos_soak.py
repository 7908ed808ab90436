"""The chaos soak (benchmarks/chaos.py) runs, injects its faults and finds no violation.

Twenty seconds of it (CI runs two minutes after the thorough tests; the soak's own
docstring says what it injects and checks). Thorough: with the drain and the 40 s
the workers get to beat again after the faults, it takes over a minute.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.cluster_workers import ROOT, require_private_clusters

SEED = 20261205
"""A fixed schedule: a failure here replays with `--seed`."""
TIMEOUT = 400
"""Seconds for the whole soak: 20 s of faults, the drain, 40 s to settle, the stop (a
worker that ignores SIGTERM costs 45 s)."""


@pytest.mark.thorough
@pytest.mark.timeout(TIMEOUT + 120)
def test_twenty_seconds_of_chaos_leave_no_violation() -> None:
    require_private_clusters()
    command = [sys.executable, "benchmarks/chaos.py", "--minutes", "0.34", "--seed", str(SEED)]
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as soak:
        try:
            output, _ = soak.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            soak.terminate()  # the soak stops its workers and drops its cluster
            output, _ = soak.communicate(timeout=60)
            pytest.fail(f"the soak took over {TIMEOUT} s:\n{output}")
    total = re.search(r"\| faults injected \|.*?\| total \| (\d+) \|", output, re.DOTALL)
    assert total is not None, output
    assert int(total.group(1)) >= 5, output  # the scenario: faults were injected
    assert "| completed |" in output, output
    assert soak.returncode == 0, output
