"""The history on the admin's pages: the charts of the stats and per-kind pages, their JSON view.

Every figure comes from the roll-ups (`observe/history.py`), never from a scan
of the job table. The range (`?range=1h|24h|7d|30d`) and the filters
(`?queue=`, `?kind=`) are GET parameters, so each view is a link; the JSON view
takes the same ones and returns the figures and the charts, which the pages'
small inline script swaps in every few seconds while they are open. Without
JavaScript the pages work the same, refreshed by a reload or `?refresh=`.
"""

from __future__ import annotations

import reprlib
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, JsonResponse, QueryDict

from django_venturi.admin import charts
from django_venturi.conf import venturi_settings
from django_venturi.observe.history import DEFAULT_RANGE, RANGES, History, read_history
from django_venturi.payloads import text
from django_venturi.store import history

REFRESH_EVERY_MS = 5000
"""How often the inline script fetches the figures while the page is open."""
NAME_LIMIT = 200
"""The longest queue or kind name a filter takes (the columns' length)."""


def chosen_range(request: HttpRequest) -> str:
    """`?range=`: one of `RANGES`; anything else is said in a message, and 1 h shown."""
    value = request.GET.get("range", "")
    if not value or value in RANGES:
        return value or DEFAULT_RANGE
    messages.warning(
        request,
        f"range: expected one of {', '.join(RANGES)}, got {reprlib.repr(value)}; "
        f"showing {RANGES[DEFAULT_RANGE].label}.",
        fail_silently=True,
    )
    return DEFAULT_RANGE


def chosen_filter(request: HttpRequest, name: str) -> str | None:
    """`?queue=` or `?kind=`: a name, or None (all). A name too long to exist is said."""
    value = request.GET.get(name, "").strip()
    wrong = name_problem(value)
    if wrong:
        messages.warning(request, f"{name}: {wrong}; showing every {name}.", fail_silently=True)
        return None
    return value or None


def name_problem(value: str) -> str | None:
    """Why `value` can be no queue's or kind's name (too long, a character the database
    refuses), or None."""
    if len(value) > NAME_LIMIT:
        return f"expected a name of at most {NAME_LIMIT} characters, got {reprlib.repr(value)}"
    unstorable = text.problem(value)
    return None if unstorable is None else f"{reprlib.repr(value)} {unstorable}"


def history_context(request: HttpRequest, *, kind: str | None = None) -> dict[str, Any]:
    """The charts, totals, range switch and filter links of a page."""
    range_name = chosen_range(request)
    queue = chosen_filter(request, "queue")
    fixed_kind = kind is not None
    kind = kind if fixed_kind else chosen_filter(request, "kind")
    found = read_history(venturi_settings.DATABASE, range_name, queue=queue, kind=kind)
    asked = {"range": range_name, "queue": queue, "kind": kind}
    return {
        "history": found,
        "history_query": "?" + urlencode({k: v for k, v in asked.items() if v is not None}),
        "fixed_kind": fixed_kind,
        "failure_rate_text": f"{100 * found.failure_rate:.1f}%",
        "history_charts": charts.charts(found),
        "history_seconds": _seconds(found),
        "ranges": [
            {"name": r.name, "label": r.label, "query": _query(request, range=r.name)}
            for r in RANGES.values()
        ],
        "queue_links": [
            {"name": name, "query": _query(request, queue=name)} for name in _queues(found)
        ],
        "all_queues_query": _query(request, queue=None),
        "all_kinds_query": _query(request, kind=None),
        "refresh_every_ms": REFRESH_EVERY_MS,
    }


def _seconds(found: History) -> dict[str, str]:
    """The range's percentiles as words ("12 ms"; "-" when no run counted)."""
    names = ("wait_p50", "wait_p95", "run_p50", "run_p95")
    return {
        name: "-" if value is None else charts.seconds(value)
        for name in names
        for value in [getattr(found, name)]
    }


def _queues(found: History) -> list[str]:
    """The filter's links: the queues with figures in the last hour, and the chosen one."""
    recent = history.recent_queues(venturi_settings.DATABASE, found.points[-1].start)
    return sorted(recent | ({found.queue} if found.queue else set()))


def _query(request: HttpRequest, **changes: str | None) -> str:
    """The page's query string with these parameters set (None: removed)."""
    query: QueryDict = request.GET.copy()
    for name, value in changes.items():
        if value is None:
            query.pop(name, None)
        else:
            query[name] = value
    encoded = query.urlencode()
    return f"?{encoded}" if encoded else "?"


def history_json(request: HttpRequest) -> JsonResponse:
    """The figures and charts of `?range=&queue=&kind=` (the caller checked the permission)."""
    context = history_context(request)
    found: History = context["history"]
    return JsonResponse(
        {
            **found.as_dict(),
            "seconds": context["history_seconds"],
            "failure_rate_text": context["failure_rate_text"],
            "charts": {name: str(svg) for name, svg in context["history_charts"].items()},
        }
    )
