"""Measure the stats page, its JSON view and the per-kind page with 30 days of roll-ups (not part
of the suite).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
        python -m tests.measure_history_at_scale [--rows 1000000] [--workers 3]

Builds its own database (`venturi_history_scale`), fills the job table as
`measure_admin_at_scale` does (finished jobs and 0.1 % ready, or with
`--backlog` its 7 % ready or running), then the roll-ups of 20 kinds in 3 queues: a
day of minute rows (one per worker, minute, queue and kind, and the depth
samples) and 30 days of hour rows, as workers running all of them all the time
would leave. Then it loads each page and range a few times with Django's test
client and prints the number of queries and the best and median time of each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

DATABASE = "venturi_history_scale" + os.environ.get("VENTURI_TEST_RUN", "")
KINDS = 20
QUEUES = ("default", "mail", "reports")
FINISHED = (949, 998, 999, 1000)
"""`measure_admin_at_scale.fill`'s shares per mille: completed, failed, ready, cancelled."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000, help="Jobs in the job table.")
    parser.add_argument("--workers", type=int, default=3, help="Workers writing minute rows.")
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="Jobs as measure_admin_at_scale has them (7 %% ready or running); by default "
        "they are finished but for 0.1 %% ready, as after months of traffic.",
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="Reuse a filled database.")
    options = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["VENTURI_TEST_DATABASE_NAMES"] = json.dumps({"default": DATABASE})
    import django

    django.setup()
    if not options.keep:
        from tests import measure_admin_at_scale

        measure_admin_at_scale.DATABASE = DATABASE
        shares = measure_admin_at_scale.SHARES if options.backlog else FINISHED
        measure_admin_at_scale.fill(options.rows, shares)
        fill_rollups(options.workers)
    measure(options.repeat)


def _insert(span: str, starts: str, workers: str, where: str = "true") -> str:
    """An INSERT ... SELECT of roll-up rows: every kind in every queue at each start."""
    from django_venturi.models import RUN_COLUMNS, WAIT_COLUMNS

    buckets = ", ".join((*WAIT_COLUMNS, *RUN_COLUMNS))
    # Waits of 4-16 ms and a few of 0.5-1 s; runs of 16-64 ms and a few of 1-2 s.
    values = ", ".join(
        {
            "wait_03": "20 + k",
            "wait_05": "30",
            "wait_10": "2",
            "run_05": "25",
            "run_07": "25 + k",
            "run_11": "1",
        }.get(column, "0")
        for column in (*WAIT_COLUMNS, *RUN_COLUMNS)
    )
    return f"""
        INSERT INTO django_venturi_historyrollup (
            span, start, queue, kind, worker, completed, failed, retried, ready, waiting,
            samples, {buckets})
        SELECT '{span}', start, q, 'tests.kind' || k, worker,
               40 + k, k %% 3, k %% 5, 100 * k, k, 0, {values}
        FROM {starts} AS start, unnest(%(queues)s::text[]) AS q,
             generate_series(1, %(kinds)s) AS k, {workers} AS worker
        WHERE {where}"""


def fill_rollups(workers: int) -> None:
    from django.db import connection

    started = time.perf_counter()
    minutes = (
        "generate_series(date_trunc('minute', now()) - interval '24 hours', "
        "date_trunc('minute', now()), interval '1 minute')"
    )
    hours = (
        "generate_series(date_trunc('hour', now()) - interval '30 days', "
        "date_trunc('hour', now()) - interval '1 hour', interval '1 hour')"
    )
    names = "unnest(%(workers)s::text[])"
    params = {
        "queues": list(QUEUES),
        "kinds": KINDS,
        "workers": [f"worker-{n}" for n in range(workers)],
    }
    with connection.cursor() as cursor:
        cursor.execute(_insert("minute", minutes, names), params)
        cursor.execute(_insert("hour", hours, "(VALUES (''))"), params)
        columns = ("completed", "failed", "retried", "ready", "waiting", *_all_buckets())
        cursor.execute(
            f"""INSERT INTO django_venturi_historyrollup (
                    span, start, queue, kind, worker, samples, {", ".join(columns)})
                SELECT 'minute', start, '', '', '', 1, {", ".join("0" for _ in columns)}
                FROM {minutes} AS start"""
        )
        # The hours' totals rows (`history.derive_hour`): per queue, then the marker's.
        for queue, samples in (("queue", "0"), ("''", "60")):
            cursor.execute(
                f"""INSERT INTO django_venturi_historyrollup (
                        span, start, queue, kind, worker, samples, {", ".join(columns)})
                    SELECT 'hour', start, {queue}, '', '', {samples},
                           {", ".join(f"sum({column})" for column in columns)}
                    FROM django_venturi_historyrollup
                    WHERE span = 'hour' AND kind <> ''
                    GROUP BY start{", queue" if queue == "queue" else ""}"""
            )
        cursor.execute("SELECT count(*) FROM django_venturi_historyrollup")
        row = cursor.fetchone()
        cursor.execute("ANALYZE django_venturi_historyrollup")
    assert row is not None
    print(f"inserted {row[0]:,} roll-up rows in {time.perf_counter() - started:.1f} s")


def _all_buckets() -> tuple[str, ...]:
    from django_venturi.models import RUN_COLUMNS, WAIT_COLUMNS

    return (*WAIT_COLUMNS, *RUN_COLUMNS)


def measure(repeat: int) -> None:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    setup_test_environment()
    user = User.objects.filter(username="scale").first() or User.objects.create_superuser(
        "scale", password="x"
    )
    client = Client()
    client.force_login(user)
    pages: dict[str, str] = {}
    for range_name in ("1h", "24h", "7d", "30d"):
        pages[f"stats page, {range_name}"] = f"stats/?range={range_name}"
    pages["stats page, 30d, queue=mail"] = "stats/?range=30d&queue=mail"
    for range_name in ("1h", "30d"):
        pages[f"JSON view, {range_name}"] = f"stats/history/?range={range_name}"
    for range_name in ("1h", "24h", "7d", "30d"):
        pages[f"kind page, {range_name}"] = f"kinds/tests.kind7/?range={range_name}"
    print(f"{'page':30} {'queries':>7} {'best ms':>8} {'median ms':>9}")
    for label, suffix in pages.items():
        url = "/admin/django_venturi/job/" + suffix
        timings = []
        for _ in range(repeat):
            with CaptureQueriesContext(connection) as captured:
                started = time.perf_counter()
                response = client.get(url)
                timings.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (url, response.status_code)
        print(
            f"{label:30} {len(captured.captured_queries):>7} {min(timings):>8.1f}"
            f" {statistics.median(timings):>9.1f}"
        )


if __name__ == "__main__":
    main()
