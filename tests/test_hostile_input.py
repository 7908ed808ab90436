"""Hostile input to every admin page and every command option: never a 500, never a traceback.

The admin pages are found, not listed: every URL the venturi model admins register
(lists, job and journal pages, stats, cleanup, pause and resume, the retry and cancel
buttons, periodic tasks), and every parameter a page reads is found by recording what
the view reads from `request.GET` and `request.POST` (repeated until no new name turns
up, so the parameters an action reads once `action` and `index` are set are found
too), plus each list filter's parameters and a lookup on each of the model's fields.
Each parameter then gets each hostile value, alone, as a superuser and as view-only
staff. The commands' options are found from their parsers the same way.

Each request runs in a savepoint rolled back after it, so a deleting or retrying
request leaves the rows for the next one.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from io import StringIO
from typing import Any
from urllib.parse import quote

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.views.main import ALL_VAR, ORDER_VAR, PAGE_VAR, SEARCH_VAR
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command, get_commands, load_command_class
from django.db import connection, models, transaction
from django.http import HttpResponse, QueryDict
from django.test import Client, RequestFactory
from django.urls import URLPattern, reverse
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry, ScheduleState
from django_venturi.worker import Worker
from tests.test_admin import staff_with

pytestmark = pytest.mark.django_db

BIGINT_MAX = 2**63 - 1

HOSTILE = {
    "superscript digit": "²",
    "arabic-indic digit": "٣",
    "mathematical digit": "\U0001d7d7",
    "5000 digits": "9" * 5000,
    "past bigint": str(BIGINT_MAX + 1),
    "below bigint": str(-BIGINT_MAX - 2),
    "negative": "-1",
    "zero": "0",
    "float overflow": "1e400",
    "nan": "NaN",
    "overflow duration": "9999999999d",
    "overflow weeks": "999999999w",
    "NUL": "1\x00",
    "long text": "x" * 20_000,
    "odd unicode": "\u202e\ufeff\u01c5\U0001f600e\u0301",
    "invalid utf-8": "\udcff\udcfe",
    "empty": "",
    "blank": " \t",
    "quotes and wildcards": "'\"%_\\",
}
"""Values a user can type: `invalid utf-8` goes out as the raw bytes FF FE."""

CORE = (
    "superscript digit",
    "5000 digits",
    "past bigint",
    "float overflow",
    "overflow duration",
    "NUL",
    "invalid utf-8",
)
"""The values that answered 500 somewhere before these tests (issue 33): every run sends
them; the rest of `HOSTILE` is `thorough`, so the default suite stays within its time."""


def hostile_sets() -> list[Any]:
    core = {label: HOSTILE[label] for label in CORE}
    rest = {label: value for label, value in HOSTILE.items() if label not in CORE}
    return [
        pytest.param(core, id="core"),
        pytest.param(rest, id="rest", marks=pytest.mark.thorough),
    ]


def hostile_labels() -> list[Any]:
    return [
        label if label in CORE else pytest.param(label, marks=pytest.mark.thorough)
        for label in HOSTILE
    ]


USERS = ("superuser", "view-only staff")
FUZZED_USERS = (
    "superuser",
    # The same requests as view-only staff: a repeat of the superuser's for the most
    # part (forms refuse before they read), so `thorough`.
    pytest.param("view-only staff", marks=pytest.mark.thorough),
)


# ---------------------------------------------------------------- discovering the admin


def venturi_model_admins() -> dict[str, admin.ModelAdmin[Any]]:
    """The admin of each venturi model, by model name."""
    return {
        model._meta.model_name or "": admin.site.get_model_admin(model)
        for model in apps.get_app_config("django_venturi").get_models()
        if admin.site.is_registered(model)
    }


@dataclasses.dataclass(frozen=True)
class Page:
    model_name: str
    url_name: str
    path_argument: str | None
    """What the URL's path names (`object_id`, a job's `kind`), or None."""

    @property
    def takes_object_id(self) -> bool:
        """Whether the path names something: an object's id, or a kind (the per-kind page)."""
        return self.path_argument is not None

    def __str__(self) -> str:
        return self.url_name


def venturi_pages() -> list[Page]:
    """Every named URL the venturi model admins register."""
    return [
        Page(model_name, pattern.name, next(iter(pattern.pattern.regex.groupindex), None))
        for model_name, model_admin in venturi_model_admins().items()
        for pattern in model_admin.get_urls()
        if isinstance(pattern, URLPattern) and pattern.name
    ]


PAGES = venturi_pages()
OBJECT_PAGES = [page for page in PAGES if page.takes_object_id]

SEEDS = {
    "index": "0",
    "post": "yes",
    "older_than": "7d",
    "states": "completed",
    "confirm": "yes",
    "scope": "queue",
    "name": "default",
    "refresh": "10",
    "q": "mail",
}
"""Plausible values of the parameters that open a page's deeper paths (an action
runs only with `index` and `action`; the cleanup deletes only with a valid form)."""


def encoded(parameters: dict[str, str]) -> str:
    """A query string or form body; lone surrogates go out as the raw bytes they stand for."""
    return "&".join(
        quote(key.encode("utf-8", "surrogateescape"), safe="")
        + "="
        + quote(value.encode("utf-8", "surrogateescape"), safe="")
        for key, value in parameters.items()
    )


def send(client: Client, method: str, url: str, parameters: dict[str, str]) -> HttpResponse:
    """One request, in a savepoint rolled back after it."""
    body = encoded(parameters)
    with transaction.atomic():
        if method == "GET":
            response = client.get(f"{url}?{body}" if body else url)
        else:
            response = client.post(url, body, content_type="application/x-www-form-urlencoded")
        transaction.set_rollback(True)
    return response  # type: ignore[no-any-return]


@contextmanager
def parameters_read() -> Iterator[set[str]]:
    """The names views read from any `QueryDict` (`request.GET`, `request.POST`) meanwhile."""
    names: set[str] = set()

    def recording(method: str) -> Any:
        original = getattr(QueryDict, method)

        def read(self: QueryDict, key: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(key, str):
                names.add(key)
            return original(self, key, *args, **kwargs)

        return read

    with pytest.MonkeyPatch.context() as patch:
        for method in ("get", "getlist", "__getitem__", "__contains__"):
            patch.setattr(QueryDict, method, recording(method))
        yield names


def superuser_request(method: str = "GET") -> Any:
    request = RequestFactory().generic(method, "/")
    request.user = User.objects.filter(is_superuser=True).first()
    return request


def list_parameters(model_admin: admin.ModelAdmin[Any]) -> set[str]:
    """What a Django change list reads from the whole query string: its filters' parameters,
    and a lookup on each of the model's own fields (date ranges for its times)."""
    changelist = model_admin.get_changelist_instance(superuser_request())
    names: set[str] = set()
    for spec in changelist.filter_specs:
        names.update(spec.expected_parameters() or [])
    for field in model_admin.model._meta.concrete_fields:
        names.add(field.name)
        if isinstance(field, models.DateTimeField):
            names.update({f"{field.name}__gte", f"{field.name}__lt"})
    names.update({"id__gte", "id__in", ORDER_VAR, SEARCH_VAR, PAGE_VAR, ALL_VAR})
    return names


def journeys(
    names: set[str], method: str, model_admin: admin.ModelAdmin[Any], job: Job
) -> list[dict[str, str]]:
    """The requests a page is tried with: nothing (GET), or every seeded parameter set
    (POST), once per action when the page reads `action`."""
    if method == "GET":
        return [{}]
    # Never empty: a page may read nothing from an empty POST (`Form(request.POST or None)`).
    base = {"unread": "1", **{name: SEEDS[name] for name in names if name in SEEDS}}
    if "_selected_action" in names:
        base["_selected_action"] = str(job.pk)
    actions = list(model_admin.get_actions(superuser_request("POST")))
    if "action" in names and actions:
        return [{**base, "action": action} for action in actions]
    return [base]


def discover(
    client: Client, method: str, url: str, model_admin: admin.ModelAdmin[Any], job: Job
) -> tuple[set[str], list[dict[str, str]]]:
    """The parameters a page reads, and the requests that reach them all."""
    names: set[str] = set()
    while True:
        tries = journeys(names, method, model_admin, job)
        with parameters_read() as read:
            for parameters in tries:
                send(client, method, url, parameters)
        if read <= names:
            return names, tries
        names |= read


# ---------------------------------------------------------------- rows and users


@pytest.fixture
def rows(settings: Any) -> dict[str, Any]:
    """A job of each kind of state, a journal entry, a running job with progress, and a
    periodic schedule (the periodic page's run now, disable and enable act on it)."""
    schedule = {"task": "tests.noop", "cron": "0 3 * * *", "payload": {"n": 1}}
    settings.VENTURI = {**settings.VENTURI, "PERIODIC": [schedule]}
    periodic = ScheduleState.objects.create(kind="tests.noop", first_seen_at=timezone.now())
    now = datetime.now().astimezone()
    failed = Job.objects.create(
        kind="tests.noop",
        payload={"n": 1},
        state="failed",
        attempt=1,
        failures=1,
        last_error="builtins.RuntimeError: boom",
        finished_at=now,
    )
    Job.objects.create(kind="tests.noop", payload={"n": 2}, state="ready")
    Job.objects.create(
        kind="tests.noop",
        payload={"n": 3},
        state="running",
        attempt=1,
        claim_token=uuid.uuid4(),
        lease_expires_at=now,
        started_at=now,
        progress={"done": 2, "total": 5, "note": "halfway"},
    )
    Job.objects.create(
        kind="tests.noop",
        payload={"n": 4},
        state="completed",
        attempt=1,
        finished_at=now - timedelta(days=30),
    )
    entry = JournalEntry.objects.create(
        job=failed, attempt=1, outcome="failed", error_type="E", error_message="boom"
    )
    return {"job": failed, "journalentry": entry, "periodictask": periodic}


@pytest.fixture
def clients() -> dict[str, Client]:
    superuser = User.objects.create_superuser("root", password="x")
    root = Client(raise_request_exception=False)
    root.force_login(superuser)
    viewer = staff_with("view_job", "view_journalentry", "view_periodictask")
    viewer.raise_request_exception = False
    return {"superuser": root, "view-only staff": viewer}


def page_url(page: Page, rows: dict[str, Any], object_id: str | None = None) -> str:
    if not page.takes_object_id:
        return reverse(f"admin:{page.url_name}")
    placeholder = "0123456789"
    url = reverse(f"admin:{page.url_name}", args=[placeholder])
    if object_id is None and page.path_argument == "kind":
        object_id = rows["job"].kind
    elif object_id is None:
        object_id = str(rows[page.model_name].pk)
    return url.replace(placeholder, quote(object_id.encode("utf-8", "surrogateescape"), safe=""))


def server_errors(response: HttpResponse, what: str) -> list[str]:
    if response.status_code < 500:
        return []
    error = getattr(response, "exc_info", None)
    cause = f"{error[0].__name__}: {str(error[1])[:200]}" if error else ""
    return [f"{response.status_code} {what}: {cause}"]


def messages_of(response: HttpResponse) -> list[str]:
    return [str(message) for message in response.context["messages"]] if response.context else []


# ---------------------------------------------------------------- every page, every parameter


def test_the_discovery_finds_the_venturi_admin_pages() -> None:
    """A test that found nothing would pass: the pages and parameters it must find."""
    names = {page.url_name for page in PAGES}
    for expected in (
        "django_venturi_job_changelist",
        "django_venturi_job_change",
        "django_venturi_job_delete",
        "django_venturi_job_history",
        "django_venturi_job_stats",
        "django_venturi_job_cleanup",
        "django_venturi_job_pause",
        "django_venturi_job_resume",
        "django_venturi_job_retry",
        "django_venturi_job_cancel",
        "django_venturi_journalentry_changelist",
        "django_venturi_journalentry_change",
        "django_venturi_periodictask_changelist",
        "django_venturi_periodictask_run",
        "django_venturi_periodictask_disable",
        "django_venturi_periodictask_enable",
    ):
        assert expected in names


def test_the_discovery_finds_the_parameters_each_page_reads(
    rows: dict[str, Any], clients: dict[str, Client]
) -> None:
    client = clients["superuser"]
    model_admins = venturi_model_admins()
    job_admin = model_admins["job"]

    def read(url_name: str, method: str) -> set[str]:
        page = next(page for page in PAGES if page.url_name == url_name)
        return discover(client, method, page_url(page, rows), job_admin, rows["job"])[0]

    assert {"q", "p"} <= read("django_venturi_job_changelist", "GET")
    assert {"action", "index", "_selected_action", "post"} <= read(
        "django_venturi_job_changelist", "POST"
    )
    assert "refresh" in read("django_venturi_job_stats", "GET")
    assert {"older_than", "states", "confirm"} <= read("django_venturi_job_cleanup", "POST")
    assert {"scope", "name"} <= read("django_venturi_job_pause", "POST")
    assert {
        "o",
        "state__exact",
        "kind",
        "queue",
        "priority__exact",
        "has_error",
    } <= list_parameters(job_admin)


@pytest.mark.parametrize("hostile", hostile_sets())
@pytest.mark.parametrize("user", FUZZED_USERS)
@pytest.mark.parametrize("page", PAGES, ids=str)
def test_no_admin_page_answers_500_to_a_hostile_parameter(
    page: Page, user: str, hostile: dict[str, str], rows: dict[str, Any], clients: dict[str, Client]
) -> None:
    client = clients[user]
    model_admin = venturi_model_admins()[page.model_name]
    url = page_url(page, rows)
    failures: list[str] = []
    tried = 0
    for method in ("GET", "POST"):
        # What the page reads for a superuser: view-only staff get the same parameters.
        names, tries = discover(clients["superuser"], method, url, model_admin, rows["job"])
        if method == "GET" and "p" in names:  # a Django change list: it reads all of GET
            names |= list_parameters(model_admin)
        names = names or {"unread"}  # a page that reads nothing must ignore what it is sent
        for parameters in tries:
            for name in sorted(names):
                for label, value in hostile.items():
                    response = send(client, method, url, {**parameters, name: value})
                    tried += 1
                    failures += server_errors(
                        response, f"{method} {name}={label} with {sorted(parameters)}"
                    )
    assert tried
    assert not failures, f"{len(failures)} of {tried} requests failed:\n" + "\n".join(failures[:30])


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("page", OBJECT_PAGES, ids=str)
def test_no_admin_page_answers_500_to_a_hostile_object_id(
    page: Page, user: str, rows: dict[str, Any], clients: dict[str, Client]
) -> None:
    client = clients[user]
    failures: list[str] = []
    for label, value in HOSTILE.items():
        if not value.strip():
            continue  # no URL: the path would end `//change/`
        url = page_url(page, rows, object_id=value)
        for method in ("GET", "POST"):
            failures += server_errors(send(client, method, url, {}), f"{method} id={label}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------- what the refusals say


@pytest.mark.parametrize(
    ("url_name", "number"),
    [
        ("django_venturi_job_changelist", str(BIGINT_MAX + 1)),
        ("django_venturi_job_changelist", "9" * 5000),
        ("django_venturi_journalentry_changelist", "#" + str(BIGINT_MAX + 1)),
        ("django_venturi_journalentry_changelist", "9" * 5000),
    ],
    ids=["job-past-bigint", "job-5000-digits", "journal-past-bigint", "journal-5000-digits"],
)
def test_a_job_id_past_the_bigint_range_finds_nothing_and_says_why(
    url_name: str, number: str, rows: dict[str, Any], clients: dict[str, Client]
) -> None:
    response = clients["superuser"].get(reverse(f"admin:{url_name}"), {"q": number})
    assert response.status_code == 200
    assert response.context["cl"].result_count == 0
    [message] = messages_of(response)
    assert f"at most {BIGINT_MAX}" in message
    assert "job id" in message


def test_the_largest_job_id_is_still_looked_up(
    rows: dict[str, Any], clients: dict[str, Client]
) -> None:
    job = rows["job"]
    client = clients["superuser"]
    response = client.get(reverse("admin:django_venturi_job_changelist"), {"q": str(BIGINT_MAX)})
    assert response.status_code == 200
    assert response.context["cl"].result_count == 0
    assert not messages_of(response)
    response = client.get(reverse("admin:django_venturi_job_changelist"), {"q": f"#{job.pk}"})
    assert [row.pk for row in response.context["cl"].result_list] == [job.pk]


@pytest.mark.parametrize("digit", ["²", "٣", "\U0001d7d7"])
def test_unicode_digits_are_searched_as_text_not_as_a_job_id(
    digit: str, rows: dict[str, Any], clients: dict[str, Client]
) -> None:
    holder = Job.objects.create(kind="tests.noop", payload={"text": f"x{digit}y"})
    client = clients["superuser"]
    response = client.get(reverse("admin:django_venturi_job_changelist"), {"q": digit})
    assert response.status_code == 200
    assert [row.pk for row in response.context["cl"].result_list] == [holder.pk]
    response = client.get(reverse("admin:django_venturi_journalentry_changelist"), {"q": digit})
    assert response.status_code == 200
    assert response.context["cl"].result_count == 0


@pytest.mark.parametrize(
    "value", ["²", "9" * 5000, "-1", "1.5", "86401", "abc"], ids=lambda v: v[:8]
)
def test_stats_refuses_a_refresh_it_cannot_use_and_says_so(
    value: str, clients: dict[str, Client]
) -> None:
    response = clients["view-only staff"].get(
        reverse("admin:django_venturi_job_stats"), {"refresh": value}
    )
    assert response.status_code == 200
    assert response.context["refresh"] is None
    assert 'http-equiv="refresh"' not in response.content.decode()
    [message] = messages_of(response)
    assert message.startswith("refresh: ")


def test_stats_refresh_still_reloads_within_its_bounds(clients: dict[str, Client]) -> None:
    client = clients["view-only staff"]
    for value, seconds in (("10", 10), ("1", 2), ("86400", 86400)):
        response = client.get(reverse("admin:django_venturi_job_stats"), {"refresh": value})
        assert response.context["refresh"] == seconds
        assert not messages_of(response)
    assert client.get(reverse("admin:django_venturi_job_stats")).context["refresh"] is None


@pytest.mark.parametrize("age", ["9999999999d", "999999999w", "1e400d", "400000d", "\u0661d"])
def test_cleanup_page_refuses_an_age_it_cannot_use_naming_the_field(
    age: str, rows: dict[str, Any], clients: dict[str, Client]
) -> None:
    response = clients["superuser"].post(
        reverse("admin:django_venturi_job_cleanup"), {"older_than": age, "states": ["completed"]}
    )
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert list(errors) == ["older_than"]
    assert Job.objects.filter(state="completed").exists()


@pytest.mark.parametrize(
    ("parameter", "value"),
    [
        ("priority__exact", "²"),
        ("id__gte", "9" * 5000),
        ("enqueued_at__gte", "9999999999d"),
        ("attempt", "-1x"),
        ("kind", "a\x00b"),
    ],
)
def test_a_list_parameter_the_list_cannot_use_is_named_in_a_message(
    parameter: str, value: str, rows: dict[str, Any], clients: dict[str, Client]
) -> None:
    client = clients["view-only staff"]
    response = client.get(
        reverse("admin:django_venturi_job_changelist") + "?" + encoded({parameter: value}),
        follow=True,
    )
    assert response.status_code == 200
    assert response.context["cl"].result_count == Job.objects.count()
    [message] = messages_of(response)
    assert f"{parameter}=" in message


@pytest.mark.parametrize("selected", ["²", "9" * 5000, str(BIGINT_MAX + 1), "-1", "1\x00"])
@pytest.mark.parametrize("action", ["retry_now", "cancel_jobs", "delete_selected"])
def test_an_action_on_ids_that_cannot_be_jobs_changes_nothing_and_says_so(
    action: str, selected: str, rows: dict[str, Any], clients: dict[str, Client]
) -> None:
    before = sorted(Job.objects.values_list("id", "state"))
    for confirmed in ({}, {"post": "yes"}):
        response = clients["superuser"].post(
            reverse("admin:django_venturi_job_changelist"),
            encoded({"action": action, "index": "0", "_selected_action": selected, **confirmed}),
            content_type="application/x-www-form-urlencoded",
            follow=True,
        )
        assert response.status_code == 200
        assert any("_selected_action" in message for message in messages_of(response))
    assert sorted(Job.objects.values_list("id", "state")) == before


# ---------------------------------------------------------------- odd rows written by SQL

ODD_PROGRESS = [
    {"done": "many", "total": 10},
    {"done": [1], "total": 2},
    {"done": {"a": 1}, "total": 3},
    {"done": 5, "total": "ten"},
    {"done": 1e308, "total": 1e-308},
    {"done": None, "total": 0},
    {"done": True, "total": True},
    {"done": 3, "total": -4, "note": 12345},
    {"done": 3, "total": [1, 2]},
    {"done": 10**309, "total": 10**310},
    {"done": 1, "total": 10**400},
    {"note": ["a", "list"]},
    "just text",
    [1, 2, 3],
    42,
    None,
]


def write_by_sql(job: Job, **columns: Any) -> None:
    """Set columns with SQL, as a data fix, a migration or another writer would."""
    assignments = ", ".join(f"{connection.ops.quote_name(name)} = %s" for name in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE django_venturi_job SET {assignments} WHERE id = %s",
            [*columns.values(), job.pk],
        )


def odd_rows() -> list[Job]:
    """Running and ready jobs whose shown fields hold values no venturi code writes."""
    now = datetime.now().astimezone()
    made = []
    for index, progress in enumerate(ODD_PROGRESS):
        job = Job.objects.create(
            kind="tests.noop",
            payload={"odd": index},
            state="running",
            attempt=1,
            claim_token=uuid.uuid4(),
            lease_expires_at=now,
            started_at=now,
        )
        write_by_sql(job, progress=None if progress is None else __import__("json").dumps(progress))
        made.append(job)
    far = Job.objects.create(kind="tests.noop", payload={}, state="ready")
    write_by_sql(
        far,
        run_at="9999-12-31 23:59:59+00",
        enqueued_at="0001-01-01 00:00:00+00",
        state="no-such-state",
        kind="\u202e" + "k" * 199,
        queue="q" * 100,
    )
    made.append(far)
    old = Job.objects.create(kind="tests.noop", payload={}, state="ready")
    write_by_sql(old, run_at="0001-01-01 00:00:00+00", attempt=2_147_483_647, failures=1)
    made.append(old)
    waiting = Job.objects.create(kind="tests.noop", payload={}, state="ready")
    write_by_sql(waiting, state="waiting", waiting_for=2_147_483_647)
    made.append(waiting)
    JournalEntry.objects.create(
        job=made[0], attempt=1, outcome="failed", error_type="E", error_message="x"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_venturi_journalentry SET outcome = 'no-such-outcome', "
            "started_at = '9999-12-31 23:59:59+00', finished_at = '0001-01-01 00:00:00+00' "
            "WHERE job_id = %s",
            [made[0].pk],
        )
    return made


@pytest.mark.parametrize("user", USERS)
def test_rows_with_odd_values_written_by_sql_do_not_break_the_pages(
    user: str, clients: dict[str, Client]
) -> None:
    jobs = odd_rows()
    client = clients[user]
    changelist = reverse("admin:django_venturi_job_changelist")
    for url in (
        changelist,
        changelist + "?state__exact=running",
        changelist + "?o=6",
        changelist + "?q=tests",
        reverse("admin:django_venturi_journalentry_changelist"),
        reverse("admin:django_venturi_job_stats"),
        *(reverse("admin:django_venturi_job_change", args=[job.pk]) for job in jobs),
        *(
            reverse("admin:django_venturi_journalentry_change", args=[entry.pk])
            for entry in JournalEntry.objects.all()
        ),
    ):
        response = client.get(url)
        assert response.status_code == 200, (url, server_errors(response, url))
    listed = clients[user].get(changelist).context["cl"].result_list
    assert {job.pk for job in jobs} <= {row.pk for row in listed}
    # The state history of the job whose journal names an outcome no venturi code writes.
    page = client.get(reverse("admin:django_venturi_job_change", args=[jobs[0].pk]))
    assert "no-such-outcome: running" in page.content.decode()


def test_commands_read_rows_with_odd_values_written_by_sql() -> None:
    odd_rows()
    out = StringIO()
    call_command("venturi_stats", stdout=out)
    call_command("venturi_stats", "--json", stdout=out)
    assert "many" in out.getvalue()


# ---------------------------------------------------------------- commands

COMMANDS = sorted(name for name, app in get_commands().items() if app == "django_venturi")
BASE_ARGUMENTS = {
    "venturi_cleanup": ["--older-than", "7d", "--dry-run"],
    "venturi_maintenance": ["reindex", "--dry-run"],
    "venturi_queue": ["pause", "default"],
    "venturi_stats": ["--json"],
    "venturi_worker": ["--burst"],
}
"""A valid command line of each command; a hostile value replaces or joins one of it."""
EXTRA_ARGUMENTS = {"--watch": ["--check-orphans"]}
"""A value --watch accepts would repeat forever: with --check-orphans the command returns."""
OTHER_HELPERS_FLAGS = {"--concurrency", "--poll-interval"}
"""The worker's bounds (tests/test_worker_hardening.py and the flags' own tests)."""
DJANGO_DESTINATIONS = {
    "help",
    "version",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}


def command_lines(command: str, value: str) -> list[tuple[str, list[str]]]:
    """Each option and positional of `command` given `value`, on its base command line."""
    parser = load_command_class("django_venturi", command).create_parser("manage.py", command)
    base = BASE_ARGUMENTS[command]
    positionals = [argument for argument in base if not argument.startswith("-")]
    options = base[len(positionals) :]
    lines = []
    index = 0
    for action in parser._actions:
        if action.dest in DJANGO_DESTINATIONS or action.nargs == 0:
            continue
        if not action.option_strings:  # a positional: replace the base's
            replaced = list(positionals)
            if index < len(replaced):
                replaced[index] = value
            else:
                replaced.append(value)
            index += 1
            lines.append((action.dest, [*replaced, *options]))
            continue
        flag = action.option_strings[-1]
        if flag in OTHER_HELPERS_FLAGS:
            continue
        lines.append((flag, [*positionals, *options, *EXTRA_ARGUMENTS.get(flag, []), flag, value]))
    return lines


def test_every_venturi_command_is_covered() -> None:
    assert set(COMMANDS) == set(BASE_ARGUMENTS)
    flags = {flag for command in COMMANDS for flag, _ in command_lines(command, "1")}
    assert {"--older-than", "--state", "--batch-size", "--database", "--watch"} <= flags
    assert {"--stale-after", "--shutdown-timeout", "--kind-concurrency", "--by"} <= flags


class WorkerWouldRun(Exception):
    """Raised instead of running a worker whose command line was accepted."""


def would_run(worker: Worker) -> None:
    raise WorkerWouldRun


@pytest.mark.parametrize("label", hostile_labels())
@pytest.mark.parametrize("command", COMMANDS)
def test_no_command_answers_a_hostile_value_with_a_traceback(
    command: str, label: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each option either takes the value or refuses it with a CommandError; nothing else.

    A worker whose flags were accepted is built but not run (its loops would run in
    this process): what it would do with them is the worker's tests' concern.
    """
    monkeypatch.setattr(Worker, "run", would_run)
    value = HOSTILE[label]
    failures = []
    for option, arguments in command_lines(command, value):
        try:
            with transaction.atomic():
                call_command(command, *arguments, stdout=StringIO(), stderr=StringIO())
                transaction.set_rollback(True)
        except (CommandError, WorkerWouldRun):
            pass
        except Exception as error:
            failures.append(f"{option}={label}: {type(error).__name__}: {str(error)[:200]}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("age", ["9999999999d", "999999999w", "400000d", "1e400d"])
def test_cleanup_command_refuses_an_age_it_cannot_use_naming_the_option(age: str) -> None:
    with pytest.raises(CommandError, match="--older-than"):
        call_command("venturi_cleanup", "--older-than", age, stdout=StringIO())


@pytest.mark.parametrize("command", sorted(BASE_ARGUMENTS))
@pytest.mark.parametrize("alias", ["nowhere", "²", "a\x00b"])
def test_commands_refuse_an_unknown_database_naming_the_option(command: str, alias: str) -> None:
    positionals = [a for a in BASE_ARGUMENTS[command] if not a.startswith("-")]
    options = BASE_ARGUMENTS[command][len(positionals) :]
    with pytest.raises(CommandError, match="--database"):
        call_command(command, *positionals, *options, "--database", alias, stdout=StringIO())


@pytest.mark.parametrize("by", ["a\x00b", "\udcff"])
def test_queue_command_refuses_a_by_the_database_cannot_store(by: str) -> None:
    with pytest.raises(CommandError, match="--by"):
        call_command("venturi_queue", "pause", "default", "--by", by, stdout=StringIO())


@pytest.mark.parametrize("by", ["a\x00b", "\udcff"])
def test_pause_refuses_a_by_the_database_cannot_store(by: str) -> None:
    with pytest.raises(ValueError, match=r"^by contains"):
        venturi.pause(queue="default", by=by)
    assert venturi.paused() == []
