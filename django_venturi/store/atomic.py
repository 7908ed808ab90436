"""Atomic handlers (`@venturi.task(atomic=True)`): the writes and the verdict commit together.

The handler runs inside `transaction.atomic()` on the jobs' database, on the
handler thread's own connection, and the job's verdict is written in that
same transaction before it commits. The verdict write is fenced by the run's
claim token, as every verdict write is (`completion.py`): if the run lost its
claim meanwhile (it stalled past its lease and another worker recovered the
job), the write applies nothing, and the whole transaction is rolled back with
the handler's writes. The verdict then goes to the worker's results writer
like any other, which journals it as `discarded`.

A handler that raises rolls its writes back too (the exception leaves the
`atomic` block); its retry starts from a clean slate. A worker killed in the
middle loses its connection, and PostgreSQL rolls the transaction back.

A handler that returned, whose verdict write or commit then failed because of
the database (a lost connection, a server refusing writes after a failover), did
nothing a retry would repeat, unless the commit was applied and only its answer
lost. Its verdict goes to the results writer marked `if_unapplied`: the writer
looks in the journal once it reaches a writable database, reports the verdict if
it was applied, and otherwise hands the job back (`released`: run again, not a
failure).

The job row is locked only by the final verdict write, never while the
handler runs, so heartbeats extend the lease as for any job, and a stalled
run blocks nobody.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from django.db import transaction

from django_venturi.store import verdicts
from django_venturi.store.completion import write_runs
from django_venturi.store.connections import unavailable
from django_venturi.store.verdicts import Verdict


class _LostClaim(Exception):
    """Rolls back an atomic run whose verdict the fence refused."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(f"job {verdict.job.id}: the run lost its claim")
        self.verdict = verdict


def run_atomically(
    alias: str, worker: str, handle: Callable[[], object], judge: Callable[[object], Verdict]
) -> Verdict:
    """Run `handle()` and write `judge(its result)` in one transaction on `alias`.

    Returns the verdict marked `written`, or as it was if the run had lost its
    claim (nothing of the run was committed), or marked `if_unapplied` if the database
    failed its write or commit (see above). Raises what `handle` raises, after
    rolling its writes back.
    """
    verdict: Verdict | None = None
    try:
        with transaction.atomic(using=alias):
            verdict = judge(handle())
            if (verdict.job.id, verdict.job.attempt) not in write_runs(alias, worker, [verdict]):
                raise _LostClaim(verdict)
    except _LostClaim as lost:
        return lost.verdict
    except Exception as error:
        if verdict is None or not unavailable(error):
            raise  # the handler's own error, or its judge's
        return dataclasses.replace(verdict, if_unapplied=verdicts.released(verdict.job))
    return dataclasses.replace(verdict, written=True)
