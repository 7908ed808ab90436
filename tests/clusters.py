"""Private PostgreSQL clusters that a test may restart, stop or reconfigure.

The suite's own PostgreSQL (DATABASE_URL) is shared with other runs and must
never be restarted. A test that needs to take the server down makes a cluster
of its own with Debian's postgresql-common tools (`pg_createcluster`,
`pg_ctlcluster`, `pg_dropcluster`), which needs root, as CI runs:

    with private_cluster("restart") as cluster:
        url = cluster.url("venturi")
        cluster.restart()

    with private_cluster("primary") as primary, private_standby("standby", primary) as standby:
        primary.set_read_only()             # new transactions' writes fail with 25006
        primary.wait_transactions_end(primary.clock())   # older ones can still commit
        standby.wait_replayed(primary.wal_position())
        standby.promote()

A cluster's name carries the run's VENTURI_TEST_RUN, so two runs never share one,
and a cluster of the same name left by a killed run is dropped first, as are those
of killed runs whose suffix was picked for them (`tests/run_databases.py`). Local
connections are trusted (tests only); with `ssl=True` the server accepts TLS
with Debian's snakeoil certificate, or a self-signed one made for the cluster
when the machine has none.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from urllib.parse import urlencode

import psycopg

from tests import run_databases

VERSION = "15"
PORTS = range(5440, 5500)
SNAKEOIL_CERT = Path("/etc/ssl/certs/ssl-cert-snakeoil.pem")
SNAKEOIL_KEY = Path("/etc/ssl/private/ssl-cert-snakeoil.key")
CONFIG_ROOT = Path("/etc/postgresql") / VERSION
START_TIMEOUT = 60.0


class ClusterError(RuntimeError):
    """A postgresql-common command failed; the message has its output."""


def run(*command: str) -> str:
    """Run a postgresql-common command; raise ClusterError with its output if it fails."""
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise ClusterError(
            f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
        )
    return result.stdout


def available() -> str | None:
    """Why private clusters cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "private PostgreSQL clusters need root (pg_createcluster)"
    if shutil.which("pg_createcluster") is None:
        return "pg_createcluster not found (Debian's postgresql-common)"
    return None


def existing_clusters() -> dict[str, int]:
    """Cluster name -> port, for this PostgreSQL version."""
    clusters = {}
    for line in run("pg_lsclusters", "--no-header").splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0] == VERSION:
            clusters[fields[1]] = int(fields[2])
    return clusters


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(name: str, taken: set[int]) -> int:
    """A free port, searched from one that depends on the name: runs of other names
    (other sessions, CI beside a developer) rarely try the same one first."""
    start = zlib.crc32(name.encode()) % len(PORTS)
    for offset in range(len(PORTS)):
        port = PORTS[(start + offset) % len(PORTS)]
        if port not in taken and port_is_free(port):
            return port
    raise ClusterError(f"no free port in {PORTS.start}-{PORTS.stop - 1} for a private cluster")


class Cluster:
    """One private cluster: created, started, restarted, stopped and dropped by name."""

    def __init__(self, name: str, *, ssl: bool = False) -> None:
        self.name = name
        self.ssl = ssl
        self.port = 0
        self.config_dir = CONFIG_ROOT / name
        self.cert_file: Path | None = None
        """With `ssl`: the server's certificate (self-signed: also its own root)."""

    # ------------------------------------------------------------ life cycle

    def create(self) -> None:
        """Make the cluster (dropping a stale one of the same name) and start it."""
        self._make()
        self.start()

    def create_standby(self, primary: Cluster) -> None:
        """Make the cluster a streaming standby of `primary` (`pg_basebackup -R`: its
        data directory is the primary's, with `standby.signal` and `primary_conninfo`),
        start it and wait until it streams. PostgreSQL 15's default `wal_level=replica`
        and `max_wal_senders` are what a standby needs; the trusted pg_hba.conf lets it
        replicate."""
        self._make()
        data = self.data_directory()
        for entry in data.iterdir():  # pg_basebackup fills an empty directory, kept as made
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        run(
            "runuser",
            "-u",
            "postgres",
            "--",
            "pg_basebackup",
            "--host=127.0.0.1",
            f"--port={primary.port}",
            "--username=postgres",
            f"--pgdata={data}",
            "--write-recovery-conf",
            "--wal-method=stream",
            "--checkpoint=fast",
            "--no-sync",
        )
        self.start()
        wait_for(lambda: bool(primary.execute(STREAMING)), f"{self.name} to stream")

    def _make(self) -> None:
        drop_clusters_of_gone_runs()
        clusters = existing_clusters()
        if self.name in clusters:
            self.drop()
            clusters.pop(self.name)
        self.port = free_port(self.name, set(clusters.values()))
        options = {
            "listen_addresses": "'127.0.0.1'",
            "max_connections": "200",
            "fsync": "off",  # nothing here must survive a crash of the machine
            "full_page_writes": "off",
            "shared_buffers": "'64MB'",
        }
        options.update(self._ssl_options() if self.ssl else {"ssl": "off"})
        run(
            "pg_createcluster",
            "--quiet",
            "--start-conf=manual",
            VERSION,
            self.name,
            "--port",
            str(self.port),
            "--",
            "--auth=trust",
            "--no-sync",
        )
        # Debian's postgresql.conf reads conf.d/ last: these win over its defaults.
        lines = [f"{key} = {value}\n" for key, value in options.items()]
        (self.config_dir / "conf.d" / "venturi-tests.conf").write_text("".join(lines))

    def data_directory(self) -> Path:
        return Path("/var/lib/postgresql") / VERSION / self.name

    def _ssl_options(self) -> dict[str, str]:
        cert, key = SNAKEOIL_CERT, SNAKEOIL_KEY
        if not (cert.exists() and key.exists()):
            cert, key = self._self_signed()
        self.cert_file = cert
        return {"ssl": "on", "ssl_cert_file": f"'{cert}'", "ssl_key_file": f"'{key}'"}

    def _self_signed(self) -> tuple[Path, Path]:
        """A certificate for 127.0.0.1 in a folder of the cluster's, readable by postgres only."""
        folder = Path("/var/lib/postgresql") / f"{self.name}-tls"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        cert, key = folder / "server.crt", folder / "server.key"
        run(
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        )
        for path in (folder, cert, key):
            shutil.chown(path, "postgres", "postgres")
        key.chmod(0o600)
        return cert, key

    def require_tls(self) -> None:
        """Refuse TCP connections without TLS (pg_hba.conf: hostssl only), then reload."""
        assert self.ssl, "a cluster made without ssl cannot require it"
        (self.config_dir / "pg_hba.conf").write_text(
            "local all all trust\n"
            "hostssl all all 127.0.0.1/32 trust\n"
            "hostnossl all all 0.0.0.0/0 reject\n"
        )
        self._ctl("reload")

    def start(self) -> None:
        self._ctl("start")

    def stop(self) -> None:
        self._ctl("stop")

    def restart(self) -> None:
        """A real server restart (fast shutdown: every connection is closed), then wait
        until it accepts connections again."""
        self._ctl("restart")

    def _ctl(self, action: str) -> None:
        run("pg_ctlcluster", "--mode=fast", VERSION, self.name, action)
        if action in {"start", "restart"}:
            self.wait_ready()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=5).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def drop(self) -> None:
        if self.name in existing_clusters():
            run("pg_dropcluster", "--stop", VERSION, self.name)
        shutil.rmtree(Path("/var/lib/postgresql") / f"{self.name}-tls", ignore_errors=True)

    # ------------------------------------------------------------ using it

    def url(self, dbname: str, **options: str) -> str:
        query = f"?{urlencode(options)}" if options else ""
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}{query}"

    def execute(self, sql: str, dbname: str = "postgres") -> list[tuple[object, ...]]:
        """Run one statement in autocommit on the cluster; its rows, if any."""
        with psycopg.connect(self.url(dbname), autocommit=True) as connection:
            cursor = connection.execute(sql.encode())
            return cursor.fetchall() if cursor.description else []

    def create_database(self, dbname: str) -> None:
        self.execute(f'CREATE DATABASE "{dbname}"')

    # ------------------------------------------------------------ failover

    def promote(self) -> None:
        """Promote a standby (`pg_promote()`, which waits until it accepts writes)."""
        (promoted,) = self.execute("SELECT pg_promote(wait => true, wait_seconds => 60)")[0]
        assert promoted, f"{self.name} was not promoted"

    def set_read_only(self, read_only: bool = True) -> None:
        """Make every new transaction read-only (`default_transaction_read_only`, reloaded:
        open sessions take it too), so that writes are refused with SQLSTATE 25006 as a
        demoted primary, or a managed database fenced for failover, refuses them."""
        value = "on" if read_only else "off"
        self.execute(f"ALTER SYSTEM SET default_transaction_read_only = {value}")
        self.execute("SELECT pg_reload_conf()")

    def clock(self) -> datetime:
        """The server's clock now."""
        value = self.execute("SELECT clock_timestamp()")[0][0]
        assert isinstance(value, datetime)
        return value

    def wait_transactions_end(self, begun_before: datetime, timeout: float = START_TIMEOUT) -> None:
        """Wait until no client's transaction begun before `begun_before` is open. After
        `set_read_only`, the fence is complete then: a transaction begun earlier could still
        write and commit, one begun later cannot."""
        sql = (
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
            f"AND pid <> pg_backend_pid() AND xact_start < '{begun_before.isoformat()}'"
        )
        wait_for(
            lambda: self.execute(sql)[0][0] == 0,
            f"{self.name}'s transactions begun before {begun_before} to end",
            timeout,
        )

    def is_in_recovery(self) -> bool:
        return bool(self.execute("SELECT pg_is_in_recovery()")[0][0])

    def wal_position(self) -> str:
        """The primary's current WAL position (for `wait_replayed`)."""
        return str(self.execute("SELECT pg_current_wal_lsn()")[0][0])

    def wait_replayed(self, position: str, timeout: float = START_TIMEOUT) -> None:
        """Wait until this standby has replayed the primary's WAL up to `position`."""
        wait_for(
            lambda: bool(
                self.execute(f"SELECT pg_last_wal_replay_lsn() >= '{position}'::pg_lsn")[0][0]
            ),
            f"{self.name} to replay up to {position}",
            timeout,
        )

    def log(self) -> str:
        """The server's log (what it said about restarts, refused connections...)."""
        path = Path("/var/log/postgresql") / f"postgresql-{VERSION}-{self.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


STREAMING = "SELECT 1 FROM pg_stat_replication WHERE state = 'streaming'"


def wait_for(condition: Callable[[], bool], what: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def cluster_name(purpose: str) -> str:
    """A cluster name unique to this run (VENTURI_TEST_RUN) and purpose."""
    suffix = os.environ.get("VENTURI_TEST_RUN", "").strip("_") or "main"
    return f"venturi_{purpose}_{suffix}".lower()


def drop_clusters_of_gone_runs() -> list[str]:
    """Drop the clusters of runs that picked their suffix and are gone (killed before
    they could drop them: `tests/run_databases.py`); their names. Only in the process
    that owns a run (soak and chaos runs leave others' clusters alone)."""
    if not run_databases.owns_the_run():
        return []
    ours = os.environ[run_databases.RUN]
    gone = [
        name
        for name in existing_clusters()
        if (match := re.fullmatch(r"venturi_\w+?(_r[0-9a-f]{8})", name))
        and match[1] != ours
        and run_databases.run_is_gone_here(match[1])
    ]
    for name in gone:
        Cluster(name).drop()
    return gone


@contextlib.contextmanager
def private_cluster(purpose: str, *, ssl: bool = False) -> Iterator[Cluster]:
    """A started private cluster for the block; dropped at its end, whatever happened."""
    cluster = Cluster(cluster_name(purpose), ssl=ssl)
    try:
        cluster.create()
        yield cluster
    finally:
        cluster.drop()


@contextlib.contextmanager
def private_standby(purpose: str, primary: Cluster) -> Iterator[Cluster]:
    """A streaming standby of `primary` for the block (a private cluster); dropped at its end."""
    cluster = Cluster(cluster_name(purpose))
    try:
        cluster.create_standby(primary)
        yield cluster
    finally:
        cluster.drop()
