"""Measure the job admin on 1,000,000 jobs: queries and time per page (not part of the suite).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
        python -m tests.measure_admin_at_scale [--rows 1000000]
        python -m tests.measure_admin_at_scale --keep --database venturi_history_scale

Builds its own database (`venturi_admin_scale`), fills it with `generate_series`
(most jobs finished, some failed with an error of one of three types, some ready
and running, ten kinds, three queues), then loads each admin page a few times
with Django's test client and prints the number of queries and the best and
median time of each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta
from urllib.parse import quote

DATABASE = "venturi_admin_scale" + os.environ.get("VENTURI_TEST_RUN", "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="Reuse a filled database.")
    parser.add_argument(
        "--database",
        default=DATABASE,
        help="The database to fill or, with --keep, to measure (another script's, such as "
        "measure_history_at_scale's, measured as it left it).",
    )
    options = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["VENTURI_TEST_DATABASE_NAMES"] = json.dumps({"default": options.database})
    import django

    django.setup()
    if not options.keep:
        fill(options.rows, database=options.database)
    measure(options.repeat)


SHARES = (850, 900, 950, 980)
"""Per mille of the jobs: below the first completed, then failed, ready, cancelled, and
the rest running."""


def fill(
    rows: int, shares: tuple[int, int, int, int] = SHARES, *, database: str | None = None
) -> None:
    import psycopg
    from django.core.management import call_command
    from django.db import connection

    from tests.database import postgres_url

    with psycopg.connect(postgres_url(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {database or DATABASE}")
        admin.execute(f"CREATE DATABASE {database or DATABASE}")
    call_command("migrate", verbosity=0, database="default")
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO django_venturi_job (
                kind, queue, priority, rank, state, payload, merged_count, attempt, failures,
                run_at, enqueued_at, started_at, finished_at, claim_token, claimed_by,
                lease_expires_at, last_error, error_type, dedup_key)
            SELECT
                (ARRAY['tests.noop','tests.flaky','tests.permanent','tests.sleeper',
                       'tests.recompute','tests.latest','tests.async','tests.chaos',
                       'tests.steady','tests.returns_none'])[1 + i %% 10],
                (ARRAY['default','mail','reports'])[1 + i %% 3],
                i %% 3, 0, s.state,
                jsonb_build_object('n', i, 'note', 'order ' || i),
                0, CASE WHEN s.state = 'ready' THEN 0 ELSE 1 END,
                CASE WHEN s.state = 'failed' THEN 1 ELSE 0 END,
                now() - (i %% 600000) * interval '1 second',
                now() - (i %% 600000) * interval '1 second',
                CASE WHEN s.state = 'ready' THEN NULL ELSE now() - interval '1 minute' END,
                CASE WHEN s.state IN ('completed','failed','cancelled')
                     THEN now() - (i %% 600000) * interval '1 second' END,
                CASE WHEN s.state = 'running' THEN gen_random_uuid() END,
                CASE WHEN s.state = 'running' THEN 'scale:1:abc' ELSE '' END,
                CASE WHEN s.state = 'running' THEN now() + interval '5 minutes' END,
                CASE WHEN s.state = 'failed' THEN e.error_type || ': order ' || i || ' broken'
                     ELSE '' END,
                CASE WHEN s.state = 'failed' THEN e.error_type ELSE '' END,
                CASE WHEN i %% 50 = 0 AND s.state <> 'ready' THEN 'key:' || i END
            FROM generate_series(1, %s) AS i,
            LATERAL (SELECT CASE
                WHEN i %% 1000 < %s THEN 'completed'
                WHEN i %% 1000 < %s THEN 'failed'
                WHEN i %% 1000 < %s THEN 'ready'
                WHEN i %% 1000 < %s THEN 'cancelled'
                ELSE 'running' END AS state) AS s,
            -- Most failures of one type, a few of a rare one (the filter's worst case):
            -- the rare one on the first failed per mille.
            LATERAL (SELECT CASE WHEN i %% 1000 = %s THEN 'shop.errors.PaymentDeclined'
                                 WHEN i %% 7 = 0 THEN 'builtins.KeyError'
                                 ELSE 'builtins.ValueError' END AS error_type) AS e
            """,
            [rows, *shares, shares[0]],
        )
    print(f"inserted {rows:,} jobs in {time.perf_counter() - started:.1f} s")


def measure(repeat: int) -> None:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment
    from django.utils import timezone

    from django_venturi.models import Job

    setup_test_environment()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_venturi_job")
    user = User.objects.filter(username="scale").first() or User.objects.create_superuser(
        "scale", password="x"
    )
    client = Client()
    client.force_login(user)
    some_failed = Job.objects.filter(state="failed").order_by("-id").values_list("id", flat=True)[0]
    midnight = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    today = quote(midnight.isoformat())
    week_ago = quote((midnight - timedelta(days=7)).isoformat())
    pages = {
        "list": "",
        "list, page 200": "?p=200",
        "state=failed": "?state=failed",
        "state=ready": "?state=ready",
        "kind=tests.noop": "?kind=tests.noop",
        "has_error=yes (error groups)": "?has_error=yes",
        "error_type=ValueError": "?error_type=builtins.ValueError",
        "error_type=rare": "?error_type=shop.errors.PaymentDeclined",
        "enqueued today": f"?enqueued_at__gte={today}",
        "finished past 7 days": f"?finished_at__gte={week_ago}",
        "journal, kind=tests.noop": "/admin/django_venturi/journalentry/?kind=tests.noop",
        "queue=mail&priority=0": "?queue=mail&priority=0",
        "sorted by enqueued_at": "?o=-8",
        "search exact id": f"?q={some_failed}",
        "search payload text": "?q=order%20123457",
        "job page": f"{some_failed}/change/",
        "stats page": "stats/",
    }
    print(f"{'page':28} {'queries':>7} {'best ms':>8} {'median ms':>9}")
    for label, suffix in pages.items():
        url = suffix if suffix.startswith("/") else "/admin/django_venturi/job/" + suffix
        timings = []
        for _ in range(repeat):
            with CaptureQueriesContext(connection) as captured:
                started = time.perf_counter()
                response = client.get(url)
                timings.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (url, response.status_code)
        print(
            f"{label:28} {len(captured.captured_queries):>7} {min(timings):>8.1f}"
            f" {statistics.median(timings):>9.1f}"
        )


if __name__ == "__main__":
    main()
