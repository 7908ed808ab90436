"""The test proxy (tests/tcp_proxy.py) forwards, cuts, blackholes and switches.

Failover and the chaos soak trust it to fail the network as they say; these check
each fault on plain sockets against two tagged echo servers, in well under a second.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.tcp_proxy import TcpProxy


class Echo:
    """A server answering every chunk with `tag` + the chunk."""

    def __init__(self, tag: bytes) -> None:
        self.tag = tag
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(client,), daemon=True).start()

    def _echo(self, client: socket.socket) -> None:
        with client:
            try:
                while data := client.recv(4096):
                    client.sendall(self.tag + data)
            except OSError:
                pass


@pytest.fixture
def servers() -> Iterator[tuple[Echo, Echo]]:
    first, second = Echo(b"1:"), Echo(b"2:")
    yield first, second
    first.listener.close()
    second.listener.close()


def ask(sock: socket.socket, text: bytes) -> bytes:
    sock.sendall(text)
    return sock.recv(4096)


def connect(proxy: TcpProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


def assert_unanswered(sock: socket.socket, text: bytes) -> None:
    """`text` goes out and no answer comes back (within 0.3 s); the socket stays open."""
    sock.settimeout(0.3)
    sock.sendall(text)
    with pytest.raises(TimeoutError):
        sock.recv(4096)


def assert_reset(sock: socket.socket) -> None:
    """The proxy cut `sock` with an RST (not a FIN, not silence)."""
    sock.settimeout(5)
    with pytest.raises(ConnectionResetError):
        sock.recv(4096)
    sock.close()


def test_the_proxy_forwards_and_a_cut_resets_the_open_connection(
    servers: tuple[Echo, Echo],
) -> None:
    first, _ = servers
    with TcpProxy(first.address) as proxy:
        client = connect(proxy)
        assert ask(client, b"hello") == b"1:hello"
        assert proxy.cut() == 1
        assert_reset(client)  # reset (or closed), at once
        with connect(proxy) as again:
            assert ask(again, b"again") == b"1:again"


def test_a_blackhole_holds_bytes_without_closing_and_healing_delivers_them(
    servers: tuple[Echo, Echo],
) -> None:
    first, _ = servers
    with TcpProxy(first.address) as proxy:
        client = connect(proxy)
        assert ask(client, b"a") == b"1:a"
        proxy.blackhole()
        assert_unanswered(client, b"held")
        late = connect(proxy)  # a new connection waits too
        assert_unanswered(late, b"parked")
        assert proxy.open_connections == 1
        proxy.heal()
        client.settimeout(5)
        late.settimeout(5)
        assert client.recv(4096) == b"1:held"
        assert late.recv(4096) == b"1:parked"
        client.close()
        late.close()


def test_a_switch_cuts_open_connections_and_sends_new_ones_to_the_other_server(
    servers: tuple[Echo, Echo],
) -> None:
    first, second = servers
    with TcpProxy(first.address) as proxy:
        client = connect(proxy)
        assert ask(client, b"a") == b"1:a"
        proxy.switch(second.address)
        assert_reset(client)
        with connect(proxy) as fresh:
            assert ask(fresh, b"x") == b"2:x"


def test_forgetting_leaves_the_client_socket_open_and_silent_while_new_ones_work(
    servers: tuple[Echo, Echo],
) -> None:
    first, _ = servers
    with TcpProxy(first.address) as proxy:  # a dead NAT
        fresh = connect(proxy)
        assert ask(fresh, b"x") == b"1:x"
        assert proxy.forget() == 1
        assert_unanswered(fresh, b"lost")
        assert proxy.open_connections == 0
        again = connect(proxy)
        assert ask(again, b"y") == b"1:y"
        again.close()
        fresh.close()
        assert proxy.accepted == 2
