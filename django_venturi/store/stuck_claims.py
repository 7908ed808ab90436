"""Ending the session of a claim whose worker stopped in the middle of its pipeline.

A claim of capped or rate-limited kinds sends the caps lock's statement and the
claim statement in one pipeline that ends with its Sync (`claim.py`). The client
writes them one after the other; a worker frozen (SIGSTOP, a paused VM, a host
gone) after the first write and before the Sync leaves its session *active*,
waiting to read from its client. No PostgreSQL timeout applies there:
`idle_in_transaction_session_timeout` counts only while a session is idle in a
transaction, `statement_timeout` only while a statement runs. Such a session holds
the caps lock (and, if the claim statement ran, the rows it took) until its worker
thaws: every other worker's claims of capped and rate-limited kinds are left for
later meanwhile, and the jobs it took wait.

So each worker's lease sweep (every `RESCUE_INTERVAL`) looks for a session that
holds the caps lock and has waited on its client for longer than `CAPS_LOCK_HOLD`
since its last statement began, and ends it (`pg_terminate_backend`). Its
transaction rolls back: the lock is free, the rows it took are ready again, and
the worker, when it runs again, finds its connection gone and reconnects, as
after any lost connection. A live worker sends the Sync microseconds after the
statements, so the bound only ever reaches a worker that stopped. It needs the
right to end the other session (the same role, or `pg_signal_backend`); without
it the sweep logs a warning and the session lasts until its worker thaws.
"""

from __future__ import annotations

import logging

from django import db
from django.db import connections

from django_venturi.store import statements
from django_venturi.store.claim import CAPS_LOCK_HOLD, CAPS_LOCK_KEY

logger = logging.getLogger("django_venturi.worker")

_END_STUCK_HOLDERS = """
SELECT activity.pid, pg_terminate_backend(activity.pid)
FROM pg_locks AS held JOIN pg_stat_activity AS activity ON activity.pid = held.pid
WHERE held.locktype = 'advisory' AND held.granted AND held.objsubid = 1
  AND held.classid::bigint = %(high)s AND held.objid::bigint = %(low)s
  AND held.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND activity.pid <> pg_backend_pid()
  AND activity.state = 'active' AND activity.wait_event = 'ClientRead'
  AND clock_timestamp() - activity.state_change > make_interval(secs => %(hold)s)
"""


def end_stuck_holders(alias: str) -> list[int]:
    """End the sessions that hold the caps lock while their workers stopped mid-pipeline
    (longer than `CAPS_LOCK_HOLD`); return their process ids. PostgreSQL only."""
    if connections[alias].vendor != "postgresql":
        return []
    params = {
        "high": CAPS_LOCK_KEY >> 32,
        "low": CAPS_LOCK_KEY & 0xFFFFFFFF,
        "hold": CAPS_LOCK_HOLD.total_seconds(),
    }
    try:
        rows = statements.fetch(alias, _END_STUCK_HOLDERS, params)
    except db.ProgrammingError as error:  # no right to end that session
        logger.warning(
            "a session holds the caps lock while its worker stopped mid-claim, and this "
            "worker may not end it (grant pg_signal_backend, or run the workers under one "
            "role): capped and rate-limited kinds wait until that worker runs again (%s)",
            error,
        )
        return []
    ended = [int(pid) for pid, terminated in rows if terminated]
    if ended:
        logger.warning(
            "ended the database session(s) %s: each held the caps lock and had waited on "
            "its worker for more than %g s in the middle of a claim (the worker stopped "
            "between its statements); the claim rolled back",
            ", ".join(str(pid) for pid in ended),
            CAPS_LOCK_HOLD.total_seconds(),
            extra={"sessions": ended},
        )
    return ended
