"""A TCP proxy between workers and PostgreSQL that a test can switch, cut and blackhole.

    with TcpProxy(("127.0.0.1", primary.port)) as proxy:
        url = f"postgres://postgres@127.0.0.1:{proxy.port}/venturi"
        proxy.cut()                         # every connection closed (RST) at once
        proxy.blackhole()                   # bytes stop flowing; nothing is closed
        proxy.heal()                        # they flow again, held bytes first
        proxy.switch(("127.0.0.1", standby.port))   # new connections go there; old ones cut
        proxy.forget()                      # a dead NAT: servers see a close, clients silence
        proxy.deafen()                      # requests go through, answers are dropped

It stands in for what sits between an application and its database in production
(a virtual IP that moves on failover, a NAT or load balancer that forgets a flow):
failover and the chaos soak (benchmarks/chaos.py) need the network to fail in ways a
server restart cannot show. A blackhole is the nasty one: no FIN, no RST, the peer
simply stops answering, so only timeouts and TCP keepalives notice it.

Two threads per connection, one per direction, each blocked in `recv` until bytes
come: a peer that stops reading (a SIGSTOPped worker) stalls its own connection and
never the others. Stdlib only; no CPU spent while nothing flows.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType

Address = tuple[str, int]
CHUNK = 65536
CONNECT_TIMEOUT = 5.0


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick): a database not there yet."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Connection:
    """One client connection and its upstream: two sockets, two pump threads."""

    def __init__(self, proxy: TcpProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.sockets = (client, upstream)
        self.closed = threading.Event()
        self.silenced = False
        """Forgotten: the upstream is closed, the client left open and unanswered."""
        self.threads = [
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True),
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        """Forward bytes from `source` to `sink` until either end closes; while the proxy
        is blackholed, hold what was read and read nothing more; while it is deaf, drop
        the server's `answers`."""
        try:
            while not self.closed.is_set():
                data = source.recv(CHUNK)
                if not data:
                    break
                self.proxy.flowing.wait()  # a blackhole holds these bytes here
                if self.closed.is_set():
                    break
                if answers and self.proxy.deaf.is_set():
                    continue  # the server did the work; its answer is lost
                sink.sendall(data)
        except OSError:
            pass
        if not self.silenced:
            self.close(reset=False)

    def silence(self) -> None:
        """Close the upstream (the server sees its client go) and leave the client's
        socket open with nothing ever answering it, as a NAT that dropped the flow does."""
        self.silenced = True
        self.closed.set()
        client, upstream = self.sockets
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            upstream.close()
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RD)  # wakes its pump; the client is told nothing

    def close(self, *, reset: bool) -> None:
        """Close both sockets: with `reset`, an RST (SO_LINGER 0) as a dying NAT or a
        killed peer sends; otherwise a FIN. Wakes the pump threads blocked in `recv`."""
        if self.closed.is_set() and not self.silenced:
            return
        self.closed.set()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                if reset:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.shutdown(socket.SHUT_RD)  # wakes a blocked recv, sends nothing
                else:
                    sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        self.proxy.discard(self)


class TcpProxy:
    """Forwards 127.0.0.1:`port` (0: a free one, see `.port`) to `target`."""

    def __init__(self, target: Address, port: int = 0) -> None:
        self.target = target
        self.flowing = threading.Event()
        """Clear while blackholed: pumps hold their bytes, new connections wait."""
        self.flowing.set()
        self.deaf = threading.Event()
        """Set while the servers' answers are dropped (their requests still go through)."""
        self.accepted = 0
        """Connections accepted so far (a test checks that clients really came through)."""
        self._lock = threading.Lock()
        self._connections: set[Connection] = set()
        self._silenced: list[Connection] = []
        """Forgotten connections, whose client sockets stay open until `stop`."""
        self._listener = socket.create_server(("127.0.0.1", port), backlog=128)
        self.port: int = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)

    # ------------------------------------------------------------ life cycle

    def start(self) -> TcpProxy:
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Stop accepting and close every connection."""
        self._stopped.set()
        self.flowing.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self.cut()
        with self._lock:
            silenced, self._silenced = self._silenced, []
        for connection in silenced:
            connection.close(reset=True)
        self._acceptor.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------ faults

    def cut(self, *, reset: bool = True) -> int:
        """Close every open connection (RST by default, FIN with `reset=False`); how many."""
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.close(reset=reset)
        return len(connections)

    def blackhole(self) -> None:
        """Stop forwarding and reading, closing nothing, as a dead NAT or a partition
        would: peers see silence until their own timeouts or keepalives give up."""
        self.flowing.clear()

    def heal(self) -> None:
        """End a blackhole (held bytes go on, parked new connections reach the target) and
        deafness."""
        self.flowing.set()
        self.deaf.clear()

    def deafen(self) -> None:
        """Drop what servers send back, keep passing what clients send: each request is
        run and committed by its server, and its answer never arrives (a network fault
        after the commit). Usually followed by `cut()`."""
        self.deaf.set()

    def forget(self) -> int:
        """Drop every open connection silently, as a dead NAT does: each server sees its
        client go, each client keeps an open socket that never answers again (only its
        timeouts or TCP keepalives can tell). New connections work. How many."""
        with self._lock:
            connections = list(self._connections)
            self._connections.clear()
            self._silenced.extend(connections)
        for connection in connections:
            connection.silence()
        return len(connections)

    def switch(self, target: Address, *, cut: bool = True) -> None:
        """Send new connections to `target` (a promoted standby); with `cut`, close the
        open ones, as a virtual IP moving to another host does."""
        self.target = target
        if cut:
            self.cut()

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    # ------------------------------------------------------------ inside

    def discard(self, connection: Connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        """Connect `client` to the target once bytes may flow; close it if that fails."""
        self.flowing.wait()
        try:
            upstream = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT)
        except OSError:
            with contextlib.suppress(OSError):
                client.close()
            return
        upstream.settimeout(None)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = Connection(self, client, upstream)
        with self._lock:
            if self._stopped.is_set():
                connection.sockets[0].close()
                upstream.close()
                return
            self._connections.add(connection)
        connection.start()
