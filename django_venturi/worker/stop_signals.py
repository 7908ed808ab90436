"""SIGTERM and SIGINT stop a worker, without a signal handler that could wait for itself.

A Python signal handler runs in the main thread between two of its bytecodes,
possibly while that thread holds a lock: the claim loop, which runs there,
clears and waits on the worker's events, and each of them takes its condition's
lock. A handler that set an event there would wait for itself forever (a worker
that said "stopping" and never stopped). So the handler only puts the signal on
a `SimpleQueue`, whose `put` is safe to re-enter, and a thread of its own logs
it and stops the worker.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger("django_venturi.worker")


def install(
    *, name: str, stop: Callable[[], None], stopping: Callable[[], bool]
) -> Callable[[], None]:
    """Make SIGTERM and SIGINT call `stop()` (from a relay thread); return a function
    restoring the old handlers. Off the main thread, where Python sets no signal
    handler, nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    received: queue.SimpleQueue[int | None] = queue.SimpleQueue()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.put(signum)

    def relay() -> None:
        while (signum := received.get()) is not None:
            logger.info(
                "worker %s got %s: %s",
                name,
                signal.Signals(signum).name,
                "forcing" if stopping() else "stopping",
                extra={"worker": name},
            )
            stop()

    relay_thread = threading.Thread(target=relay, name="venturi-signals", daemon=True)
    relay_thread.start()
    previous = {
        signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)
    }

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        received.put(None)
        relay_thread.join()

    return restore
