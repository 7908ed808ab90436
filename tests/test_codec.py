import dataclasses
import datetime as dt
import decimal
import json
import uuid

import pytest

import django_venturi as venturi
from django_venturi.payloads import codec
from django_venturi.payloads.codec import PayloadError
from tests.testapp.tasks import Address, AllTypes, Colour


def full_payload() -> AllTypes:
    return AllTypes(
        text="héllo",
        number=-42,
        ratio=2.5,
        flag=True,
        nothing=None,
        items=[1, 2, 3],
        mapping={"a": 1.5},
        pair=("x", 7),
        when=dt.datetime(2026, 12, 2, 15, 30, 1, 123456, tzinfo=dt.UTC),
        day=dt.date(2026, 2, 28),
        clock=dt.time(23, 59, 58, 999),
        span=dt.timedelta(days=400, microseconds=7),
        amount=decimal.Decimal("12345678901234567890.000000001"),
        ident=uuid.UUID("12345678-1234-5678-1234-567812345678"),
        colour=Colour.BLUE,
        address=Address("Main St", 1234),
        maybe="present",
        addresses=[Address("a"), Address("b", None)],
    )


def test_round_trip_of_every_supported_type_through_json() -> None:
    original = full_payload()
    stored = json.loads(json.dumps(codec.encode(original)))
    assert codec.decode(AllTypes, stored) == original


def test_optional_fields_round_trip_as_none() -> None:
    original = dataclasses.replace(full_payload(), maybe=None)
    assert codec.decode(AllTypes, codec.encode(original)).maybe is None


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"number": "42"}, "AllTypes.number: expected int, got str"),
        ({"flag": 1}, "AllTypes.flag: expected bool, got int"),
        ({"number": True}, "AllTypes.number: expected int, got bool"),
        ({"items": [1, "2"]}, "AllTypes.items[1]: expected int, got str"),
        ({"address": Address(street=3)}, "AllTypes.address.street: expected str, got int"),  # type: ignore[arg-type]
        ({"day": dt.datetime(2026, 1, 1)}, "AllTypes.day: expected date, got datetime"),
        ({"ratio": float("nan")}, "AllTypes.ratio: NaN and infinity are not valid JSON"),
        ({"colour": "red"}, "AllTypes.colour: expected Colour, got str"),
        ({"pair": ("x",)}, "AllTypes.pair: expected 2 items, got 1"),
    ],
)
def test_a_value_that_does_not_fit_names_its_field(change: dict[str, object], path: str) -> None:
    bad = dataclasses.replace(full_payload(), **change)
    with pytest.raises(PayloadError) as raised:
        codec.encode(bad)
    assert str(raised.value) == path


def test_decoding_a_row_that_no_longer_fits_names_the_field() -> None:
    stored = codec.encode(full_payload())
    stored["number"] = "not a number"
    with pytest.raises(PayloadError, match=r"AllTypes\.number: expected int, got str"):
        codec.decode(AllTypes, stored)
    del stored["number"]
    with pytest.raises(PayloadError, match=r"AllTypes\.number: missing"):
        codec.decode(AllTypes, stored)


def test_decoding_refuses_unknown_fields() -> None:
    stored = codec.encode(full_payload())
    stored["__class__"] = "os.system"
    with pytest.raises(PayloadError, match="unknown field"):
        codec.decode(AllTypes, stored)


def test_unions_of_several_types_are_tagged_and_exact() -> None:
    @dataclasses.dataclass
    class Either:
        value: int | str

    for value in (3, "3"):
        assert codec.decode(Either, json.loads(json.dumps(codec.encode(Either(value))))) == Either(
            value
        )
    with pytest.raises(PayloadError, match=r"Either\.value: expected int \| str, got float"):
        codec.encode(Either(2.5))  # type: ignore[arg-type]


def test_unsupported_types_are_refused_at_encode() -> None:
    @dataclasses.dataclass
    class Odd:
        value: set[int]

    with pytest.raises(PayloadError, match=r"Odd\.value: type .* is not supported"):
        codec.encode(Odd({1}))


@dataclasses.dataclass
class Credentials:
    user: str
    password: str = venturi.secret()


@dataclasses.dataclass
class Login:
    site: str
    api_key: str = venturi.secret(default="")
    credentials: list[Credentials] = dataclasses.field(default_factory=list)


def test_secret_fields_are_masked_at_any_depth() -> None:
    stored = codec.encode(Login("example.org", "k-123", [Credentials("ann", "hunter2")]))
    assert stored["api_key"] == "k-123"  # stored as is: masking is for screens and logs
    shown = codec.masked(Login, stored)
    assert shown == {
        "site": "example.org",
        "api_key": codec.MASK,
        "credentials": [{"user": "ann", "password": codec.MASK}],
    }
    assert "hunter2" not in json.dumps(shown) and "k-123" not in json.dumps(shown)


@dataclasses.dataclass
class Team:
    """No secret of its own: one sits two levels down, in a dict of lists."""

    name: str
    members: dict[str, list[Credentials | None]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Tree:
    label: str
    children: list["Tree"] = dataclasses.field(default_factory=list)


def test_holds_secrets_looks_at_every_depth() -> None:
    """The admin leaves the payload of such kinds out of its search."""
    assert codec.holds_secrets(Login) and codec.holds_secrets(Credentials)
    assert codec.holds_secrets(Team)
    assert not codec.holds_secrets(Address)
    assert not codec.holds_secrets(Tree)  # a recursive type ends


def test_errors_about_secret_fields_do_not_show_the_value() -> None:
    with pytest.raises(PayloadError) as raised:
        codec.encode(Login("example.org", api_key=12345))  # type: ignore[arg-type]
    assert "12345" not in str(raised.value) and "Login.api_key" in str(raised.value)
    with pytest.raises(PayloadError) as raised:
        codec.decode(Credentials, {"user": "ann", "password": ["hunter2"]})
    assert "hunter2" not in str(raised.value)
