"""The worker's optional background services, started when their settings ask for them:
the retention sweeper (`sweeper.py`, `RETENTION`) and the maintainer (`maintainer.py`,
`MAINTENANCE`). Each is a daemon thread that ends when the worker's stop event is set."""

from __future__ import annotations

import threading

from django_venturi.worker.maintainer import Maintainer
from django_venturi.worker.sweeper import Sweeper


def start_housekeeping(*, alias: str, stop: threading.Event) -> None:
    """Start the sweeper and the maintainer of `alias`, those that are configured."""
    Sweeper.start_if_configured(alias=alias, stop=stop)
    Maintainer.start_if_configured(alias=alias, stop=stop)
