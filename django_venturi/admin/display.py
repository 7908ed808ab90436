"""Small formatting helpers the admin's pages share: times, ages, cut cells, JSON.

Times to the second (`compact_time`, `date_over_time`, the `to_the_second`
columns and their `help_texts`), short ages (`short_age`), a run's duration
(`run_duration`), a job's progress on one line (`progress_text`), a list cell
cut with an ellipsis (`cut`), an error cut between words and unfolded by a click
(`error_cell`), pretty JSON and "1 job"/"2 jobs". They read a row and return
text or safe HTML; none queries the database.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.db.models import Field
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_venturi.models import Job, JournalEntry
from django_venturi.payloads.stored import READ_ERRORS, Unreadable, unreadable


def compact_time(moment: datetime | None) -> str:
    """`2026-05-04 13:07:59` in the current time zone: sortable by eye, one line wide."""
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def date_over_time(moment: datetime | None) -> SafeString | str:
    """`compact_time` on two lines, date over time: half as wide, for a list's column."""
    date, _, time = compact_time(moment).partition(" ")
    return format_html("{}<br>{}", date, time) if time else "-"


def model_field(model: type[Job] | type[JournalEntry], name: str) -> Field[Any, Any]:
    """A concrete field of the model (not a relation's reverse side)."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field), name
    return field


def to_the_second(model: type[Job] | type[JournalEntry], field: str) -> Callable[[Any, Any], str]:
    """A read-only admin column showing a datetime field to the second (`compact_time`).

    Django shows datetimes in `DATETIME_FORMAT`, "Dec. 3, 2026, 9 a.m.", without
    the seconds (or even the minutes) that a job's times are about.
    """

    @admin.display(description=model_field(model, field).verbose_name, ordering=field)
    def show(model_admin: Any, obj: Any) -> str:
        return compact_time(getattr(obj, field)) or "-"

    show.__name__ = f"{field}_text"
    return show


def help_texts(model: type[Job], fields: Sequence[str]) -> dict[str, str]:
    """The model's help texts, for the `to_the_second` columns of those fields."""
    found = {name: str(model_field(model, name).help_text) for name in fields}
    return {f"{name}_text": text for name, text in found.items() if text}


def short_age(delta: timedelta) -> str:
    """`42s`, `5m 03s`, `2h 10m`, `3d 4h`: readable at a glance in a narrow column."""
    seconds = int(delta.total_seconds())
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def run_duration(entry: JournalEntry) -> str:
    """`0.125 s`: the handler's run, from its start to the verdict."""
    if entry.started_at is None or entry.finished_at is None:
        return "-"
    return f"{(entry.finished_at - entry.started_at).total_seconds():.3f} s"


def cut(text: str, *, title: str | None = None) -> SafeString:
    """A list cell's text, cut with an ellipsis by the style sheet; the whole of it on hover."""
    return format_html('<span class="venturi-cut" title="{}">{}</span>', title or text, text)


ERROR_SHOWN = 160
"""An error cell shows at most about this many characters, cut between words."""


def cut_between_words(text: str, limit: int = ERROR_SHOWN) -> str:
    """`text` on one line, cut at the last space before `limit` with an ellipsis.

    A single word longer than `limit` (a URL, a path) is cut inside it: nothing else
    keeps the cell readable.
    """
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    head = line[: limit + 1]
    space = head.rfind(" ")
    return (head[:space] if space > limit // 2 else line[:limit]).rstrip(" ,;:.") + "…"


def error_cell(summary: str, whole: str) -> SafeString:
    """An error's `Type: message`, cut between words, and the whole text on hover and
    unfolded by a click (a `<details>`), which needs no script."""
    shown = cut_between_words(summary)
    if shown == whole.strip():
        return format_html('<span class="venturi-error" title="{}">{}</span>', whole, shown)
    return format_html(
        '<details class="venturi-error" title="{}"><summary>{}</summary><pre>{}</pre></details>',
        whole,
        shown,
        whole,
    )


def jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


def pretty_json(value: Any) -> SafeString:
    """Indented JSON; a notice instead for a stored value Python cannot read or show."""
    if isinstance(value, Unreadable):
        return unreadable_notice(value)
    try:
        shown = json.dumps(value, indent=2, sort_keys=True)
    except READ_ERRORS as error:  # readable, but too deep to write out again here
        return unreadable_notice(unreadable(error))
    return format_html("<pre>{}</pre>", shown)


def unreadable_notice(value: Unreadable) -> SafeString:
    return format_html(
        '<div class="venturi-unreadable">The stored value cannot be read back: {}</div>',
        value.reason,
    )


def progress_text(progress: object) -> str:
    """`ctx.progress()` as one short line: "40 / 100 (40%) resizing images".

    A row written by other means (SQL, another program) may hold anything there: a
    `done` that is not a number shows as it is, without a percentage, and never fails
    the list.
    """
    if not isinstance(progress, dict):
        return "-"
    done, total, note = progress.get("done"), progress.get("total"), progress.get("note") or ""
    text = f"{done}"
    if isinstance(total, int | float) and total:
        text += f" / {total}"
        if done is None or isinstance(done, int | float):
            with contextlib.suppress(OverflowError):  # integers past float's range
                text += f" ({100 * float(done or 0) / total:.0f}%)"
    return f"{text} {note}".strip()
