"""Concurrency caps: at most N jobs of a kind (or of each value of a payload field)
running at once, across every worker and host.

The database keeps the count: a job holds its place while it is `running`, from
its claim to its verdict. Claims of capped kinds take the claims' advisory lock
first and count the running jobs after it (`claim.py`, `claim_statement.py`),
so two workers claiming at the same instant cannot both take the last place.
A capped job is only claimed into an idle handler slot, never into the local
buffer, where it would hold its place without running.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from django.db import connections
from django.db.models import Case, Expression, F, Func, TextField, Value, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce
from django.db.models.lookups import Exact


@dataclasses.dataclass(frozen=True, slots=True)
class Concurrency:
    """At most `limit` jobs of a task running at once, across all workers and hosts.

    With `key`, the cap holds for each value of that payload field apart (each
    account gets its own `limit`). Jobs over the cap stay ready, without an attempt.
    `concurrency=N` on `@venturi.task` is `Concurrency(N)`.
    """

    limit: int
    key: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.limit, int) or isinstance(self.limit, bool) or self.limit < 1:
            raise ValueError(f"Concurrency limit must be a positive int, got {self.limit!r}")
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise ValueError(f"Concurrency key must be a payload field's name, got {self.key!r}")

    def describe(self) -> str:
        """`2`, `2 per account_id`."""
        return str(self.limit) if self.key is None else f"{self.limit} per {self.key}"


def field_text(field: str | None, payload: Mapping[str, Any] | Any) -> str:
    """A payload field's value as a key: as PostgreSQL's `payload ->> field` gives it.

    A string as it is, any other JSON value in its JSON form, a missing field or
    null as "" (and "" for every job without a `field`).
    """
    if field is None or not isinstance(payload, Mapping):
        return ""
    value = payload.get(field)
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def payload_key(alias: str, field: str) -> Expression:
    """`field_text` in SQL, for the ORM: the payload field as text, a missing field or
    null as "" (what the claim off PostgreSQL and the stats filter and count by)."""
    # Cast: a key transform's own lookups would compare JSON, not text.
    text = Coalesce(
        Cast(KeyTextTransform(field, "payload"), output_field=TextField()),
        Value(""),
        output_field=TextField(),
    )
    if connections[alias].vendor != "sqlite":
        return text
    # SQLite's key transform gives a JSON null as 'null' (PostgreSQL's ->> gives NULL);
    # its JSON_TYPE tells that null from a string 'null'.
    json_type = Func(
        F("payload"),
        Value(f"$.{json.dumps(field)}"),  # as the key transform quotes a field
        function="JSON_TYPE",
        output_field=TextField(),
    )
    return Case(
        When(Exact(json_type, Value("null")), then=Value("")),
        default=text,
        output_field=TextField(),
    )
