"""Each run's own databases: a per-run suffix, and the run drops what it made.

Every database the suite makes on the shared server is named for the run:
`test_venturi_r1a2b3c4d`, `venturi_readme_r1a2b3c4d`, ... With VENTURI_TEST_RUN set, that
is the suffix (two checkouts side by side each give their own); unset, `run_suffix()`
picks a new one (`_r` and eight hex digits) and puts it in VENTURI_TEST_RUN before the
settings read it, so worker subprocesses and nested pytest runs inherit it.

The run that picked or first read the suffix owns it (VENTURI_TEST_RUN_OWNER holds its
pid; nested runs see it set and own nothing). The owner holds a PostgreSQL advisory lock
named for its suffix while it runs, and at its end drops the databases of RUN_DATABASES
with its suffix and removes its SQLite files. A run killed before its end leaves them
behind: the next owner drops those of picked suffixes whose lock no session holds (their
run is gone), never those of a live run, and never a suffix somebody chose by hand. The
private clusters of `tests/clusters.py` are named with the suffix too, and are local to
the machine, whose runs may use other servers: for them the owner also holds a lock
file (RUNS_HERE), and a cluster whose run's file nobody holds is dropped when the next
run makes one (`run_is_gone_here`).
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import tempfile
import zlib
from pathlib import Path

RUN = "VENTURI_TEST_RUN"
OWNER = "VENTURI_TEST_RUN_OWNER"
RUN_DATABASES = (
    "test_venturi",
    "venturi_readme",
    "venturi_demo",
    "venturi_e2e",
    "venturi_admin_scale",
    "venturi_wagtail_site",
)
"""The databases a run may make on the tests' server, each named with the run's suffix."""
PICKED = re.compile(r"_r[0-9a-f]{8}")
"""The form of a suffix `run_suffix()` picks: only those are ever dropped as stale."""
LOCK_CLASS = 0x7665  # "ve": the advisory locks' first key, the suffix's CRC is the second
TESTS = Path(__file__).resolve().parent
RUNS_HERE = Path(tempfile.gettempdir()) / f"venturi-test-runs-{os.getuid()}"
"""Each owner's lock file on this machine, for what is local to it (private clusters)."""


def run_suffix() -> str:
    """This run's suffix: VENTURI_TEST_RUN, or a new one put there for subprocesses."""
    suffix = os.environ.setdefault(RUN, f"_r{secrets.token_hex(4)}")
    os.environ.setdefault(OWNER, str(os.getpid()))
    return suffix


def owns_the_run() -> bool:
    """Whether this process owns the run's suffix (not a nested run, not a worker)."""
    return os.environ.get(OWNER) == str(os.getpid())


def sqlite_files(suffix: str) -> list[Path]:
    """The SQLite files of a run (tests/settings.py names them)."""
    return [TESTS / f"venturi-tests{suffix}.sqlite3", TESTS / f"test_venturi-tests{suffix}.sqlite3"]


def lock_key(suffix: str) -> int:
    """The advisory lock's second key: the suffix's CRC-32 as a signed 32-bit integer."""
    crc = zlib.crc32(suffix.encode())
    return crc - 2**32 if crc >= 2**31 else crc


class SuffixInUse(RuntimeError):
    """Another run, still going, has this run's suffix: they would drop each other's."""

    def __init__(self, suffix: str) -> None:
        super().__init__(
            f"Another test run is using the suffix {suffix!r} (VENTURI_TEST_RUN): give this "
            "run another, or leave VENTURI_TEST_RUN unset to have one picked."
        )


class RunDatabases:
    """The owner's hold on its suffix: the lock while it runs, the clean-up at its end."""

    def __init__(self, url: str, suffix: str) -> None:
        import psycopg

        self.suffix = suffix
        RUNS_HERE.mkdir(exist_ok=True)
        self.lock_file = (RUNS_HERE / f"{suffix}.lock").open("a")
        self.connection = psycopg.connect(url, autocommit=True)
        try:
            fcntl.flock(self.lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            raise SuffixInUse(suffix) from None
        if not self._is_gone(suffix):
            self.release()
            raise SuffixInUse(suffix)

    def drop_stale(self) -> list[str]:
        """Drop what runs that picked their suffix and are gone left behind; their suffixes."""
        rows = self.connection.execute("SELECT datname FROM pg_database").fetchall()
        names = [str(name) for (name,) in rows]
        suffixes = {suffix for name in names if (suffix := picked_suffix(name))}
        gone = sorted(s for s in suffixes - {self.suffix} if self._is_gone(s))
        for suffix in gone:
            self._drop(suffix)
            self.connection.execute(
                "SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, lock_key(suffix))
            )
        for path in RUNS_HERE.glob("*.lock"):  # gone runs' files, removed as they are read
            run_is_gone_here(path.stem)
        return gone

    def _is_gone(self, suffix: str) -> bool:
        """A run is gone when its lock is free; the lock is then ours (until dropped)."""
        row = self.connection.execute(
            "SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, lock_key(suffix))
        ).fetchone()
        return bool(row and row[0])

    def _drop(self, suffix: str) -> None:
        from psycopg import sql

        for name in RUN_DATABASES:
            statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            self.connection.execute(statement.format(sql.Identifier(f"{name}{suffix}")))
        for path in sqlite_files(suffix):
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """Drop this run's databases and files, then let go of its lock."""
        try:
            self._drop(self.suffix)
            (RUNS_HERE / f"{self.suffix}.lock").unlink(missing_ok=True)
        finally:
            self.release()

    def release(self) -> None:
        """Let go of the run's locks, dropping nothing (again: nothing happens)."""
        if not self.lock_file.closed:
            self.lock_file.close()
        self.connection.close()


def run_is_gone_here(suffix: str) -> bool:
    """Whether the run of `suffix` on this machine is over: nobody holds its lock file."""
    path = RUNS_HERE / f"{suffix}.lock"
    try:
        with path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # not ours to read: someone else's run
        return False
    path.unlink(missing_ok=True)
    return True


def picked_suffix(database: str) -> str | None:
    """The picked suffix of a run's database name (`test_venturi_r1a2b3c4d`), if it is one."""
    for name in RUN_DATABASES:
        rest = database.removeprefix(name)
        if rest != database and PICKED.fullmatch(rest):
            return rest
    return None
