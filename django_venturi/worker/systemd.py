"""Telling systemd how the worker is doing: the `sd_notify` protocol, without a dependency.

Under a unit with `Type=notify`, systemd passes the path of a datagram socket in
`$NOTIFY_SOCKET`; each datagram is newline-separated `KEY=value` lines. The worker
sends `READY=1` once its database answered and its services run (until then
`systemctl start` waits and the unit shows "activating"), `STATUS=` lines saying
what it does or waits for (shown by `systemctl status`), and `STOPPING=1` when it
begins to shut down. The heartbeat thread sends `WATCHDOG=1` at each of its turns
while no part of the worker stalled (`watchdog()`): under `WatchdogSec=`, systemd
restarts a worker that is frozen (SIGSTOP, a paused VM) or stalled past
`STALL_TIMEOUT`, never one that waits out a database outage.

Outside systemd (no `$NOTIFY_SOCKET`) every function does nothing. A socket that
cannot be reached is logged at debug level: it never stops a worker.
"""

from __future__ import annotations

import logging
import os
import socket

logger = logging.getLogger("django_venturi.worker")


def ready(status: str | None = None) -> bool:
    """Tell systemd that the worker works (with what it does now)."""
    return notify("READY=1", *([] if status is None else [_status_line(status)]))


def status(text: str) -> bool:
    """Tell systemd what the worker does or waits for (`systemctl status` shows it)."""
    return notify(_status_line(text))


def stopping() -> bool:
    """Tell systemd that the worker is shutting down."""
    return notify("STOPPING=1")


def watchdog() -> bool:
    """Tell systemd's watchdog (`WatchdogSec=`) that the worker is alive."""
    return notify("WATCHDOG=1")


def notify(*lines: str) -> bool:
    """Send one datagram to `$NOTIFY_SOCKET`; False outside systemd or if it failed."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sender:
            sender.connect(address)
            sender.sendall("\n".join(lines).encode())
    except OSError as error:
        logger.debug("could not notify systemd at %s: %s", address, error)
        return False
    return True


def _status_line(text: str) -> str:
    return "STATUS=" + " ".join(text.split())
