"""Server-rendered SVG charts of a history range: stacked bars and lines, no JavaScript.

The marks are built with f-strings, not `format_html` (a 30-day page has a
thousand of them, and `format_html` cost most of its time): they hold numbers,
the series' own class names and text passed through `escape`.

Each chart is one `<svg>` element built here, so that the page and its JSON view
(which the page's small script swaps in while the page is open) draw the same.
Every bar and every point has a `<title>`: hovering it tells its figures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from django.utils import timezone
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_venturi.observe.history import History, Point

WIDTH = 600
HEIGHT = 120
TOP = 16
"""Room above the plot for the scale's label."""
AXIS = 16
"""Room under the plot for the time ticks."""
TICKS = 6
BAR_SERIES = (("failed", "failed jobs"), ("retried", "retried runs"), ("completed", "completed"))
"""Stacked from the bottom up, as the last hour's chart stacks them."""


def charts(found: History) -> dict[str, SafeString]:
    """Every chart of the range: throughput, depth, wait time and run time."""
    return {
        "throughput": bars(found),
        "depth": lines(found, (("ready", "ready"), ("waiting", "waiting")), jobs_value),
        "wait": lines(found, (("wait_p50", "wait p50"), ("wait_p95", "wait p95")), seconds),
        "run": lines(found, (("run_p50", "run p50"), ("run_p95", "run p95")), seconds),
    }


def seconds(value: float) -> str:
    """A time in the unit that reads best: 850 µs, 12 ms, 3.4 s, 5.2 min, 2.1 h."""
    if value < 0.001:
        return f"{value * 1_000_000:.0f} µs"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def jobs_value(value: float) -> str:
    return f"{value:.0f} jobs" if value >= 10 or value == int(value) else f"{value:.1f} jobs"


def _when(found: History, start: datetime) -> str:
    local = timezone.localtime(start)
    return f"{local:%H:%M}" if found.range.step.total_seconds() < 3600 else f"{local:%m-%d %H:%M}"


def _frame(found: History, body: SafeString, label: str, scale: str) -> SafeString:
    """The `<svg>` around a chart's marks: the base line, time ticks and the scale."""
    step = WIDTH / len(found.points)
    every = max(len(found.points) // TICKS, 1)
    ticks = format_html_join(
        "",
        '<text x="{}" y="{}" font-size="10" fill="#666">{}</text>',
        (
            (round(index * step, 1), TOP + HEIGHT + 12, _when(found, point.start))
            for index, point in enumerate(found.points)
            if index % every == 0
        ),
    )
    return format_html(
        '<svg class="venturi-chart" role="img" aria-label="{}" width="{}" height="{}" '
        'viewBox="0 0 {} {}">{}<line x1="0" y1="{}" x2="{}" y2="{}" stroke="#999"></line>{}'
        '<text x="4" y="11" font-size="11" fill="#666">{}</text></svg>',
        label,
        WIDTH,
        TOP + HEIGHT + AXIS,
        WIDTH,
        TOP + HEIGHT + AXIS,
        body,
        TOP + HEIGHT,
        WIDTH,
        TOP + HEIGHT,
        ticks,
        scale,
    )


def bars(found: History) -> SafeString:
    """Completed, retried and failed per step, stacked; scaled to the busiest step."""
    busiest = max((p.completed + p.failed + p.retried for p in found.points), default=0)
    scale = HEIGHT / busiest if busiest else 0.0
    step = WIDTH / len(found.points)
    marks = []
    for index, point in enumerate(found.points):
        base = float(TOP + HEIGHT)
        rects = []
        for name, _ in BAR_SERIES:
            height = round(getattr(point, name) * scale, 1)
            base -= height
            rects.append(
                f'<rect class="{name}" x="{round(index * step, 1)}" y="{round(base, 1)}" '
                f'width="{round(max(step - 1, 1), 1)}" height="{height}"></rect>'
            )
        marks.append(
            f"<g><title>{escape(_when(found, point.start))}: {point.completed} completed, "
            f"{point.failed} failed jobs; {point.retried} retried runs</title>{''.join(rects)}</g>"
        )
    label = f"busiest: {busiest} runs per {_step_words(found)}" if busiest else "no runs"
    body = mark_safe("".join(marks))  # noqa: S308 - numbers, class names and escaped text
    return _frame(found, body, f"Runs per {_step_words(found)}", label)


def _step_words(found: History) -> str:
    minutes = int(found.range.step.total_seconds() // 60)
    if minutes < 60:
        return "minute" if minutes == 1 else f"{minutes} minutes"
    return "hour" if minutes == 60 else f"{minutes // 60} hours"


def lines(
    found: History,
    series: Sequence[tuple[str, str]],
    show: Callable[[float], str],
) -> SafeString:
    """One line per series, broken where a step has no value; scaled to the largest."""
    values = [[getattr(point, name) for point in found.points] for name, _ in series]
    largest = max((v for row in values for v in row if v is not None), default=None)
    step = WIDTH / len(found.points)
    marks = []
    for (name, label), row in zip(series, values, strict=True):
        marks.append(_line(found.points, row, name, label, step, largest or 1.0, show))
    body = mark_safe("".join(marks))  # noqa: S308 - numbers, class names and escaped text
    words = ", ".join(label for _, label in series)
    scale = f"top: {show(largest)}" if largest is not None else "no figures in this range"
    return _frame(found, body, words, scale)


def _line(
    points: Sequence[Point],
    row: Sequence[float | None],
    name: str,
    label: str,
    step: float,
    largest: float,
    show: Callable[[float], str],
) -> str:
    """A series' polylines (one per run of steps with values) and a dot per value."""
    runs: list[list[tuple[float, float]]] = [[]]
    dots = []
    for index, value in enumerate(row):
        if value is None:
            runs.append([])
            continue
        x = round(index * step + step / 2, 1)
        y = round(TOP + HEIGHT - value / largest * HEIGHT, 1)
        runs[-1].append((x, y))
        when = timezone.localtime(points[index].start)
        title = escape(f"{when:%m-%d %H:%M} {label}: {show(value)}")
        dots.append(
            f'<circle class="{name}" cx="{x}" cy="{y}" r="2"><title>{title}</title></circle>'
        )
    polylines = [
        f'<polyline class="{name}" fill="none" points="{" ".join(f"{x},{y}" for x, y in run)}">'
        "</polyline>"
        for run in runs
        if len(run) > 1
    ]
    return "".join(polylines) + "".join(dots)
