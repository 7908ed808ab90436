"""Tampered rows: a row can make a worker run a registered kind's handler, and nothing else.

A tripwire module (written to a temporary directory that is on the worker's
PYTHONPATH) leaves a marker file when anything imports it, and another when
anything calls it. Tampered rows name it as a kind, in a pickled payload, as a
`__reduce__` recipe and as a class path inside payload fields. The test first
proves the tripwire works (a subprocess that unpickles the blob trips it), then
runs a real worker over the rows and checks that nothing tripped.
"""

from __future__ import annotations

import base64
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from django_venturi.payloads.codec import encode
from tests.conftest import Workers, wait_until, worker_env
from tests.test_codec import full_payload
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

TRIPWIRE = """
import os
import pathlib

MARKERS = pathlib.Path(os.environ["VENTURI_TRIPWIRE"])
(MARKERS / "imported").touch()


def boom(*args, **kwargs):
    (MARKERS / "called").touch()
    return 0


class Boom:
    def __init__(self, *args, **kwargs):
        boom()

    def handle(self, ctx):
        boom()
"""

# What pickle.dumps(venturi_tripwire.boom()) would hold: import the module, call boom().
PICKLED = base64.b64encode(b"cventuri_tripwire\nboom\n(tR.").decode()


@pytest.fixture
def tripwire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module that leaves markers in the returned directory when imported or called."""
    modules = tmp_path / "modules"
    markers = tmp_path / "markers"
    modules.mkdir()
    markers.mkdir()
    (modules / "venturi_tripwire.py").write_text(TRIPWIRE)
    monkeypatch.setenv("PYTHONPATH", str(modules))  # worker_env() keeps it after the root
    monkeypatch.setenv("VENTURI_TRIPWIRE", str(markers))
    # The tripwire is armed: unpickling the blob, as a careless worker would, trips it.
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import base64, pickle, sys; pickle.loads(base64.b64decode(sys.argv[1]))",
            PICKLED,
        ],
        env=worker_env(),
        check=True,
        timeout=30,
    )
    assert sorted(path.name for path in markers.iterdir()) == ["called", "imported"]
    for marker in markers.iterdir():
        marker.unlink()
    return markers


def tamper(alias: str, job: object, **changes: object) -> int:
    job_id = job.pk  # type: ignore[attr-defined]
    assert Job.objects.using(alias).filter(pk=job_id).update(**changes) == 1
    return int(job_id)


def test_tampered_rows_never_make_the_worker_import_or_call_anything(
    alias: str, workers: Workers, tripwire: Path, tmp_path: Path
) -> None:
    os_system_ran = tmp_path / "os_system_ran"
    unknown_kinds = {
        "venturi_tripwire.Boom": {},
        "venturi_tripwire:boom": {},
        "venturi_tripwire": {},
        "os.system": {"command": f"touch {os_system_ran}"},
        "builtins.eval": {"source": "__import__('venturi_tripwire')"},
        "tests.testapp.tasks.Noop": {"n": 1},  # a class path, not its registered kind
    }
    unclaimed = {
        tamper(alias, tasks.Noop(n=0).enqueue(using=alias), kind=kind, payload=payload): kind
        for kind, payload in unknown_kinds.items()
    }

    typed = encode(full_payload())
    bad_payloads = {
        "a pickled blob": (PICKLED, "expected an object, got str"),
        "a __reduce__ recipe": (
            {"__reduce__": ["venturi_tripwire.boom", []]},
            "Noop.__reduce__: unknown field",
        ),
        "a jsonpickle object": (
            {"n": {"py/object": "venturi_tripwire.Boom"}},
            "Noop.n: expected int, got dict",
        ),
        "a pickle beside the fields": ({"n": 1, "__pickle__": PICKLED}, "unknown field"),
        "a list of arguments": (["venturi_tripwire.boom"], "expected an object, got list"),
    }
    refused = {
        tamper(alias, tasks.Noop(n=0).enqueue(using=alias), payload=payload): (name, reason)
        for name, (payload, reason) in bad_payloads.items()
    }
    nested = tamper(
        alias,
        tasks.AllTypes(**full_payload().__dict__).enqueue(using=alias),
        payload={
            **typed,
            "address": {"__class__": "venturi_tripwire.Boom", "street": "x"},
        },
    )
    refused[nested] = ("a class path in a nested dataclass", "AllTypes.address.__class__")
    enum = tamper(
        alias,
        tasks.AllTypes(**full_payload().__dict__).enqueue(using=alias),
        payload={**typed, "colour": "venturi_tripwire.Boom"},
    )
    refused[enum] = ("a class path as an enum value", "is not a Colour")
    carry = tamper(alias, tasks.Pausing(steps=2).enqueue(using=alias), carry=PICKLED)
    refused[carry] = ("a pickled carry", "expected an object, got str")

    # A running row of an unknown kind, whose worker vanished: recovered without import.
    orphan = tamper(
        alias,
        tasks.Noop(n=0).enqueue(using=alias),
        kind="venturi_tripwire.Boom",
        state=venturi.State.RUNNING,
        attempt=1,
        claim_token=uuid.uuid4(),
        claimed_by="vanished",
        started_at=timezone.now() - timedelta(minutes=2),
        lease_expires_at=timezone.now() - timedelta(minutes=1),
    )
    fine = [tasks.Noop(n=i).enqueue(using=alias) for i in range(3)]

    result = workers.burst(alias, "--concurrency", "2")

    assert sorted(path.name for path in tripwire.iterdir()) == [], "the tripwire tripped"
    assert not os_system_ran.exists()
    for job_id, kind in unclaimed.items():
        row = Job.objects.using(alias).get(pk=job_id)
        assert (row.state, row.attempt, row.kind) == (venturi.State.READY, 0, kind)
        assert not JournalEntry.objects.using(alias).filter(job_id=job_id).exists()
    for job_id, (name, reason) in refused.items():
        row = Job.objects.using(alias).get(pk=job_id)
        assert row.state == venturi.State.FAILED and row.attempt == 1, name
        (entry,) = JournalEntry.objects.using(alias).filter(job_id=job_id)
        assert entry.outcome == "failed", name
        assert entry.error_type == "django_venturi.payloads.codec.PayloadError", name
        assert "the stored payload does not fit tests.testapp.tasks." in entry.error_message, name
        assert reason in entry.error_message, (name, entry.error_message)
        assert entry.error_message in row.last_error, name
        # The refusal names what is wrong, without echoing the tampered blob.
        assert PICKLED not in entry.error_message and PICKLED not in entry.traceback, name
    assert PICKLED not in result.stderr and PICKLED not in result.stdout
    recovered = Job.objects.using(alias).get(pk=orphan)
    assert (recovered.state, recovered.attempt, recovered.failures) == (venturi.State.READY, 1, 1)
    (lost,) = JournalEntry.objects.using(alias).filter(job_id=orphan)
    assert (lost.outcome, lost.worker) == ("lease_expired", "vanished")
    for job in fine:
        job.refresh_from_db()
        assert job.state == venturi.State.COMPLETED, "the worker did not go on with other jobs"


def test_a_long_running_worker_goes_on_after_refusing_a_tampered_row(
    alias: str, workers: Workers, tripwire: Path
) -> None:
    worker = workers.start(alias)
    with transaction.atomic(using=alias):  # the worker never sees the untampered row
        bad = tasks.Noop(n=0).enqueue(using=alias)
        tamper(alias, bad, payload=PICKLED)
    wait_until(
        lambda: Job.objects.using(alias).get(pk=bad.pk).state == venturi.State.FAILED,
        message="the tampered job to fail",
    )
    after = tasks.Noop(n=1).enqueue(using=alias)
    wait_until(
        lambda: Job.objects.using(alias).get(pk=after.pk).state == venturi.State.COMPLETED,
        message="the next job to complete",
    )
    assert worker.poll() is None
    assert sorted(path.name for path in tripwire.iterdir()) == []
    refused = Job.objects.using(alias).get(pk=bad.pk)
    assert "does not fit tests.testapp.tasks.Noop" in refused.last_error
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
