"""The chaos soak's workers (benchmarks/chaos.py): started, supervised and stopped.

A slot whose process exits is given a new one at the next tick, as systemd or
Kubernetes would; every exit is recorded with its code and whether the soak
killed it, so the report can tell a worker that died of a fault (non-zero, which
a supervisor restarts) from one that gave up silently (0 without being asked,
a violation). SIGSTOPped processes are tracked so that they are always resumed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.config import REPO_ROOT

PR_SET_PDEATHSIG = 1
LIBC = ctypes.CDLL(None, use_errno=True)
"""Loaded here, not in the child: between fork and exec (the proxy's threads run) the
child only calls into it, taking no loader lock."""


def die_with_parent() -> None:
    """In the worker's child process: SIGKILL it when the soak dies (even by SIGKILL, as a
    test's timeout does), so no worker outlives the soak. Linux only, as the soak is."""
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Exit:
    """A worker process that ended during the soak."""

    pid: int
    code: int
    at: float
    killed: bool
    """SIGKILLed by the soak (a fault), not on its own."""


class Fleet:
    """`size` venturi_worker processes in slots, restarted when they exit."""

    def __init__(self, folder: Path, env: dict[str, str], size: int, concurrency: int) -> None:
        self.folder = folder
        self.env = env
        self.args = ["--concurrency", str(concurrency)]
        self.slots: list[subprocess.Popen[bytes]] = []
        self.started = 0
        self.exits: list[Exit] = []
        self.killed: set[int] = set()
        self.frozen: dict[int, float] = {}
        """pid -> when it is to be resumed (SIGSTOPped by the soak)."""
        for _ in range(size):
            self.slots.append(self._spawn())

    def _spawn(self) -> subprocess.Popen[bytes]:
        path = self.folder / f"worker-{self.started}.log"
        self.started += 1
        with open(path, "wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "django", "venturi_worker", *self.args],
                env=self.env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=log,
                preexec_fn=die_with_parent,
            )

    def supervise(self, now: float) -> list[Exit]:
        """Resume workers whose freeze is over; record and replace exited ones."""
        for pid, until in list(self.frozen.items()):
            if now >= until:
                self.thaw(pid)
        ended = []
        for index, process in enumerate(self.slots):
            code = process.poll()
            if code is None:
                continue
            ended.append(Exit(process.pid, code, time.time(), process.pid in self.killed))
            self.frozen.pop(process.pid, None)
            self.slots[index] = self._spawn()
        self.exits.extend(ended)
        return ended

    def live(self) -> list[subprocess.Popen[bytes]]:
        return [process for process in self.slots if process.poll() is None]

    def awake(self) -> list[subprocess.Popen[bytes]]:
        """Live workers not frozen."""
        return [process for process in self.live() if process.pid not in self.frozen]

    def kill(self, rng: random.Random) -> int | None:
        """SIGKILL a random live worker (frozen or not); its pid."""
        candidates = self.live()
        if not candidates:
            return None
        process = rng.choice(candidates)
        self.killed.add(process.pid)
        process.send_signal(signal.SIGKILL)
        return process.pid

    def freeze(self, rng: random.Random, seconds: float) -> int | None:
        """SIGSTOP a random live worker not frozen yet, to be resumed after `seconds`."""
        candidates = [p for p in self.live() if p.pid not in self.frozen]
        if not candidates:
            return None
        process = rng.choice(candidates)
        process.send_signal(signal.SIGSTOP)
        self.frozen[process.pid] = time.monotonic() + seconds
        # Resumed on time by a timer of its own, as a frozen process thaws whatever its
        # clients do: the soak's producer may itself wait on a row the frozen worker
        # holds (a claim frozen before its pipeline's Sync went out), and `supervise`,
        # on the same thread, would then never come to resume it.
        timer = threading.Timer(seconds, self.thaw, args=(process.pid,))
        timer.daemon = True
        timer.start()
        return process.pid

    def thaw(self, pid: int) -> None:
        self.frozen.pop(pid, None)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    def thaw_all(self) -> None:
        for pid in list(self.frozen):
            self.thaw(pid)

    def terminate(self, timeout: float) -> list[tuple[int, int | None]]:
        """SIGTERM every worker; (pid, exit code), None for one that had to be SIGKILLed."""
        self.thaw_all()
        for process in self.slots:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes: list[tuple[int, int | None]] = []
        for process in self.slots:
            try:
                codes.append((process.pid, process.wait(max(0.1, deadline - time.monotonic()))))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
                codes.append((process.pid, None))
        return codes

    def kill_all(self) -> None:
        for process in self.slots:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
