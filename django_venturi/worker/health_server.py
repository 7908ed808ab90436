"""`venturi_worker --health-port`: `/livez` and `/readyz` over HTTP, for Kubernetes probes
and load balancers' health checks.

`GET /livez` answers 200 while the worker is alive, `GET /readyz` 200 while it is
ready (`probes.py` says what each means), each 503 otherwise, with a one-line
plain-text reason in the body either way; any other path is 404 and any other
method 501. `HEAD` answers as `GET` without the body.

The standard library's `http.server`, in a daemon thread of the worker process,
each request in a daemon thread of its own: a slow or silent client never holds up
another probe, and nothing here touches the worker's loops, its connections or its
locks (the probes read what they keep in memory). A request that fails is logged
at debug level and never reaches the worker. The port is bound when the server is
made, so that a port in use stops the worker at its start, with the flag named
(`venturi_worker`), not later in a thread.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from django_venturi.worker.probes import Answer

logger = logging.getLogger("django_venturi.worker")

DEFAULT_HOST = "0.0.0.0"  # noqa: S104 - probes come from outside the pod (the kubelet)
"""Every IPv4 interface: a pod's kubelet probes the pod's own address. `--health-host`
narrows it (127.0.0.1 where only local checks should see it, `::` for IPv6)."""
REQUEST_TIMEOUT = 5.0
"""Seconds a client may take to send its request before it is dropped."""


class Probes(Protocol):
    def alive(self) -> Answer: ...

    def ready(self) -> Answer: ...


class HealthServer:
    """Serves `probes` at `host`:`port` once started; made, it holds the port."""

    def __init__(self, probes: Probes, *, host: str = DEFAULT_HOST, port: int) -> None:
        routes = {"/livez": probes.alive, "/readyz": probes.ready}
        self._server = _server_class(host)((host, port), _handler_class(routes))
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="venturi-health", daemon=True
        )

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop answering and free the port."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_port = False  # never two workers on one port: the second must fail

    def server_bind(self) -> None:
        """Bind without `HTTPServer`'s reverse DNS look-up of the host (it may hang)."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("health endpoint: a request from %s failed", client_address, exc_info=True)


class _QuietServerV6(_QuietServer):
    address_family = socket.AF_INET6


def _server_class(host: str) -> type[_QuietServer]:
    return _QuietServerV6 if ":" in host else _QuietServer


def _handler_class(routes: dict[str, Callable[[], Answer]]) -> type[BaseHTTPRequestHandler]:
    class ProbeHandler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT
        server_version = "venturi"

        def do_GET(self) -> None:
            self._answer(with_body=True)

        def do_HEAD(self) -> None:
            self._answer(with_body=False)

        def _answer(self, *, with_body: bool) -> None:
            probe = routes.get(self.path.partition("?")[0])
            if probe is None:
                status, text = HTTPStatus.NOT_FOUND, "not found: try /livez or /readyz"
            else:
                answer = probe()
                status = HTTPStatus.OK if answer.ok else HTTPStatus.SERVICE_UNAVAILABLE
                text = answer.reason
            body = (text + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("health endpoint: " + format, *args)

    return ProbeHandler
