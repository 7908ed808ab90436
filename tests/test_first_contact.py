"""A worker and its database at start, and the waits of its connections.

- a `--burst` worker whose database cannot be reached (a wrong port, a missing
  database, an unknown host) exits non-zero at once, naming database, host and port;
- a long-running one waits, tells systemd what it waits for (`STATUS=`) and says
  `READY=1` only once the database answers (a real datagram socket as `NOTIFY_SOCKET`);
- a worker's connections carry TCP keepalives, `tcp_user_timeout` and a connect
  timeout, under what the alias's OPTIONS say.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connections

from django_venturi.models import WorkerProcess
from django_venturi.store.connections import BOUNDED_WAITS, connection_params
from django_venturi.worker.process import Worker
from tests import cluster_workers
from tests.conftest import ROOT, wait_until
from tests.tcp_proxy import TcpProxy, free_port

PASSWORD = "s3cret-never-shown"


def burst(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "venturi_worker", "--burst"],
        env=cluster_workers.environment(url),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_burst_worker_stops_at_once_when_its_database_cannot_be_reached() -> None:
    """Each in its own way: a port nothing listens on, a database that does not exist,
    a host no resolver knows. One process each, so no two in one test: seconds apiece."""
    port = free_port()
    name = connections["default"].settings_dict["NAME"]
    cases = {
        f"postgres://postgres:{PASSWORD}@127.0.0.1:{port}/{name}": f"on 127.0.0.1:{port}",
        "postgres://postgres@127.0.0.1:5432/venturi_no_such_database": "venturi_no_such_database",
        f"postgres://postgres@venturi-nowhere.invalid:5432/{name}": "venturi-nowhere.invalid:5432",
    }
    for url, named in cases.items():
        result = burst(url)
        assert result.returncode != 0, result.stderr
        assert "cannot reach database" in result.stderr and named in result.stderr, result.stderr
        assert PASSWORD not in result.stderr
        # Gave up at the first failed try: said once, never "still waiting" (a hang
        # would pass `burst`'s 60 s timeout and fail there).
        assert result.stderr.count("cannot reach") == 1, result.stderr


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    """A datagram socket bound where a worker's NOTIFY_SOCKET points, as systemd's is."""
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(tmp_path / "notify"))
    receiver.settimeout(30)
    yield receiver
    receiver.close()


def next_message(receiver: socket.socket) -> str:
    return receiver.recv(4096).decode()


def next_message_but_watchdog(receiver: socket.socket) -> str:
    """The next message that is not a watchdog ping (sent every heartbeat meanwhile)."""
    while (message := next_message(receiver)) == "WATCHDOG=1":
        pass
    return message


@pytest.mark.django_db(transaction=True)
def test_a_worker_is_ready_only_once_its_database_answers(
    tmp_path: Path, notify_socket: socket.socket
) -> None:
    port = free_port()
    name = connections["default"].settings_dict["NAME"]
    env = cluster_workers.environment(
        f"postgres://postgres@127.0.0.1:{port}/{name}", HEARTBEAT_INTERVAL=0.5
    )
    env["NOTIFY_SOCKET"] = str(tmp_path / "notify")
    log = tmp_path / "worker.log"
    with open(log, "wb") as output:
        worker = subprocess.Popen(
            [sys.executable, "-m", "django", "venturi_worker"],
            env=env,
            cwd=ROOT,
            stdout=output,
            stderr=output,
        )
    proxy: TcpProxy | None = None
    try:
        waiting = next_message(notify_socket)
        assert (
            waiting == f"STATUS=waiting for database {name!r} on 127.0.0.1:{port} (alias 'default')"
        )
        # Its log goes through the worker's log thread: written a moment after.
        wait_until(lambda: "cannot reach database" in log.read_text(), timeout=10)
        assert worker.poll() is None, "a long-running worker waits"
        assert not WorkerProcess.objects.exists(), "nor does it register"
        proxy = TcpProxy(("127.0.0.1", 5432), port=port).start()  # the database is back
        ready = next_message(notify_socket)
        assert ready.startswith("READY=1\nSTATUS=working:"), ready
        assert WorkerProcess.objects.filter(stopped_at__isnull=True).count() == 1
        # The heartbeat keeps systemd's watchdog fed (WatchdogSec=) while nothing stalls.
        assert next_message(notify_socket) == "WATCHDOG=1"
        worker.send_signal(signal.SIGTERM)
        assert next_message_but_watchdog(notify_socket) == "STOPPING=1"
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        if proxy is not None:
            proxy.stop()


@pytest.fixture
def alias_with_options() -> Iterator[str]:
    """`default` again, as an alias whose OPTIONS set one keepalive option of their own."""
    alias = "bounded"
    connections.settings[alias] = {
        **connections.settings["default"],
        "OPTIONS": {"keepalives_idle": 60},
    }
    try:
        yield alias
    finally:
        connections[alias].close()
        del connections[alias]
        del connections.settings[alias]


def test_a_workers_connections_bound_their_waits_under_the_aliass_own_options(
    alias_with_options: str, django_db_blocker: Any
) -> None:
    with django_db_blocker.unblock():  # an alias of the test's own, only tried
        assert Worker(database=alias_with_options).wait_for_database()
    params = connection_params(alias_with_options)
    assert params["keepalives_idle"] == 60, "the alias's OPTIONS win"
    for option in ("keepalives", "keepalives_interval", "keepalives_count", "tcp_user_timeout"):
        assert params[option] == BOUNDED_WAITS[option]
    # libpq takes them (the listener's and the sweeper's connections use these params).
    with psycopg.connect(**params) as connection:
        taken = connection.info.get_parameters()
    assert taken["tcp_user_timeout"] == "30000" and taken["keepalives_idle"] == "60"
