"""The codec's msgspec fast path agrees with the hand-written path, or leaves it the verdict.

For every pair of a field type and a value, the fast path must either give exactly
what the hand-written path gives (the same JSON, the same decoded value) or
decline; it must never accept what the hand-written path refuses.
"""

import dataclasses
import datetime as dt
import decimal
import enum
import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_venturi.payloads import codec
from django_venturi.payloads import fast as fast_path
from tests.test_codec import full_payload
from tests.testapp.tasks import Address, AllTypes


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.Flag):
    READ = 1
    WRITE = 2


class Mixed(enum.Enum):
    ONE = 1
    TWO = "two"


class Clock(dt.datetime):
    """A datetime subclass, as freezegun and pendulum make."""


HINTS: list[Any] = [
    str,
    int,
    float,
    bool,
    None,
    dt.datetime,
    dt.date,
    dt.time,
    dt.timedelta,
    decimal.Decimal,
    uuid.UUID,
    Colour,
    Level,
    Perm,
    Mixed,
    Address,
    list[str],
    list[int],
    list[dt.datetime],
    list[Address],
    tuple[str, int],
    tuple[int, ...],
    tuple[dt.date, ...],
    dict[str, int],
    dict[str, dt.timedelta],
    dict[str, list[Address | None]],
    str | None,
    int | None,
    dt.datetime | None,
    Address | None,
    int | str,
    Any,
    list[Any],
]

UTC_NOON = dt.datetime(2026, 3, 4, 12, 0, tzinfo=dt.UTC)
VALUES: list[Any] = [
    "",
    "plain",
    "héllo ✓",
    "a\x00b",
    "é\x00",
    "\udc80",
    "x\ud83d",
    "\\u0000",
    0,
    -1,
    2**63 - 1,
    2**63,
    -(2**63) - 1,
    10**4299,
    10**4300,
    True,
    False,
    0.0,
    -2.5,
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    None,
    UTC_NOON,
    UTC_NOON.replace(microsecond=123456),
    dt.datetime(2026, 3, 4, 12, 0),
    dt.datetime(2026, 3, 4, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30, seconds=15))),
    Clock(2026, 3, 4, tzinfo=dt.UTC),
    dt.date(2026, 3, 4),
    dt.time(1, 2, 3, 4),
    dt.time(1, 2, tzinfo=dt.UTC),
    dt.timedelta(days=-3, microseconds=1),
    dt.timedelta(0),
    decimal.Decimal("1.10"),
    decimal.Decimal("NaN"),
    decimal.Decimal("-0E+3"),
    uuid.UUID(int=7),
    Colour.RED,
    Level.HIGH,
    Perm.READ | Perm.WRITE,
    Mixed.TWO,
    Address("Main", 1),
    Address("Main\x00", 1),
    Address(3),  # type: ignore[arg-type]
    {"street": "Main", "zip_code": 1},
    ["a", "b"],
    ["a", "b\x00"],
    [1, 2],
    [1, True],
    [UTC_NOON],
    [Address("a")],
    [{"street": "a"}],
    [None, Address("b")],
    ("a", 1),
    ("a", "b"),
    (1, 2, 3),
    (dt.date(2026, 1, 1),),
    {"a", "b"},
    frozenset({1}),
    {"a": 1},
    {"a": dt.timedelta(seconds=1)},
    {"a": [Address("x"), None]},
    {"a\x00": 1},
    {"\udc80": 1},
    {1: 1},
    {"a": True},
    "2026-03-04T12:00:00+00:00",
    "red",
    "12345678-1234-5678-1234-567812345678",
    "1.5",
]


def slow_encode(value: Any, hint: Any) -> Any:
    return codec._encode(value, hint, "value")


def slow_decode(hint: Any, data: Any) -> Any:
    return codec._decode(hint, data, "value")


def same(left: Any, right: Any) -> bool:
    """Equal as Python values and as JSON text (NaN and -0.0 included)."""
    return (
        type(left) is type(right)
        and json.dumps(left) == json.dumps(right)
        and (left == right or left != left)
    )


def shown(value: Any) -> str:
    """`repr`, even of an integer too long for it."""
    try:
        return repr(value)
    except ValueError:
        return f"<int of {value.bit_length()} bits>"


def check_encode(value: Any, hint: Any) -> None:
    try:
        expected = slow_encode(value, hint)
    except Exception:  # a PayloadError, or whatever the slow path lets out
        assert fast_path.encode(value, hint) is fast_path.UNDECIDED, (hint, shown(value))
        return
    fast = fast_path.encode(value, hint)
    if fast is not fast_path.UNDECIDED:
        assert same(fast, expected), (hint, shown(value), shown(fast), shown(expected))


def check_decode(hint: Any, data: Any) -> None:
    try:
        expected = slow_decode(hint, data)
    except Exception:  # a PayloadError, or whatever the slow path lets out
        assert fast_path.decode(hint, data) is fast_path.UNDECIDED, (hint, shown(data))
        return
    fast = fast_path.decode(hint, data)
    if fast is not fast_path.UNDECIDED:
        assert type(fast) is type(expected), (hint, shown(data), shown(fast))
        assert shown(fast) == shown(expected), (hint, shown(data), shown(fast))


@pytest.mark.parametrize("hint", HINTS, ids=repr)
def test_the_fast_path_encodes_as_the_slow_path_or_declines(hint: Any) -> None:
    for value in VALUES:
        check_encode(value, hint)


STORED: list[Any] = [
    *VALUES,
    "2026-03-04T12:00:00.1234567+00:00",  # msgspec rounds past microseconds, Python cuts
    "2026-03-04T12:00:00.9999996",
    "12:00:00.9999996",
    "2026-03-04t12:00:00z",
    "2026-03-04 12:00:00",
    "2026-03-04T12:00",
    "20260304",
    "2026-W10-3",
    "{12345678-1234-5678-1234-567812345678}",
    "12345678123456781234567812345678",
    " 1_000.50 ",
    "sNaN",
    "blue",
    "two",
    1,
    3,
    2,
    10**30,
    [1, 2],
    ["a", 1],
    ["2026-03-04", "x"],
    {"street": "Main"},
    {"street": "Main", "zip_code": None},
    {"street": "Main", "zip_code": True},
    {"street": "Main", "other": 1},
    {"zip_code": 1},
    [{"street": "a"}, None],
    {"a": [{"street": "a"}, None]},
    {"a": [("not", "an", "object")]},
    {"__union__": 0, "value": 1},
    -86_400_000_000 * 999_999_999,
    86_400_000_000 * 1_000_000_000,
]


@pytest.mark.parametrize("hint", HINTS, ids=repr)
def test_the_fast_path_decodes_as_the_slow_path_or_declines(hint: Any) -> None:
    for data in STORED:
        check_decode(hint, data)


def test_every_type_of_a_payload_round_trips_on_the_fast_path() -> None:
    """The usual payload never falls back: the fast path is really used."""
    original = full_payload()
    encoded = fast_path.encode(original, AllTypes)
    assert encoded is not fast_path.UNDECIDED
    assert json.dumps(encoded) == json.dumps(codec._encode_dataclass(original, AllTypes, "A"))
    stored = json.loads(json.dumps(encoded))
    assert fast_path.decode(AllTypes, stored) == original


def test_the_stored_json_of_each_type_is_unchanged() -> None:
    """The JSON written before msgspec, byte for byte: existing rows still decode."""
    stored = json.dumps(codec.encode(full_payload()))
    assert stored == (
        '{"text": "h\\u00e9llo", "number": -42, "ratio": 2.5, "flag": true, '
        '"nothing": null, "items": [1, 2, 3], "mapping": {"a": 1.5}, "pair": ["x", 7], '
        '"when": "2026-12-02T15:30:01.123456+00:00", "day": "2026-02-28", '
        '"clock": "23:59:58.000999", "span": 34560000000007, '
        '"amount": "12345678901234567890.000000001", '
        '"ident": "12345678-1234-5678-1234-567812345678", "colour": "blue", '
        '"address": {"street": "Main St", "zip_code": 1234}, "maybe": "present", '
        '"addresses": [{"street": "a", "zip_code": null}, {"street": "b", "zip_code": null}]}'
    )
    assert codec.decode(AllTypes, json.loads(stored)) == full_payload()


def test_an_int_given_for_a_float_is_stored_as_a_float() -> None:
    @dataclasses.dataclass
    class Ratio:
        value: float

    assert json.dumps(codec.encode(Ratio(3))) == '{"value": 3.0}'


@dataclasses.dataclass
class Checked:
    value: int
    when: dt.date

    def __post_init__(self) -> None:
        if self.value < 0:
            raise ValueError("value must not be negative")


def test_a_dataclass_whose_init_raises_raises_the_same_on_decode() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        codec.decode(Checked, {"value": -1, "when": "2026-01-01"})


@dataclasses.dataclass
class Tree:
    label: str
    children: "list[Tree]" = dataclasses.field(default_factory=list)


def test_types_the_fast_path_cannot_mirror_use_the_slow_path() -> None:
    for hint in (Any, list[Any], int | str, Perm, Mixed, Tree):
        assert fast_path._node(hint) is None, hint
    tree = Tree("a", [Tree("b")])
    assert codec.decode(Tree, json.loads(json.dumps(codec.encode(tree)))) == tree


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.sampled_from(["2026-03-04T12:00:00+00:00", "red", "12:00", "2026-03-04"]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["street", "zip_code", "a", "x"]), children, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(hint=st.sampled_from(HINTS), data=JSON_VALUES)
def test_any_stored_json_decodes_as_the_slow_path_or_declines(hint: Any, data: Any) -> None:
    check_decode(hint, data)


def value_at(index: int) -> Any:
    """`VALUES[index]`, for a strategy: some of them have no repr."""
    return VALUES[index]


PYTHON_VALUES = st.recursive(
    st.integers(0, len(VALUES) - 1).map(value_at)
    | st.text()
    | st.integers()
    | st.floats()
    | st.datetimes(timezones=st.none() | st.timezones())
    | st.decimals()
    | st.uuids(),
    lambda children: (
        st.lists(children, max_size=3)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=3), children, max_size=3)
        | st.builds(Address, children, children)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(hint=st.sampled_from(HINTS), value=PYTHON_VALUES)
def test_any_value_encodes_as_the_slow_path_or_declines(hint: Any, value: Any) -> None:
    check_encode(value, hint)
