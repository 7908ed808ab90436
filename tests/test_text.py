"""Hostile text everywhere a user or a handler puts some: refused at the API, or stored safely.

PostgreSQL stores neither NUL nor surrogates; SQLite is held to the same rules.
Data (payloads, keys, carries, results) is refused with a `PayloadError` naming
the field; free text (errors, reasons, notes) is stored with those characters
replaced and a note saying so. A burst worker given handlers that raise and
return such text writes every verdict and exits 0.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import json
import math
import re
from collections.abc import Iterator
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import django_venturi as venturi
from django_venturi.conf import venturi_settings
from django_venturi.context import Flag
from django_venturi.models import Job, JournalEntry
from django_venturi.payloads import text
from django_venturi.payloads.codec import MAX_INT_DIGITS
from django_venturi.registry import RegistrationError
from django_venturi.store.backoff import MAX_DELAY
from django_venturi.store.verdicts import ErrorInfo
from tests.conftest import Workers
from tests.testapp import text_tasks
from tests.testapp.text_tasks import HOWS, SAMPLES, STORABLE, AsyncSays, Echo, Says

NOTE = " [1 unstorable character replaced with U+FFFD]"
FIXED = {
    "nul": "before\ufffdafter",
    "surrogate": "undecodable \ufffd byte from surrogateescape",
    "pair": "one emoji as two code points: \U0001f600",
}
"""What free text becomes once stored, before any note, for the samples that change."""
REFUSED = ("nul", "surrogate", "pair")
"""Samples refused as data: the pair too, since it would not read back as given."""


@pytest.fixture(autouse=True)
def no_payload_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The megabyte sample goes into payloads, carries and results past the default
    `MAX_PAYLOAD_BYTES`: here (and in workers) there is no limit, to store it as given.
    The limit itself: tests/test_payload_limit.py. (Not `override_settings`: under it,
    `settings.SETTINGS_MODULE` is None and no worker could be started.)"""
    from django.conf import settings as django_settings

    monkeypatch.setenv("VENTURI_TEST_SETTINGS", json.dumps({"MAX_PAYLOAD_BYTES": None}))
    monkeypatch.setitem(django_settings.VENTURI, "MAX_PAYLOAD_BYTES", None)
    venturi_settings.forget()
    yield
    venturi_settings.forget()


def stored(sample: str, limit: int | None = None) -> str:
    """The free text the journal must hold for `SAMPLES[sample]` cut at `limit`."""
    original = SAMPLES[sample][:limit]
    if sample not in FIXED:
        return original
    return FIXED[sample] + (NOTE if sample in ("nul", "surrogate") else "")


# ---------------------------------------------------------------- the text module

ANY_CHARACTER = st.one_of(st.characters(), st.characters(categories=["Cs"]), st.just("\x00"))
"""Any code point, surrogates and NUL included (Hypothesis leaves surrogates out by default)."""


@given(st.text(alphabet=ANY_CHARACTER))
@example("\ud800\udc00")  # a surrogate pair: joined into its character, nothing replaced
@example("a\x00\udc80")
def test_storable_text_always_encodes_and_keeps_storable_text_as_is(value: str) -> None:
    result = text.storable(value)
    result.encode("utf-8")  # no surrogate left
    assert "\x00" not in result
    assert text.problem(result) is None
    if text.problem(value) is None:
        assert result == value
    elif text.replaced(value)[1]:
        assert result.endswith("with U+FFFD]")
    else:  # only surrogate pairs: the same UTF-16 text, each pair now one character
        assert result.encode("utf-16-le") == value.encode("utf-16-le", "surrogatepass")


@given(st.text(alphabet=st.sampled_from(["a", "\x00", "\udc80", "\ud83d", "\ude00", "é"])))
def test_replaced_counts_what_it_replaced(value: str) -> None:
    fixed, count = text.replaced(value)
    pairs = len(re.findall("[\ud800-\udbff][\udc00-\udfff]", value))
    assert len(fixed) + pairs == len(value)  # a pair becomes the one character it stands for
    assert fixed.count("\ufffd") == count


def test_problem_names_the_character() -> None:
    assert text.problem("plain") is None
    assert text.problem("\u05e2\U0001f389") is None
    assert "NUL" in (text.problem("a\x00") or "")
    assert "U+DC80" in (text.problem("é\udc80") or "")
    assert "NUL" in (text.problem("é\x00") or "")


def test_error_info_is_storable_however_it_is_built() -> None:
    info = ErrorInfo(type="x\x00" * 400, message="a\x00b", traceback="\udc80")
    assert info.type == "x\ufffd" * 150
    assert info.message == "a\ufffdb" + NOTE
    assert info.traceback == "\ufffd" + NOTE
    assert ErrorInfo.from_reason(42).message == "42"  # type: ignore[arg-type]


def test_an_exception_whose_str_raises_still_gives_an_error() -> None:
    try:
        raise text_tasks.UnprintableError("x")
    except text_tasks.UnprintableError as error:
        info = ErrorInfo.from_exception(error)
    assert info.type == "tests.testapp.text_tasks.UnprintableError"
    assert info.message == (
        "<str() of this tests.testapp.text_tasks.UnprintableError raised "
        "builtins.RuntimeError; its text is unknown>"
    )
    assert "Traceback" in info.traceback


def test_outcomes_refuse_what_is_not_a_reason_or_a_delay() -> None:
    with pytest.raises(TypeError, match="reason must be a str"):
        venturi.Outcome.failed(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="after must be a timedelta, a number of seconds or None"):
        venturi.Outcome.retry(after="5")  # type: ignore[arg-type]


def test_progress_notes_are_made_storable_and_figures_must_be_json_numbers() -> None:
    seen: list[dict[str, Any]] = []
    ctx = venturi.Context(
        job_id=1,
        attempt=1,
        carry=None,
        enqueued_at=timezone.now(),
        database="default",
        stop=Flag(),
        lease_lost=Flag(),
        heartbeat=lambda: True,
        on_progress=seen.append,
    )
    ctx.progress(1, 2, note="a\x00" * 150)
    assert seen[-1]["note"] == "a\ufffd" * 100 + " [100 unstorable characters replaced with U+FFFD]"
    for bad in (math.nan, math.inf, 10**5000):
        with pytest.raises(ValueError, match=r"progress: done (must be finite|is an integer)"):
            ctx.progress(bad)
        with pytest.raises(ValueError, match="progress: total"):
            ctx.progress(1, bad)
    assert len(seen) == 1


# ---------------------------------------------------------------- refused at the API


@pytest.mark.django_db(databases=["default", "sqlite"])
@pytest.mark.parametrize("sample", REFUSED)
@pytest.mark.parametrize(
    ("value", "path"),
    [
        (lambda s: s, "Echo.value"),
        (lambda s: {"items": [1, 2, {"name": s}]}, "Echo.value['items'][2]['name']"),
        (lambda s: {s: 1}, "Echo.value[{key}]"),
    ],
    ids=["field", "nested", "key"],
)
def test_unstorable_payload_text_is_refused_naming_the_field(
    alias: str, sample: str, value: Any, path: str
) -> None:
    payload = value(SAMPLES[sample])
    where = path.format(key=repr(SAMPLES[sample]))
    with pytest.raises(venturi.PayloadError, match="which PostgreSQL cannot store") as raised:
        Echo(value=payload).enqueue(using=alias)
    assert raised.value.path == where
    with pytest.raises(venturi.PayloadError):
        venturi.enqueue_many([Echo(value=1), Echo(value=payload)], using=alias)
    assert not Job.objects.using(alias).exists()


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_typed_fields_unions_and_secrets_say_why_they_are_refused(alias: str) -> None:
    with pytest.raises(venturi.PayloadError, match=r"^Typed\.names\[1\]: contains a NUL"):
        Typed(names=["a", "b\x00"]).enqueue(using=alias)
    with pytest.raises(venturi.PayloadError, match=r"^Typed\.either: contains the surrogate"):
        Typed(either="\udc80").enqueue(using=alias)
    with pytest.raises(venturi.PayloadError, match=r"^Typed\.token: contains a NUL"):
        Typed(token="s3cret\x00").enqueue(using=alias)
    with pytest.raises(venturi.PayloadError, match=f"more than {MAX_INT_DIGITS} digits"):
        Typed(either=10**5000).enqueue(using=alias)
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(venturi.PayloadError, match="nested too deeply"):
        Echo(value=deep).enqueue(using=alias)
    assert not Job.objects.using(alias).exists()


@venturi.task(kind="tests.text.typed")
@dataclasses.dataclass
class Typed(venturi.Task):
    names: list[str] = dataclasses.field(default_factory=list)
    either: str | int = ""
    token: str = venturi.secret(default="")

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


@venturi.task(kind="tests.text.keyed")
@dataclasses.dataclass
class Keyed(venturi.Task):
    key: str

    def dedup_key(self) -> str:
        return self.key.replace("0", "\x00")

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_unstorable_keys_and_bad_queue_names_are_refused(alias: str) -> None:
    with pytest.raises(venturi.PayloadError, match=r"Keyed\.dedup_key\(\): .* NUL"):
        Keyed(key="a0").enqueue(using=alias)
    for queue in ("a\x00", "emails\n", "\udc80", "é", "<script>", "x" * 101):
        with pytest.raises(ValueError, match="queue"):
            Echo().enqueue(queue=queue, using=alias)
    assert not Job.objects.using(alias).exists()
    for kind in ("tests.text.bad\x00", "tests.text.bad\n", "tests.text.\u202e"):
        with pytest.raises(RegistrationError, match="kind"):

            @venturi.task(kind=kind)
            @dataclasses.dataclass
            class Bad(venturi.Task):
                def handle(self, ctx: venturi.Context) -> venturi.Outcome:
                    return venturi.Outcome.completed()


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_delays_and_dates_past_what_can_be_stored_are_refused(alias: str) -> None:
    for delay in (timedelta.max, timedelta.min, MAX_DELAY + timedelta(days=1)):
        with pytest.raises(ValueError, match="delay must be within"):
            Echo().enqueue(delay=delay, using=alias)
    job = Echo().enqueue(delay=MAX_DELAY, using=alias)
    assert job.run_at > timezone.now() + MAX_DELAY - timedelta(days=1)
    # Stored in UTC, this would be in the year 10000: no query could read the row back.
    west = dt.timezone(timedelta(hours=-12))
    with pytest.raises(ValueError, match="outside the years 1 to 9999 in UTC"):
        Echo().enqueue(run_at=dt.datetime(9999, 12, 31, 23, tzinfo=west), using=alias)
    assert list(Job.objects.using(alias).values_list("pk", flat=True)) == [job.pk]


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_storable_hostile_text_is_stored_as_given(alias: str) -> None:
    values = [SAMPLES[sample] for sample in STORABLE]
    one = Echo(value={value: value for value in values}).enqueue(using=alias)
    many = venturi.enqueue_many([Echo(value=value) for value in values], using=alias)
    assert Job.objects.using(alias).get(pk=one.pk).payload == {
        "value": {value: value for value in values}
    }
    assert [Job.objects.using(alias).get(pk=job.pk).payload["value"] for job in many] == values


@pytest.mark.django_db(databases=["default", "sqlite"])
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(alphabet=ANY_CHARACTER))
def test_any_text_is_refused_or_stored_and_read_back_as_given(alias: str, value: str) -> None:
    try:
        job = Echo(value={"text": value, value: 1}).enqueue(using=alias)
    except venturi.PayloadError as error:
        assert text.problem(value) is not None
        assert "cannot store" in str(error)
        return
    assert Job.objects.using(alias).get(pk=job.pk).payload == {"value": {"text": value, value: 1}}


# ---------------------------------------------------------------- a worker meets it all


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_burst_worker_writes_every_verdict_of_handlers_full_of_hostile_text(
    alias: str, workers: Workers
) -> None:
    jobs = {
        (how, sample): Says(how=how, sample=sample).enqueue(using=alias)
        for how in HOWS
        for sample in SAMPLES
    }
    async_jobs = {
        (how, sample): AsyncSays(how=how, sample=sample).enqueue(using=alias)
        for how in ("raise", "fail")
        for sample in ("nul", "surrogate", "html")
    }
    waits = [text_tasks.WaitsLong(pause=pause).enqueue(using=alias) for pause in (False, True)]
    backs_off = text_tasks.BacksOff().enqueue(using=alias)
    # As if it had failed a hundred times: Fibonacci(100) seconds overflowed a timedelta.
    Job.objects.using(alias).filter(pk=backs_off.pk).update(attempt=100, failures=100)

    workers.burst(alias, "--concurrency", "4", timeout=60)

    for (how, sample), job in jobs.items():
        job.refresh_from_db()
        check_says(alias, how, sample, job)
    for (how, sample), job in async_jobs.items():
        job.refresh_from_db()
        assert job.state == venturi.State.FAILED
        assert job.last_error.endswith(stored(sample)), (how, sample, job.last_error)
    soon = timezone.now() + MAX_DELAY - timedelta(days=1)
    for job in [*waits, backs_off]:
        job.refresh_from_db()
        assert job.state == venturi.State.READY
    assert all(job.run_at > soon for job in waits)
    assert timedelta(minutes=50) < backs_off.run_at - timezone.now() <= timedelta(hours=1)


def check_says(alias: str, how: str, sample: str, job: Job) -> None:
    """What the job of `Says(how, sample)` must have become."""
    where = (how, sample, job.state, job.last_error[:300])
    entry = JournalEntry.objects.using(alias).filter(job=job).latest("id")
    if how == "note":
        assert job.state == venturi.State.COMPLETED and job.progress is not None, where
        assert job.progress["note"] == stored(sample, 200), where
    elif how == "carry" and sample in REFUSED:
        assert job.state == venturi.State.FAILED, where
        assert entry.outcome == "failed", where
        assert entry.error_type == "django_venturi.payloads.codec.UnstorableValue", where
        assert "Says.carry['text']: contains" in job.last_error, where
    elif how == "carry":
        assert job.state == venturi.State.COMPLETED, where
        assert job.carry == {"text": SAMPLES[sample]}
    elif how == "str_raises":
        assert job.state == venturi.State.FAILED, where
        assert "<str() of this tests.testapp.text_tasks.UnprintableError raised" in job.last_error
        assert "Traceback" in entry.traceback
    elif how == "class_name":
        assert job.state == venturi.State.FAILED, where
        fixed = FIXED.get(sample, SAMPLES[sample])[:500]
        assert entry.error_type == f"{fixed}.StrangeError"[:300], where
        assert job.last_error.endswith("raised by a strange class"), where
    else:  # raise, permanent, fail
        assert job.state == venturi.State.FAILED, where
        assert entry.error_message.endswith(stored(sample, 2000)), where
        assert job.last_error.endswith(stored(sample, 2000)), where
        if how != "fail":
            assert entry.traceback.startswith("Traceback") or len(entry.traceback) == 20_000


# ---------------------------------------------------------------- Django Tasks results


FRAMEWORK_MODULES = {
    "django.tasks": "tests.testapp.tasks_django",
    "django_tasks": "tests.testapp.tasks_backport",
}


def installed_tasks_module() -> ModuleType:
    from django_venturi.tasks_backend import frameworks

    for framework in frameworks.available():
        return importlib.import_module(FRAMEWORK_MODULES[framework.name])
    pytest.skip("no Django Tasks framework is installed")


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_tasks_results_are_stored_or_fail_clearly_and_arguments_are_checked(
    alias: str, workers: Workers
) -> None:
    tasks = installed_tasks_module()
    backend = "default" if alias == "default" else "sqlite"
    with pytest.raises(venturi.PayloadError, match=r"args\[0\]: contains a NUL"):
        tasks.echo.using(backend=backend).enqueue("a\x00")
    with pytest.raises(venturi.PayloadError, match=r"kwargs\['\\udc80'\]: the key contains"):
        tasks.echo.using(backend=backend).enqueue(**{"\udc80": 1})
    results = {
        sample: tasks.returns_sample.using(backend=backend).enqueue(sample)
        for sample in ("nul", "surrogate", "html", "megabyte")
    }
    workers.burst(alias, timeout=60)
    for sample, result in results.items():
        job = Job.objects.using(alias).get(pk=int(result.id))
        if sample in REFUSED:
            assert job.state == venturi.State.FAILED
            assert "the return value: contains" in job.last_error
        else:
            assert job.state == venturi.State.COMPLETED
            assert job.result == SAMPLES[sample]


# ---------------------------------------------------------------- the admin


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_the_admin_shows_hostile_text_escaped(admin_client: Client, workers: Workers) -> None:
    script = SAMPLES["html"]
    jobs = [
        Says(how="raise", sample="html").enqueue(),
        Says(how="note", sample="html").enqueue(),
        Says(how="carry", sample="html").enqueue(),
        Says(how="class_name", sample="html").enqueue(),
        Echo(value={script: script}).enqueue(),
    ]
    workers.burst("default", timeout=60)
    escaped = "&lt;script&gt;alert(&#x27;venturi&#x27;)&lt;/script&gt;"
    listing = admin_client.get(reverse("admin:django_venturi_job_changelist"))
    assert listing.status_code == 200
    assert escaped in listing.content.decode()
    assert "<script>alert" not in listing.content.decode()
    for job in jobs:
        page = admin_client.get(reverse("admin:django_venturi_job_change", args=[job.pk]))
        assert page.status_code == 200
        html = page.content.decode()
        assert "<script>alert" not in html, job.kind
        assert escaped in html, job.kind
    entry = JournalEntry.objects.get(job=jobs[0])
    page = admin_client.get(reverse("admin:django_venturi_journalentry_change", args=[entry.pk]))
    assert page.status_code == 200
    assert "<script>alert" not in page.content.decode()
    assert escaped in page.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize("parameter", ["kind", "queue", "state", "q", "a\x00"])
@pytest.mark.parametrize("page", ["job", "journalentry"])
def test_admin_lists_refuse_filters_holding_a_nul_like_any_bad_lookup(
    admin_client: Client, parameter: str, page: str
) -> None:
    listing = reverse(f"admin:django_venturi_{page}_changelist")
    response = admin_client.get(listing, {parameter: "a\x00b"})
    assert (response.status_code, response["Location"]) == (302, f"{listing}?e=1")
