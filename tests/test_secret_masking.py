"""No `venturi.secret()` value is shown, whatever type shape holds it (issue 33, item 3).

The shapes are not listed by hand: `codec_shapes()` offers the codec every generic
of `builtins`, `typing`, `collections` and `collections.abc` wrapped around a
dataclass with a secret field (and unions, `Optional`, `Annotated`, a dataclass
inside a dataclass), keeps those the codec accepts, and nests them two deep. A
container the codec learns to store is therefore checked here the day it does.
Each accepted shape is masked as a payload field and as a carry; then one task
whose payload and carry hold every shape runs (pause, fail, complete) and every
admin page that shows it is read as a view-only user and as a superuser.
"""

from __future__ import annotations

import builtins
import collections
import collections.abc
import dataclasses
import itertools
import json
import typing
import urllib.parse
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Annotated, Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from django_venturi.payloads import codec, masking
from django_venturi.testing import drain
from tests.conftest import Workers
from tests.test_admin import act, staff, staff_with
from tests.testapp.tasks import LeakyLogin

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_venturi_job_changelist")
JOURNAL = reverse("admin:django_venturi_journalentry_changelist")
MARK = "SECRET-"
"""Every secret value of this file starts with it, and nothing else shown does."""


@dataclasses.dataclass(frozen=True)  # frozen: hashable, so sets of it can be offered too
class Account:
    name: str
    key: str = venturi.secret()


@dataclasses.dataclass(frozen=True)
class Card:
    holder: str
    number: str = venturi.secret()


class Secrets:
    """Makes accounts and cards, each with its own secret and its own visible name."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.secrets: list[str] = []
        self.names: list[str] = []

    def _next(self) -> tuple[str, str]:
        n = len(self.secrets)
        self.secrets.append(f"{MARK}{self.prefix}-{n}")
        self.names.append(f"visible-{self.prefix}-{n}")
        return self.names[-1], self.secrets[-1]

    def account(self) -> Account:
        return Account(*self._next())

    def card(self) -> Card:
        return Card(*self._next())


Build = Callable[[Secrets], Any]


@dataclasses.dataclass(frozen=True)
class Shape:
    label: str
    hint: Any
    build: Build


# ---------------------------------------------------------------- the shapes, from the codec


def _containers(inner: Build) -> list[tuple[str, Build]]:
    """Every container of an inner value one might hand the codec for a generic type."""
    return [
        ("list", lambda s: [inner(s), inner(s)]),
        ("tuple", lambda s: (inner(s), inner(s))),
        ("pair", lambda s: ("k", inner(s))),
        ("dict", lambda s: {"a": inner(s), "b": inner(s)}),
        ("set", lambda s: {inner(s)}),
        ("frozenset", lambda s: frozenset({inner(s)})),
        ("deque", lambda s: collections.deque([inner(s)])),
    ]


def _generics() -> list[tuple[str, Any]]:
    """Everything subscriptable in the modules where Python keeps its generic types."""
    found = []
    for module in (builtins, typing, collections, collections.abc):
        for name in sorted(dir(module)):
            if not name.startswith("_"):
                found.append((f"{module.__name__}.{name}", getattr(module, name)))
    return found


def _forms(generic: Any, inner: Any) -> Iterator[tuple[str, Any]]:
    """`generic` subscripted around `inner` every way a container type takes one."""
    for label, args in (("[X]", (inner,)), ("[str, X]", (str, inner)), ("[X, ...]", (inner, ...))):
        try:
            yield label, generic[args if len(args) > 1 else args[0]]
        except Exception:  # not subscriptable, or not this way
            continue


def _accepted(hint: Any, value: Any) -> bool:
    try:
        codec.encode_value(value, hint, "shape")
    except Exception:  # a PayloadError, or the codec choking on an odd hint: not a shape
        return False
    return True


Wrapper = Callable[[Shape], Shape]


def _codec_wrappers() -> list[Wrapper]:
    """Each way of holding a value that the codec accepts: found generics and special forms."""
    probe = Shape("Account", Account, Secrets.account)
    wrappers: list[Wrapper] = []
    seen: set[tuple[Any, str, str]] = set()
    for name, generic in _generics():
        for form, hint in _forms(generic, Account):
            for container, _ in _containers(Secrets.account):
                value = dict(_containers(Secrets.account))[container](Secrets("probe"))
                if not _accepted(hint, value):
                    continue
                key = (typing.get_origin(hint) or hint, form, container)
                if key not in seen:  # typing.List and list are one shape
                    seen.add(key)
                    wrappers.append(_generic_wrapper(name, generic, form, container))
    for wrapper in _special_wrappers():
        shape = wrapper(probe)
        if _accepted(shape.hint, shape.build(Secrets("probe"))):
            wrappers.append(wrapper)
    return wrappers


def _generic_wrapper(name: str, generic: Any, form: str, container: str) -> Wrapper:
    def wrap(inner: Shape) -> Shape:
        hint = dict(_forms(generic, inner.hint))[form]
        build = dict(_containers(inner.build))[container]
        return Shape(f"{name}{form.replace('X', inner.label)} as {container}", hint, build)

    return wrap


def _special_wrappers() -> list[Wrapper]:
    def optional(inner: Shape) -> Shape:
        return Shape(f"{inner.label} | None", inner.hint | None, inner.build)

    def union_first(inner: Shape) -> Shape:
        return Shape(f"{inner.label} | Card", typing.Union[inner.hint, Card], inner.build)  # noqa: UP007

    def union_second(inner: Shape) -> Shape:
        return Shape(f"Card | {inner.label}", typing.Union[Card, inner.hint], inner.build)  # noqa: UP007

    def union_card(inner: Shape) -> Shape:  # the other member of the union holds the value
        return Shape(f"{inner.label} | Card (a Card)", typing.Union[inner.hint, Card], Secrets.card)  # noqa: UP007

    def annotated(inner: Shape) -> Shape:
        return Shape(f"Annotated[{inner.label}]", Annotated[inner.hint, "note"], inner.build)

    def in_dataclass(inner: Shape) -> Shape:
        holder = dataclasses.make_dataclass(
            "Holder",
            [("held", inner.hint), ("label", str)],
            frozen=True,
            namespace={"__module__": __name__},
        )

        def build(s: Secrets) -> Any:
            return holder(inner.build(s), f"visible-{s.prefix}")

        return Shape(f"Holder({inner.label})", holder, build)

    return [optional, union_first, union_second, union_card, annotated, in_dataclass]


@dataclasses.dataclass
class Tree:
    """A recursive type: an account at every node."""

    account: Account
    children: list[Tree] = dataclasses.field(default_factory=list)


def codec_shapes() -> list[Shape]:
    """Every shape the codec accepts around a secret, one and two deep, and a recursive one."""
    base = Shape("Account", Account, Secrets.account)
    wrappers = _codec_wrappers()
    shapes = [base]
    shapes += [wrap(base) for wrap in wrappers]
    shapes += [outer(inner(base)) for outer, inner in itertools.product(wrappers, wrappers)]
    shapes.append(
        Shape("Tree", Tree, lambda s: Tree(s.account(), [Tree(s.account(), [Tree(s.account())])]))
    )
    return [shape for shape in shapes if _accepted(shape.hint, shape.build(Secrets("probe")))]


SHAPES = codec_shapes()
ONE_DEEP = [
    shape for shape in SHAPES if shape.label.count("Account") == 1 and "|" not in shape.label
]


def test_the_shapes_cover_what_the_codec_stores() -> None:
    """The scan is not empty-handed: the containers the guide names are among the shapes."""
    origins = {typing.get_origin(shape.hint) for shape in SHAPES}
    assert {list, tuple, dict, typing.Union} <= origins
    labels = {shape.label for shape in SHAPES}
    for expected in (
        "builtins.list[Account] as list",
        "builtins.list[builtins.list[Account] as list] as list",
        "builtins.tuple[Account, ...] as tuple",
        "builtins.tuple[str, Account] as pair",
        "builtins.dict[str, Account] as dict",
        "Account | None",
        "Account | Card",
        "Card | Account",
        "Account | Card (a Card)",
        "Holder(Account)",
        "Holder(builtins.dict[str, Account] as dict)",
        "Tree",
    ):
        assert expected in labels, expected
    assert len(SHAPES) > 80


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.label)
def test_every_shape_the_codec_accepts_is_masked_as_payload_and_as_carry(shape: Shape) -> None:
    made = Secrets("shape")
    value = shape.build(made)
    holder = dataclasses.make_dataclass(
        "Payload", [("field", shape.hint)], namespace={"__module__": __name__}
    )
    payload_type: Any = holder
    shown = {
        "payload": codec.masked(payload_type, codec.encode(holder(value))),
        "carry": masking.masked_value(shape.hint, codec.encode_value(value, shape.hint, "carry")),
    }
    for where, masked in shown.items():
        text = json.dumps(masked)
        assert made.secrets, shape.label
        for secret in made.secrets:
            assert secret not in text, (where, shape.label)
        for name in made.names:  # masked by the type, not wholesale: the rest is shown
            assert name in text, (where, shape.label)
        assert codec.MASK in text


def test_values_that_do_not_fit_their_type_are_masked_whole() -> None:
    """An old row: a renamed field, a list where an object was, a union tag out of range."""
    hint = dict[str, Account | Card]
    stored = {
        "a": {"__union__": 7, "value": {"holder": "h", "number": "SECRET-tag"}},
        "b": {"__union__": 0, "value": {"name": "n", "key": "SECRET-key", "old_key": "SECRET-old"}},
        "c": ["SECRET-list"],
    }
    text = json.dumps(masking.masked_value(hint, stored))
    assert MARK not in text
    assert '"name": "n"' in text
    assert masking.masked_value(dict[str, int], {"n": 1}) == {"n": 1}  # no secret possible


def test_a_class_whose_field_types_cannot_be_resolved_is_masked_whole() -> None:
    @dataclasses.dataclass
    class Gone:
        token: NoSuchType  # type: ignore[name-defined]  # noqa: F821

    assert masking.holds_secrets(Gone)
    assert masking.masked(Gone, {"token": "SECRET-x"}) == {"token": codec.MASK}


def test_redaction_hides_copies_quoted_or_inside_text() -> None:
    token = "SECRET-a/b+c d"
    texts = masking.secret_texts(Account, {"name": "n", "key": token})
    message = (
        f"401 at https://x/?t={urllib.parse.quote_plus(token)} for {token!r} ({json.dumps(token)})"
    )
    assert MARK not in masking.redact_text(message, texts)
    result = {"copy": token, token: [f"used {token}"], "count": 3}
    shown = masking.redact(result, texts)
    assert MARK not in json.dumps(shown) and shown["count"] == 3
    short = masking.secret_texts(Account, {"name": "n", "key": "abc"})
    assert masking.redact({"k": "abc", "line": "abc def"}, short) == {
        "k": codec.MASK,  # equal to the secret: masked
        "line": "abc def",  # too short to look for inside text
    }


# ---------------------------------------------------------------- one task, every shape, every page


def shape_fields(prefix: str) -> tuple[dict[str, Any], Secrets]:
    made = Secrets(prefix)
    return {f"shape_{i}": shape.build(made) for i, shape in enumerate(ONE_DEEP)}, made


def token_of(step: str) -> str:
    return f"{MARK}token/{step}+x y"  # quoted differently by repr, JSON and URLs


PIN = 90817263


SecretCarry: Any = dataclasses.make_dataclass(
    "SecretCarry",
    [("note", str)] + [(f"shape_{i}", shape.hint) for i, shape in enumerate(ONE_DEEP)],
    namespace={"__module__": __name__},
)


def _handle(self: Any, ctx: venturi.Context) -> venturi.Outcome:
    _, made = shape_fields(self.step)
    if self.step == "pause":
        carry_fields, _ = shape_fields("carry")
        return venturi.Outcome.paused(
            SecretCarry(note=f"resume with {self.token}", **carry_fields), after=timedelta(hours=1)
        )
    if self.step == "fail":
        raise ValueError(
            f"refused {made.secrets} at https://api.example/?t={urllib.parse.quote_plus(self.token)}"
            f" (token {self.token!r}, pin {self.pin})"
        )
    return venturi.Outcome.completed(
        result={
            "token": self.token,
            "keys": made.secrets,
            "note": f"used {self.token} and pin {self.pin}",
            "by_key": dict.fromkeys(made.secrets, 1),
            "pin": self.pin,
            "names": made.names,
        }
    )


SecretShapes: Any = venturi.task(kind="tests.secret_shapes", max_attempts=1, carry=SecretCarry)(
    dataclasses.make_dataclass(
        "SecretShapes",
        [
            ("step", str),
            ("token", str, venturi.secret()),
            ("pin", int, venturi.secret()),
        ]
        + [(f"shape_{i}", shape.hint) for i, shape in enumerate(ONE_DEEP)],
        namespace={"handle": _handle, "__module__": __name__},
    )
)


def run_jobs() -> tuple[dict[str, Job], list[str]]:
    """Three jobs of every shape, run for real: one paused with a carry, one failed, one
    completed with a result; and every secret they hold, in every form."""
    jobs, secrets = {}, []
    for step in ("pause", "fail", "complete"):
        fields, made = shape_fields(step)
        jobs[step] = SecretShapes(step=step, token=token_of(step), pin=PIN, **fields).enqueue()
        secrets += [*made.secrets, token_of(step)]
    secrets += [*shape_fields("carry")[1].secrets, str(PIN)]
    ran = {run.job_id: run for run in drain(kinds=["tests.secret_shapes"])}
    assert ran[jobs["pause"].pk].outcome == "paused"
    assert ran[jobs["fail"].pk].state == "failed"
    assert ran[jobs["complete"].pk].state == "completed"
    for job in jobs.values():
        job.refresh_from_db()
    stored = json.dumps(
        [[job.payload, job.carry, job.result, job.last_error] for job in jobs.values()]
    )
    assert all(
        secret in stored for secret in (token_of("fail"), shape_fields("carry")[1].secrets[0])
    )
    quoted = [
        urllib.parse.quote_plus(token) for token in map(token_of, ("pause", "fail", "complete"))
    ]
    return jobs, secrets + quoted


def pages(jobs: dict[str, Job]) -> list[str]:
    urls = [CHANGELIST, f"{CHANGELIST}?state=failed", f"{CHANGELIST}?q=secret_shapes", JOURNAL]
    for job in jobs.values():
        urls += [
            reverse("admin:django_venturi_job_change", args=[job.pk]),
            reverse("admin:django_venturi_job_history", args=[job.pk]),
        ]
    for entry in JournalEntry.objects.filter(job__in=jobs.values()):
        urls.append(reverse("admin:django_venturi_journalentry_change", args=[entry.pk]))
    return [*urls, reverse("admin:django_venturi_job_stats"), "/admin/django_venturi/periodictask/"]


def assert_nothing_secret(content: str, where: str, secrets: list[str]) -> None:
    assert MARK not in content, where
    for secret in secrets:
        assert secret not in content, (where, secret)


def test_view_only_staff_and_superusers_see_no_secret_of_any_shape_on_any_page(
    admin_client: Client,
) -> None:
    jobs, secrets = run_jobs()
    viewer = staff_with("view_job", "view_journalentry", "view_periodictask")  # nothing else
    for client, who in ((viewer, "viewer"), (admin_client, "superuser")):
        for url in pages(jobs):
            response = client.get(url)
            assert response.status_code == 200, (who, url)
            assert_nothing_secret(response.content.decode(), f"{who} {url}", secrets)
        autocomplete = client.get(
            "/admin/autocomplete/",
            {"app_label": "django_venturi", "model_name": "journalentry", "field_name": "job"}
            | {"term": "secret_shapes"},
        )
        assert len(autocomplete.json()["results"]) == 3
        assert_nothing_secret(autocomplete.content.decode(), f"{who} autocomplete", secrets)
    for action in ("retry_now", "cancel_jobs", "delete_selected"):
        confirmation = act(admin_client, action, list(jobs.values()), confirm=False)
        assert_nothing_secret(confirmation.content.decode(), action, secrets)
    for job in jobs.values():
        delete = admin_client.get(reverse("admin:django_venturi_job_delete", args=[job.pk]))
        assert delete.status_code == 200
        assert_nothing_secret(delete.content.decode(), "delete", secrets)

    # Masked by the type, not hidden wholesale: what is not secret is still shown.
    paused = viewer.get(reverse("admin:django_venturi_job_change", args=[jobs["pause"].pk]))
    page = paused.content.decode()
    assert shape_fields("pause")[1].names[0] in page  # the payload
    assert shape_fields("carry")[1].names[-1] in page  # the carry
    assert "resume with ********" in page  # the carry's note, the token copied into it
    done = viewer.get(reverse("admin:django_venturi_job_change", args=[jobs["complete"].pk]))
    assert shape_fields("complete")[1].names[0] in done.content.decode()  # the result's names
    failed = viewer.get(reverse("admin:django_venturi_job_change", args=[jobs["fail"].pk]))
    assert "ValueError: refused [&#x27;********&#x27;" in failed.content.decode()


def test_searching_for_a_secret_finds_no_job_and_no_run(admin_client: Client) -> None:
    jobs, secrets = run_jobs()
    assert {
        row.pk
        for row in admin_client.get(f"{CHANGELIST}?q=secret_shapes").context["cl"].result_list
    } == {job.pk for job in jobs.values()}
    assert admin_client.get(f"{JOURNAL}?q=ValueError").context["cl"].result_list.count() == 1
    for secret in secrets:
        found = admin_client.get(CHANGELIST, {"q": secret}).context["cl"].result_list
        assert list(found) == [], secret
        assert admin_client.get(JOURNAL, {"q": secret}).context["cl"].result_list.count() == 0
        autocomplete = admin_client.get(
            "/admin/autocomplete/",
            {"app_label": "django_venturi", "model_name": "journalentry", "field_name": "job"}
            | {"term": secret},
        )
        assert autocomplete.json()["results"] == [], secret


@pytest.mark.parametrize(
    "url",
    [
        f"{CHANGELIST}?carry__shape_0__key__startswith=SECRET",
        f"{CHANGELIST}?carry__icontains=SECRET",
        f"{CHANGELIST}?result__token__startswith=SECRET",
        f"{CHANGELIST}?result__icontains=SECRET",
        f"{CHANGELIST}?last_error__icontains=SECRET",
        f"{JOURNAL}?error_message__icontains=SECRET",
        f"{JOURNAL}?traceback__icontains=SECRET",
        f"{JOURNAL}?job__carry__icontains=SECRET",
        f"{JOURNAL}?job__result__icontains=SECRET",
    ],
)
def test_no_filter_from_the_url_tests_a_carry_result_or_error(url: str) -> None:
    assert staff().get(url).status_code == 400  # Django's answer to a lookup it does not allow


def test_a_kind_not_registered_here_shows_no_value_of_its_payload_or_carry(
    admin_client: Client,
) -> None:
    """Its types are unknown in this process: mask rather than leak."""
    job = Job.objects.create(
        kind="tests.registered_elsewhere",
        payload={"api_key": "SECRET-u1", "nested": {"deep": ["SECRET-u2"]}},
        carry={"cursor": "SECRET-u3"},
        result={"copied": "SECRET-u1", "note": "made with SECRET-u2"},
        state="failed",
        attempt=1,
        failures=1,
        finished_at=timezone.now(),
        last_error="ValueError: SECRET-u3 refused",
    )
    entry = JournalEntry.objects.create(
        job=job,
        attempt=1,
        outcome="failed",
        error_type="ValueError",
        error_message="SECRET-u3 refused",
        traceback="Traceback ...\nValueError: SECRET-u1",
    )
    tasks_job = Job.objects.create(kind="tasks:tests.plain", payload={"args": ["plain-argument"]})
    viewer = staff_with("view_job", "view_journalentry")
    for url in (
        reverse("admin:django_venturi_job_change", args=[job.pk]),
        reverse("admin:django_venturi_journalentry_change", args=[entry.pk]),
        CHANGELIST,
        JOURNAL,
    ):
        content = viewer.get(url).content.decode()
        assert_nothing_secret(content, url, [])
    page = viewer.get(reverse("admin:django_venturi_job_change", args=[job.pk])).content.decode()
    assert "api_key" in page and "ValueError: ******** refused" in page
    assert list(admin_client.get(CHANGELIST, {"q": "SECRET-u1"}).context["cl"].result_list) == []
    assert admin_client.get(JOURNAL, {"q": "SECRET-u3"}).context["cl"].result_list.count() == 0
    # Django Tasks jobs hold plain arguments, no secret() fields: shown and searched as stored.
    tasks_page = viewer.get(reverse("admin:django_venturi_job_change", args=[tasks_job.pk]))
    assert "plain-argument" in tasks_page.content.decode()
    found = admin_client.get(CHANGELIST, {"q": "plain-argument"}).context["cl"].result_list
    assert [row.pk for row in found] == [tasks_job.pk]


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_worker_log_line_does_not_quote_a_secret_the_error_quotes(workers: Workers) -> None:
    job = LeakyLogin(user="ada", token="SECRET-logged-token").enqueue()
    result = workers.burst("default", env={"VENTURI_TEST_WORKER_LOG": "1"})
    line = next(line for line in result.stderr.splitlines() if f"job {job.pk} " in line)
    assert " ERROR " in line and line.endswith("401 for https://api.example/login?token=********")
    assert MARK not in result.stderr, line
    job.refresh_from_db()
    assert "SECRET-logged-token" in job.last_error  # stored as raised; hidden when shown
