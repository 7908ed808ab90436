"""The lock each worker's listener holds while connected: which workers can hear a wake-up.

A worker killed without a word (`kill -9`, an OOM kill, a lost node) keeps its
registry row, which looks live until its heartbeat is old
(`registration.stale_after()`, 30 s by default), and wake-ups routed by those rows
(`worker/wake_order.py`) would call it all that time. Its listener's connection,
though, is gone at once, and PostgreSQL knows: a session's advisory locks go with
it. So each listener takes a session advisory lock named after its worker when it
connects, and `holders` reads which of those locks are held now: one look at
`pg_locks`, which takes no lock and waits for no one.

The keys are CRC-32s of worker names: two workers whose names collide (one chance
in four billion per pair) share a key, and one's lock stands for both; the only
cost is a dead one looking alive until its heartbeat is old, as before. These
statements run on the listener's own psycopg connection, on PostgreSQL only.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

LOCK_CLASS = 0x76656E74
"""The first key of every listener lock (b"vent"), which the two-key form of
`pg_advisory_lock` keeps apart from the one-key locks of venturi and of users."""

HOLDERS = """
SELECT objid::bigint FROM pg_locks
WHERE locktype = 'advisory' AND classid = %s::bigint::oid AND objsubid = 2 AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
"""The second keys of the listener locks held in this database (`objsubid = 2`: the
two-key form)."""


def key(worker: str) -> int:
    """The second key of `worker`'s listener lock, as `pg_locks.objid` shows it (unsigned)."""
    return zlib.crc32(worker.encode())


def take(connection: psycopg.Connection[Any], worker: str) -> bool:
    """Hold `worker`'s listener lock for the life of this session; False if another
    session holds it (a worker of a colliding name: its lock stands for both)."""
    signed = key(worker) - (1 << 32) if key(worker) >= 1 << 31 else key(worker)
    row = connection.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_CLASS, signed]).fetchone()
    return bool(row and row[0])


def holders(connection: psycopg.Connection[Any]) -> frozenset[int]:
    """The keys of the workers whose listeners are connected now."""
    return frozenset(int(objid) for (objid,) in connection.execute(HOLDERS, [LOCK_CLASS]))
