"""Retry all and cancel all in a filter of 100,000 jobs, through the admin (issue 35).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
        python benchmarks/bulk_actions.py [--jobs 100000] [--rounds 3]

Builds its own database (`venturi_bulk_actions`), then in alternating rounds
fills it with `--jobs` failed jobs of one error type beside as many completed
ones (SQL, then ANALYZE) and posts "Retry all in this filter" for that type, or
fills it with `--jobs` ready jobs beside as many completed ones and posts
"Cancel all in this filter" for their kind, with Django's test client: the whole
request as an operator's browser sends it, its batches included. It prints the
median wall time of each request and this process's CPU time per job (the
server's own is not counted), and says when a request stopped at its time
budget before every job of the filter changed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
DATABASE = "venturi_bulk_actions" + os.environ.get("VENTURI_TEST_RUN", "")
KIND = "tests.flaky"

FILL = """
INSERT INTO django_venturi_job (
    kind, queue, priority, rank, state, payload, merged_count, attempt, failures, run_at,
    enqueued_at, started_at, finished_at, claimed_by, last_error, error_type)
SELECT CASE WHEN i %% 2 = 0 THEN %(kind)s ELSE 'tests.noop' END, 'default', 1, 0,
       CASE WHEN i %% 2 = 1 THEN 'completed' ELSE %(state)s END,
       jsonb_build_object('n', i), 0, 1,
       CASE WHEN i %% 2 = 0 AND %(state)s = 'failed' THEN 1 ELSE 0 END,
       now() + interval '1 hour', now(), now(),
       CASE WHEN i %% 2 = 1 OR %(state)s = 'failed' THEN now() END, '',
       CASE WHEN i %% 2 = 0 AND %(state)s = 'failed' THEN 'builtins.ValueError: bad' ELSE '' END,
       CASE WHEN i %% 2 = 0 AND %(state)s = 'failed' THEN 'builtins.ValueError' ELSE '' END
FROM generate_series(1, %(rows)s) AS i
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["VENTURI_TEST_DATABASE_NAMES"] = json.dumps({"default": DATABASE})
    import django

    django.setup()
    from django.test.utils import setup_test_environment

    setup_test_environment()
    create_database()
    figures: dict[str, list[tuple[float, float]]] = {"retry all": [], "cancel all": []}
    for round_number in range(options.rounds):
        order = ["retry all", "cancel all"]
        for name in order if round_number % 2 == 0 else reversed(order):
            figures[name].append(one_round(name, options.jobs))
            wall, cpu = figures[name][-1]
            print(f"round {round_number + 1}: {name}: {wall:.2f} s, {cpu:.1f} µs CPU per job")
    print(f"\n{options.jobs:,} jobs in the filter, {options.rounds} rounds, medians:")
    for name, rounds in figures.items():
        wall = statistics.median(w for w, _ in rounds)
        cpu = statistics.median(c for _, c in rounds)
        print(f"  {name:<11} {wall:6.2f} s per request   {cpu:6.1f} µs CPU per job (this process)")


def create_database() -> None:
    import psycopg
    from django.core.management import call_command

    from tests.database import postgres_url

    with psycopg.connect(postgres_url(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    call_command("migrate", verbosity=0, database="default")


def one_round(name: str, jobs: int) -> tuple[float, float]:
    """Fill, post the action, check; (seconds, µs of CPU per job)."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.urls import reverse

    from django_venturi.models import Job

    retrying = name == "retry all"
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_venturi_job, django_venturi_journalentry CASCADE")
        state = "failed" if retrying else "ready"
        cursor.execute(FILL, {"kind": KIND, "state": state, "rows": 2 * jobs})
        cursor.execute("ANALYZE django_venturi_job")
    user = User.objects.filter(username="bulk").first() or User.objects.create_superuser(
        "bulk", password="x"
    )
    client = Client()
    client.force_login(user)
    if retrying:
        url = reverse("admin:django_venturi_job_retry_all") + "?error_type=builtins.ValueError"
    else:
        url = reverse("admin:django_venturi_job_cancel_all") + f"?kind={KIND}"
    cpu, started = time.process_time(), time.perf_counter()
    response = client.post(url, {"post": "yes"})
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert response.status_code == 302, response.status_code
    changed = Job.objects.filter(kind=KIND, state="ready" if retrying else "cancelled")
    if retrying:
        changed = changed.filter(failures=0)
    done = changed.count()
    if done < jobs:  # the request's time budget ran out (`admin.bulk_actions.TIME_BUDGET`)
        print(f"  {name}: {done:,} of {jobs:,} jobs in the request, then its time budget ran out")
    return wall, cpu / max(done, 1) * 1e6


if __name__ == "__main__":
    main()
