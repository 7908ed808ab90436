"""`venturi_worker --health-port`: `/livez` and `/readyz` of real worker processes.

A worker that waits for its database is alive and not ready: at its start, and
through an outage (its connections cut by a TCP proxy, new ones led nowhere),
after which it is ready again. A stalled worker is neither. A port in use stops
the worker at once, naming the flag.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.core.management import load_command_class
from django.db import connections

from django_venturi.models import WorkerProcess
from django_venturi.worker.health_server import HealthServer
from tests import cluster_workers
from tests.conftest import ROOT, Workers, django_command, wait_until
from tests.tcp_proxy import TcpProxy, free_port
from tests.test_liveness import worker_stuck_at_start_up

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

LOCAL = "127.0.0.1"
DJANGO = [sys.executable, "-m", "django"]
STALL_TIMEOUT = 4
"""Seconds: the outage below lasts longer than this, so a worker that took its wait
for a stall would say so (and exit)."""


def probe(port: int, path: str) -> tuple[int, str]:
    """The status and body of GET `path`; (0, why) while nothing answers on `port`."""
    try:
        with urllib.request.urlopen(f"http://{LOCAL}:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def answers(port: int, path: str, status: int) -> Callable[[], bool]:
    return lambda: probe(port, path)[0] == status


def holds_for(condition: Callable[[], bool], seconds: float) -> None:
    """Assert that `condition` is true at each look for `seconds` (an observation, not a
    wait: the worker is expected to stay as it is)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert condition()
        time.sleep(0.1)


def suite_database() -> tuple[str, int]:
    """Where the suite's PostgreSQL listens."""
    return LOCAL, int(connections["default"].settings_dict["PORT"] or 5432)


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    """A TCP proxy to the suite's PostgreSQL, led nowhere until a test says so."""
    with TcpProxy(suite_database()) as started:
        started.switch((LOCAL, free_port()))  # a database that is not there
        yield started


def start_worker_through(proxy: TcpProxy, port: int, log: Path) -> subprocess.Popen[bytes]:
    name = connections["default"].settings_dict["NAME"]
    env = cluster_workers.environment(
        f"postgres://postgres@{LOCAL}:{proxy.port}/{name}",
        HEARTBEAT_INTERVAL=0.5,
        STALL_TIMEOUT=STALL_TIMEOUT,
    )
    with log.open("wb") as output:
        return subprocess.Popen(
            [*DJANGO, "venturi_worker", "--health-port", str(port), "--health-host", LOCAL],
            env=env,
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )


def test_a_healthy_worker_is_alive_and_ready_and_answers_nothing_else(workers: Workers) -> None:
    port = free_port()
    worker = workers.start("default", "--health-port", str(port), "--health-host", LOCAL)
    wait_until(answers(port, "/readyz", 200), timeout=60, message="ready")
    assert probe(port, "/readyz") == (200, "ready: connected, claiming, heartbeat written\n")
    assert probe(port, "/livez") == (200, "alive\n")
    assert probe(port, "/livez?verbose=1") == (200, "alive\n")
    assert probe(port, "/")[0] == 404
    assert probe(port, "/metrics")[0] == 404
    assert worker.poll() is None


def test_a_worker_waiting_for_its_database_is_alive_but_not_ready(
    proxy: TcpProxy, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "worker.log"
    worker = start_worker_through(proxy, port, log)
    try:
        # At its start, the database not there yet.
        wait_until(lambda: "cannot reach database" in log.read_text(), timeout=60)
        assert probe(port, "/livez") == (200, "alive\n")
        status, reason = probe(port, "/readyz")
        assert (status, reason.split(":")[0]) == (503, "starting"), reason
        proxy.switch(suite_database(), cut=False)
        wait_until(answers(port, "/readyz", 200), timeout=60, message="ready once it answers")
        # An outage: every connection cut, new ones led nowhere.
        proxy.switch((LOCAL, free_port()))
        wait_until(answers(port, "/readyz", 503), timeout=30, message="not ready in the outage")
        holds_for(answers(port, "/livez", 200), seconds=STALL_TIMEOUT + 1)
        assert probe(port, "/readyz") == (503, "lost the database: waiting for it to come back\n")
        assert worker.poll() is None, log.read_text()[-3000:]
        proxy.switch(suite_database(), cut=False)
        wait_until(answers(port, "/readyz", 200), timeout=60, message="ready again")
        assert probe(port, "/livez") == (200, "alive\n")
    finally:
        worker.kill()
        worker.wait(timeout=30)
    assert "made no progress" not in log.read_text()


def test_a_port_in_use_stops_the_worker_at_its_start_naming_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind((LOCAL, 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = django_command(
            "venturi_worker", "--database", "default", "--health-port", str(port),
            "--health-host", LOCAL,
        )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert f"--health-port {port}: port {port} is already in use on {LOCAL}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not WorkerProcess.objects.exists(), "it stopped before it registered"


def test_a_stalled_worker_is_neither_alive_nor_ready() -> None:
    """A start-up step that never returns (as in test_liveness): the watch sees the stall."""
    with worker_stuck_at_start_up() as worker:
        server = HealthServer(worker.probes, host=LOCAL, port=0)
        server.start()
        try:
            assert probe(server.port, "/livez") == (200, "alive\n"), "not stalled yet"
            wait_until(answers(server.port, "/livez", 503), timeout=30, message="the stall")
            wait_until(lambda: worker.liveness.found, timeout=30, message="the watch's verdict")
            reason = probe(server.port, "/livez")[1]
            assert reason.startswith("stalled: its start-up made no progress for "), reason
            assert probe(server.port, "/readyz")[0] == 503
        finally:
            server.stop()


def test_the_docs_show_one_deployment_and_one_unit_whose_probes_fit_the_worker() -> None:
    """The guide and the production page include the same two files; the Deployment's
    probes ask the port its worker's command line serves."""
    docs = ROOT / "docs"
    for page in ("guide.md", "production.md"):
        text = (docs / page).read_text()
        for name in ("kubernetes-worker-deployment.md", "systemd-worker-unit.md"):
            assert text.count(f"```{{include}} _include/{name}") == 1, (page, name)
        assert "livenessProbe:" not in text, f"{page} shows a Deployment of its own"
    deployment = (docs / "_include" / "kubernetes-worker-deployment.md").read_text()
    found = re.search(r"command: (\[.*?\])", deployment, re.DOTALL)
    assert found is not None
    command = json.loads(found.group(1))
    assert command[:3] == ["python", "manage.py", "venturi_worker"]
    parser = load_command_class("django_venturi", "venturi_worker").create_parser(
        "manage.py", "venturi_worker"
    )
    port = parser.parse_args(command[3:]).health_port
    assert f"- {{name: health, containerPort: {port}}}" in deployment
    assert "httpGet: {path: /livez, port: health}" in deployment
    assert "httpGet: {path: /readyz, port: health}" in deployment
