"""Poison rows: stored JSON that Python cannot read back fails its own job and nothing else.

PostgreSQL (and SQLite) store JSON that Python's readers refuse: an integer of
5,000 digits (past `sys.get_int_max_str_digits()`) or arrays nested thousands
deep (RecursionError). The public API never writes one; SQL, a data fix or
another program can. Here such rows are written with SQL beside good jobs, and:

- a real worker claims them in one batch with good jobs: the good jobs complete,
  each poison row ends `failed` with a journal entry saying "stored payload
  unreadable: ...", and the worker lives on and keeps working;
- lease recovery of an expired poison row works, and holds back no other;
- the admin lists such a row, shows its page, filters and deletes it;
- a property: arbitrary JSON text (deep, huge numbers, odd unicode, wrong shapes)
  written into rows beside good jobs, drained through the real claim: every good
  job completes, every other row finishes, failed ones with a reason.
"""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.db.models import TextField
from django.db.models.functions import Cast
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import django_venturi as venturi
from django_venturi.admin.display import pretty_json
from django_venturi.models import Job, JournalEntry
from django_venturi.payloads.stored import UNREADABLE_PREFIX, Unreadable
from django_venturi.store import leases
from django_venturi.testing import drain
from tests.conftest import Workers, vanished_run, wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

CHANGELIST = reverse("admin:django_venturi_job_changelist")
HUGE_NUMBER = '{"n": ' + "9" * 5000 + "}"
"""An integer of 5,000 digits: `json.loads` refuses past 4,300."""
DEEP = {"postgresql": 11_000, "sqlite": 1_500}
"""Arrays nested this deep: past what Python's `json` reads, within what each database stores
(SQLite's JSON_VALID, which Django's check constraint uses, stops at 2,000). Python 3.11
and 3.12 stop at the recursion limit (1,000); 3.13 reads in C up to about 10,000 levels,
so there SQLite cannot hold a value too deep for Python (`too_deep_for_python`)."""


def nested(depth: int) -> str:
    return '{"n": ' + "[" * depth + "]" * depth + "}"


def too_deep_for_python(alias: str) -> bool:
    """Whether this interpreter fails to read the deepest value DEEP writes into `alias`."""
    try:
        json.loads(nested(DEEP[connections[alias].vendor]))
    except RecursionError:
        return True
    return False


def poison(alias: str, job_id: int, text: str, column: str = "payload") -> None:
    """Write `text` into the job's JSON column with SQL, as a data fix or another program would."""
    connection = connections[alias]
    table = connection.ops.quote_name(Job._meta.db_table)
    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {connection.ops.quote_name(column)} = %s{cast} WHERE id = %s",
            [text, job_id],
        )


def poison_row(alias: str, text: str, *, column: str = "payload", **fields: Any) -> int:
    """A `tests.noop` job (or `fields`' kind) whose `column` then holds `text`."""
    fields.setdefault("kind", "tests.noop")
    fields.setdefault("payload", {"n": 0})
    job = Job.objects.using(alias).create(**fields)
    poison(alias, job.pk, text, column)
    return job.pk


def poison_rows(alias: str) -> dict[int, str]:
    """A payload too big a number, one too deep, and a paused job's carry too deep (where
    the database can hold a value too deep for this Python)."""
    rows = {poison_row(alias, HUGE_NUMBER): "ValueError"}
    if too_deep_for_python(alias):
        deep = nested(DEEP[connections[alias].vendor])
        rows[poison_row(alias, deep)] = "RecursionError"
        pausing = {"column": "carry", "kind": "tests.pausing", "payload": {"steps": 3}}
        rows[poison_row(alias, deep, **pausing)] = "RecursionError"
    return rows


def states(alias: str, ids: list[int]) -> dict[int, str]:
    return dict(Job.objects.using(alias).filter(id__in=ids).values_list("id", "state"))


def last_entry(alias: str, job_id: int) -> JournalEntry:
    entry = JournalEntry.objects.using(alias).filter(job_id=job_id).order_by("-id").first()
    assert entry is not None, f"job #{job_id} has no journal entry"
    return entry


def assert_failed_unreadable(alias: str, job_id: int, reason: str) -> None:
    entry = last_entry(alias, job_id)
    assert entry.outcome == "failed", (job_id, entry.outcome, entry.error_message)
    assert entry.error_message.startswith(UNREADABLE_PREFIX), entry.error_message
    assert reason in entry.error_message, entry.error_message
    # Failed for good at its first run: it cannot get better by running again.
    assert JournalEntry.objects.using(alias).filter(job_id=job_id).count() == 1
    assert Job.objects.using(alias).values_list("last_error", flat=True).get(id=job_id)


# ---------------------------------------------------------------- a real worker


def test_poison_rows_fail_alone_while_good_jobs_of_their_batch_complete(
    alias: str, workers: Workers
) -> None:
    good = [tasks.Noop(n=n).enqueue(using=alias).pk for n in range(5)]
    bad = poison_rows(alias)
    # All due before the worker starts: its first claim takes good and bad rows together.
    worker = workers.start(alias)
    wait_until(
        lambda: set(states(alias, [*good, *bad]).values()) <= {"completed", "failed"},
        timeout=60,
        message="every job to finish",
    )
    assert states(alias, good) == dict.fromkeys(good, "completed")
    for job_id, reason in bad.items():
        assert states(alias, [job_id]) == {job_id: "failed"}
        assert_failed_unreadable(alias, job_id, reason)
    # The worker lives on, claims and runs: no step of it failed on the bad rows.
    later = tasks.Noop(n=99).enqueue(using=alias).pk
    wait_until(
        lambda: states(alias, [later]) == {later: "completed"},
        timeout=60,
        message="a job enqueued afterwards to complete",
    )
    assert worker.poll() is None, workers.log()
    assert "trying again" not in workers.log(), workers.log()


# ---------------------------------------------------------------- lease recovery


def expired_run(alias: str, *, age: timedelta) -> dict[str, Any]:
    """The fields of a job whose worker vanished and whose lease ran out `age` ago."""
    now = timezone.now()
    return vanished_run(lease_expires_at=now - age, started_at=now - age - timedelta(minutes=5))


def test_an_expired_poison_row_is_recovered_without_holding_back_other_leases(
    alias: str,
) -> None:
    vendor = connections[alias].vendor
    # The poison rows' leases ran out first: recovery meets them first. Keyed, so that
    # their verdicts look for a ready job of their key to absorb (`dedup.fold_returning`).
    two_hours, one_hour = timedelta(hours=2), timedelta(hours=1)
    bad = {
        poison_row(alias, HUGE_NUMBER, dedup_key="a", **expired_run(alias, age=two_hours)): (
            "ValueError"
        )
    }
    if too_deep_for_python(alias):
        deep = nested(DEEP[vendor])
        bad[poison_row(alias, deep, dedup_key="b", **expired_run(alias, age=two_hours))] = (
            "RecursionError"
        )
    good = Job.objects.using(alias).create(
        kind="tests.noop", payload={"n": 1}, dedup_key="c", **expired_run(alias, age=one_hour)
    )
    with CaptureQueriesContext(connections[alias]) as queries:
        recovered = leases.recover_expired(alias, "rescuer")
    assert sorted(recovered) == sorted([*bad, good.pk])
    assert states(alias, [*bad, good.pk]) == dict.fromkeys([*bad, good.pk], "ready")
    assert last_entry(alias, good.pk).outcome == "lease_expired"
    # Recovery and its verdicts never read a payload, a carry or a result: no use for them.
    column = connections[alias].ops.quote_name
    read = [
        query["sql"]
        for query in queries.captured_queries
        if query["sql"].lstrip().upper().startswith("SELECT")
        and any(f".{column(name)}" in query["sql"] for name in ("payload", "carry", "result"))
    ]
    assert read == []
    # Run again, the good job completes and the poison rows fail, each for its reason.
    Job.objects.using(alias).filter(id__in=[*bad, good.pk]).update(run_at=timezone.now())
    drain(using=alias)
    assert states(alias, [good.pk]) == {good.pk: "completed"}
    for job_id, reason in bad.items():
        assert_failed_unreadable_after_recovery(alias, job_id, reason)


def assert_failed_unreadable_after_recovery(alias: str, job_id: int, reason: str) -> None:
    entry = last_entry(alias, job_id)
    assert states(alias, [job_id]) == {job_id: "failed"}
    assert entry.outcome == "failed" and entry.error_message.startswith(UNREADABLE_PREFIX)
    assert reason in entry.error_message, entry.error_message


# ---------------------------------------------------------------- the admin


def test_the_admin_lists_shows_filters_and_deletes_poison_rows(admin_client: Client) -> None:
    alias = "default"
    good = tasks.Noop(n=7).enqueue().pk
    number = poison_row(alias, HUGE_NUMBER)
    deep = poison_row(alias, nested(DEEP["postgresql"]))
    carry = poison_row(alias, nested(DEEP["postgresql"]), column="carry")
    result = poison_row(
        alias, HUGE_NUMBER, column="result", state="completed", finished_at=timezone.now()
    )
    progress = poison_row(alias, nested(DEEP["postgresql"]), column="progress")
    every = [good, number, deep, carry, result, progress]

    ready = set(every) - {result}
    for query, expected in (
        ("", set(every)),
        ("?state=ready", ready),
        ("?kind=tests.noop", set(every)),
        ("?q=noop", set(every)),
        ("?state=completed", {result}),
    ):
        response = admin_client.get(CHANGELIST + query)
        assert response.status_code == 200, query
        assert {job.pk for job in response.context["cl"].result_list} == expected, query

    for job_id, what in ((number, "ValueError"), (deep, "RecursionError")):
        page = admin_client.get(reverse("admin:django_venturi_job_change", args=[job_id]))
        assert page.status_code == 200
        text = page.content.decode()
        assert "The stored value cannot be read back" in text and what in text
    for job_id in (carry, result, progress):
        page = admin_client.get(reverse("admin:django_venturi_job_change", args=[job_id]))
        assert page.status_code == 200, job_id
    assert (
        "cannot be read back"
        in admin_client.get(
            reverse("admin:django_venturi_job_change", args=[carry])
        ).content.decode()
    )
    assert admin_client.get(reverse("admin:django_venturi_job_stats")).status_code == 200

    # Loaded, the row holds `Unreadable`; saved, it would lose what the database holds.
    loaded = Job.objects.get(id=number)
    assert isinstance(loaded.payload, Unreadable)
    with pytest.raises(TypeError):
        loaded.save()

    # One by its delete page, the others by the list's delete action.
    delete_url = reverse("admin:django_venturi_job_delete", args=[number])
    assert admin_client.get(delete_url).status_code == 200
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 302
    selected = {"action": "delete_selected", "_selected_action": [deep, carry, progress]}
    confirmation = admin_client.post(CHANGELIST, selected)
    assert confirmation.status_code == 200 and f"#{deep}" in confirmation.content.decode()
    done = admin_client.post(CHANGELIST, {**selected, "post": "yes"}, follow=True)
    assert done.status_code == 200
    assert sorted(Job.objects.values_list("id", flat=True)) == [good, result]


def test_the_job_page_shows_a_notice_for_a_value_too_deep_to_write_out() -> None:
    """Read at a shallow depth of the stack, a value may be too deep to write out again
    at the page's depth: a notice, not a 500."""
    value: list[Any] = []
    for _ in range(50_000):  # Python 3.13's encoder, in C, writes out about 10,000 levels
        value = [value]
    shown = pretty_json(value)
    assert "cannot be read back" in shown and "RecursionError" in shown


# ---------------------------------------------------------------- the property


TARGET = "tests.poison.target"


@dataclasses.dataclass
class Node:
    """A recursive type: its decoding recurses as deep as the stored value goes."""

    children: list[Node] = dataclasses.field(default_factory=list)


@venturi.task(kind=TARGET, max_attempts=1)
@dataclasses.dataclass
class Target(venturi.Task):
    """Good jobs, and the kind every fuzzed row claims to be (one run: no retry hides a row)."""

    n: int
    label: str = ""
    tags: list[str] = dataclasses.field(default_factory=list)
    scores: dict[str, float] | None = None
    tree: Node | None = None

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


LONG = os.environ.get("VENTURI_LONG_PROPERTIES") == "1"
PROFILE = settings(
    max_examples=300 if LONG else 30,
    deadline=None,
    derandomize=not LONG,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

TEXT = st.text(
    # Text jsonb stores: no NUL, no lone surrogate; everything else (controls, bidi
    # marks, noncharacters, astral planes, combining marks) may come.
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
    max_size=20,
)
NUMBERS = st.one_of(
    st.integers().map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(20, 4_200).map(lambda digits: "-" + "7" * digits),  # readable, past 64 bits
    st.integers(4_301, 6_000).map(lambda digits: "9" * digits),  # past Python's int limit
    st.sampled_from(["1e400", "-1e5000", "1e-400"]),
    st.integers(300, 5_000).map(lambda zeros: "0." + "0" * zeros + "1"),
)
SCALARS = st.one_of(st.sampled_from(["null", "true", "false"]), NUMBERS, TEXT.map(json.dumps))


def _containers(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.lists(children, max_size=4).map(lambda items: "[" + ",".join(items) + "]"),
        st.lists(
            st.tuples(TEXT | st.sampled_from(["n", "label", "tags"]), children), max_size=4
        ).map(lambda pairs: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in pairs) + "}"),
    )


JSON = st.recursive(SCALARS, _containers, max_leaves=12)


@st.composite
def deep(draw: st.DrawFn, depths: st.SearchStrategy[int]) -> str:
    """Arrays or objects nested `depths` deep around any JSON."""
    depth, inner = draw(depths), draw(JSON)
    if draw(st.booleans()):
        return "[" * depth + inner + "]" * depth
    return '{"n":' * depth + inner + "}" * depth


def tree(depth: int) -> str:
    """A `Target` whose `tree` is `depth` nodes deep (twice as deep in JSON)."""
    return '{"n":1,"tree":' + '{"children":[' * depth + "{}" + "]}" * depth + "}"


PAYLOADS = st.one_of(
    JSON,  # mostly wrong shapes for Target (a list, a number, fields of the wrong type)
    st.fixed_dictionaries({"n": JSON}, optional={"label": JSON, "tags": JSON, "scores": JSON}).map(
        lambda fields: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in fields.items()) + "}"
    ),
    deep(st.integers(50, 500)),  # deep, and still readable
    deep(st.integers(2_000, 11_000)),  # too deep for Python
    st.integers(50, 450).map(tree),  # readable, too deep for a recursive type's decoding
    st.just(HUGE_NUMBER),
)


def readable(text: str) -> bool:
    """The oracle: whether Python's `json` reads the text as PostgreSQL gives it back."""
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


@PROFILE
@example(payloads=[HUGE_NUMBER, nested(11_000), tree(450), '{"n": "1"}', "[]"], good_count=2)
@given(payloads=st.lists(PAYLOADS, min_size=1, max_size=4), good_count=st.integers(1, 3))
def test_any_stored_json_beside_good_jobs_fails_alone_with_a_reason(
    admin_client: Client, payloads: list[str], good_count: int
) -> None:
    good = [Target(n=n, label="good").enqueue().pk for n in range(good_count)]
    bad = [poison_row("default", text, kind=TARGET) for text in payloads]
    # Through the real claim statement: good and bad rows in one batch.
    drain(kinds=[Target])
    assert states("default", good) == dict.fromkeys(good, "completed")
    stored = dict(
        Job.objects.filter(id__in=bad)
        .annotate(text=Cast("payload", TextField()))
        .values_list("id", "text")
    )
    for job_id in bad:
        state = states("default", [job_id])[job_id]
        assert state in {"completed", "failed"}, (job_id, state)
        if state == "failed":
            entry = last_entry("default", job_id)
            assert entry.outcome == "failed" and entry.error_message, job_id
        if not readable(stored[job_id]):
            assert state == "failed"
            assert last_entry("default", job_id).error_message.startswith(UNREADABLE_PREFIX)
            assert isinstance(Job.objects.get(id=job_id).payload, Unreadable)
    # The admin shows every one of them.
    assert admin_client.get(CHANGELIST + "?kind=tests.poison.target").status_code == 200
    for job_id in bad:
        page = admin_client.get(reverse("admin:django_venturi_job_change", args=[job_id]))
        assert page.status_code == 200, job_id
