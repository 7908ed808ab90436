"""Concurrency caps in the stats: the figures, the command's line and JSON, the admin's table."""

from __future__ import annotations

import dataclasses
import io
import json
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from django_venturi.models import Job, StoredJSONField
from django_venturi.observe import cap_stats
from django_venturi.observe.cap_stats import CapUse
from django_venturi.store.clock import database_time

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

KEYED = "tests.key_capped"  # Concurrency(2, key="account")
WHOLE = "tests.capped"  # concurrency=2
EMPTY_KEY = object()
"""A payload without the key's field: its key is ""."""


def payload(account: Any) -> dict[str, Any]:
    return {"seconds": 0.1} if account is EMPTY_KEY else {"account": account, "seconds": 0.1}


def add(alias: str, kind: str, accounts: list[Any], *, state: str = "ready", **fields: Any) -> None:
    """Jobs of `kind`, one per account, written directly: `running` ones hold a claim."""
    now = timezone.now()
    if state == "running":
        fields = {"attempt": 1, "started_at": now, **fields}
        fields.setdefault("lease_expires_at", now + timedelta(minutes=5))
    fields.setdefault("run_at", now - timedelta(minutes=1))
    Job.objects.using(alias).bulk_create(
        Job(
            kind=kind,
            payload=payload(account),
            state=state,
            claim_token=uuid.uuid4() if state == "running" else None,
            **fields,
        )
        for account in accounts
    )


def busy_queue(alias: str) -> None:
    """Running and waiting jobs of both capped kinds, and jobs the caps must not count."""
    running = ["globex", "acme", "acme", "globex", "initech", "hooli", "umbrella", "stark"]
    add(alias, KEYED, [*running, EMPTY_KEY, EMPTY_KEY], state="running")
    due = ["acme"] * 3 + ["globex"] + ["initech"] * 4 + [EMPTY_KEY] * 2 + ["wayne"] * 2
    add(alias, KEYED, due)
    # Not due, finished, or another kind: none counts.
    add(alias, KEYED, ["acme"] * 5 + ["zeta"], run_at=timezone.now() + timedelta(hours=1))
    add(alias, KEYED, ["acme", "zeta"], state="completed", finished_at=timezone.now())
    add(alias, "tests.noop", ["acme", "zeta"])
    add(alias, "tests.noop", ["acme"], state="running")
    add(alias, WHOLE, [EMPTY_KEY] * 2, state="running")
    add(alias, WHOLE, [EMPTY_KEY] * 3)
    add(alias, WHOLE, [EMPTY_KEY], run_at=timezone.now() + timedelta(hours=1))


BUSY_KEYED = CapUse(
    kind=KEYED,
    cap="2 per account",
    key="account",
    running=10,
    keys_with_due=5,  # acme, globex, initech, "", wayne
    keys_at_cap=3,  # acme, globex, ""
    busiest=[("", 2), ("acme", 2), ("globex", 2), ("hooli", 1), ("initech", 1)],
    waiting=12,
    waiting_on_cap=6,  # acme 3, globex 1, "" 2
)
BUSY_WHOLE = CapUse(
    kind=WHOLE,
    cap="2",
    key=None,
    running=2,
    keys_with_due=1,
    keys_at_cap=1,
    busiest=[],
    waiting=3,
    waiting_on_cap=3,
)
IDLE = CapUse(
    kind="tests.rated_capped",
    cap="2",
    key=None,
    running=0,
    keys_with_due=0,
    keys_at_cap=0,
    busiest=[],
    waiting=0,
    waiting_on_cap=0,
)
KEYED_LINE = (
    "cap tests.key_capped: 2 per account; 10 running; 5 keys with due jobs, 3 at the cap "
    '(busiest: "" 2, acme 2, globex 2, hooli 1, initech 1); 12 due waiting, 6 on the cap'
)


def uses(alias: str, now: datetime | None = None) -> dict[str, CapUse]:
    found = cap_stats.usage(alias, now or database_time(alias, statement=True))
    assert [use.kind for use in found] == sorted(use.kind for use in found)
    return {use.kind: use for use in found}


def test_usage_counts_places_held_and_due_jobs_per_key(alias: str) -> None:
    busy_queue(alias)
    found = uses(alias)
    assert found[KEYED] == BUSY_KEYED
    assert found[WHOLE] == BUSY_WHOLE
    assert found["tests.rated_capped"] == IDLE
    assert "tests.noop" not in found  # not capped
    # An hour on, the jobs not due yet are due too: 5 more of acme (at its cap), 1 of zeta.
    later = uses(alias, timezone.now() + timedelta(hours=2))[KEYED]
    assert (later.waiting, later.keys_with_due, later.waiting_on_cap) == (18, 6, 11)


def test_usage_below_the_cap(alias: str) -> None:
    add(alias, KEYED, ["acme", "globex"], state="running")
    add(alias, KEYED, ["acme", "acme", 7])  # a number's key is its JSON text: "7"
    add(alias, KEYED, ["7"], state="running")
    add(alias, WHOLE, [EMPTY_KEY], state="running")
    add(alias, WHOLE, [EMPTY_KEY] * 4)
    found = uses(alias)
    assert found[KEYED] == dataclasses.replace(
        BUSY_KEYED,
        running=3,
        keys_with_due=2,
        keys_at_cap=0,
        busiest=[("7", 1), ("acme", 1), ("globex", 1)],
        waiting=3,
        waiting_on_cap=0,
    )
    assert found[WHOLE] == dataclasses.replace(
        BUSY_WHOLE, running=1, keys_at_cap=0, waiting=4, waiting_on_cap=0
    )
    # One more running of key "7" (a string this time) fills it: the number's job waits on it.
    add(alias, KEYED, [7], state="running")
    assert (uses(alias)[KEYED].keys_at_cap, uses(alias)[KEYED].waiting_on_cap) == (1, 1)


def test_a_null_field_is_the_empty_key_as_for_the_claim(alias: str) -> None:
    """`field_text`: a null or missing field is "", a string 'null' is its own key."""
    add(alias, KEYED, [None, None], state="running")
    add(alias, KEYED, [None, EMPTY_KEY, "null"])
    found = uses(alias)[KEYED]
    assert found.busiest == [("", 2)] and found.keys_at_cap == 1
    assert (found.waiting, found.keys_with_due, found.waiting_on_cap) == (3, 2, 2)


def test_an_empty_queue_shows_every_cap_idle(alias: str) -> None:
    found = uses(alias)
    assert set(found) >= {KEYED, WHOLE, "tests.rated_capped"}
    assert found[KEYED] == dataclasses.replace(IDLE, kind=KEYED, cap="2 per account", key="account")
    assert found[WHOLE] == dataclasses.replace(IDLE, kind=WHOLE)


def test_due_jobs_are_counted_by_the_database_not_read(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the running jobs' payloads reach Python, however many jobs wait."""
    add(alias, KEYED, ["acme", "acme", "globex"], state="running")
    add(alias, KEYED, [f"account-{index % 150}" for index in range(600)] + ["acme"] * 4)
    read: list[Any] = []
    original = StoredJSONField.from_db_value

    def counted(self: StoredJSONField, value: Any, expression: Any, connection: Any) -> Any:
        read.append(value)
        return original(self, value, expression, connection)

    monkeypatch.setattr(StoredJSONField, "from_db_value", counted)
    found = uses(alias)[KEYED]
    assert len(read) == 3
    assert (found.waiting, found.keys_with_due, found.waiting_on_cap) == (604, 151, 4)


def test_venturi_stats_prints_a_line_per_cap_and_json(alias: str) -> None:
    busy_queue(alias)
    out = io.StringIO()
    call_command("venturi_stats", "--database", alias, stdout=out)
    lines = out.getvalue().splitlines()
    assert KEYED_LINE in lines
    assert "cap tests.capped: 2; 2 running, at the cap; 3 due waiting" in lines
    assert "cap tests.rated_capped: 2; 0 running; 0 due waiting" in lines
    out = io.StringIO()
    call_command("venturi_stats", "--json", "--database", alias, stdout=out)
    caps = {use["kind"]: use for use in json.loads(out.getvalue())["caps"]}
    assert caps[KEYED] == {
        "kind": KEYED,
        "cap": "2 per account",
        "key": "account",
        "running": 10,
        "keys_with_due": 5,
        "keys_at_cap": 3,
        "busiest": [["", 2], ["acme", 2], ["globex", 2], ["hooli", 1], ["initech", 1]],
        "waiting": 12,
        "waiting_on_cap": 6,
    }
    assert caps[WHOLE] == {**BUSY_WHOLE.as_dict(), "busiest": []}
    assert caps[WHOLE]["waiting_on_cap"] == 3


def test_the_line_quotes_keys_that_would_not_show_plainly(alias: str) -> None:
    add(alias, KEYED, ["line\nbreak", " spaced", "k" * 80], state="running")
    add(alias, KEYED, ["acme"])
    out = io.StringIO()
    call_command("venturi_stats", "--database", alias, stdout=out)
    [line] = [line for line in out.getvalue().splitlines() if line.startswith(f"cap {KEYED}:")]
    assert line == (
        "cap tests.key_capped: 2 per account; 3 running; 1 key with due jobs, 0 at the cap "
        f'(busiest: " spaced" 1, {"k" * 59}\u2026 1, "line\\nbreak" 1); 1 due waiting, '
        "0 on the cap"
    )


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_the_admin_stats_page_shows_the_caps(admin_client: Client) -> None:
    busy_queue("default")
    page = admin_client.get("/admin/django_venturi/job/stats/").content.decode()
    section = page.split('id="venturi-caps"')[1].split("</div>")[0]
    assert "<caption>Concurrency caps</caption>" in section
    assert (
        '<tr><td><a href="/admin/django_venturi/job/kinds/tests.key_capped/">tests.key_capped</a>'
        "</td><td>2 per account</td><td>10</td><td>5</td><td>3</td>"
        '<td>"" (2), acme (2), globex (2), hooli (1), initech (1)</td><td>12</td><td>6</td></tr>'
    ) in section
    assert (
        '<tr><td><a href="/admin/django_venturi/job/kinds/tests.capped/">tests.capped</a></td>'
        "<td>2</td><td>2</td><td>1</td><td>1</td><td>not keyed</td>"
        "<td>3</td><td>3</td></tr>"
    ) in section
    assert "across every worker" in section and "spend no attempt" in section
    # A key is the payload's: escaped, never markup.
    Job.objects.filter(kind=KEYED, state="running").delete()
    add("default", KEYED, ["<b>x</b>"] * 3, state="running")
    page = admin_client.get("/admin/django_venturi/job/stats/").content.decode()
    section = page.split('id="venturi-caps"')[1].split("</div>")[0]
    assert "<td>&lt;b&gt;x&lt;/b&gt; (3)</td>" in section
    assert "<b>x</b>" not in page
