"""Each run's databases carry its suffix, and are dropped at its end or, left by a run that
is gone, by the next run; never those of a live run (tests/run_databases.py)."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from tests import clusters, run_databases
from tests.cluster_workers import require_private_clusters
from tests.conftest import ROOT
from tests.database import postgres_url


def picked() -> str:
    return f"_r{secrets.token_hex(4)}"


def databases_ending_with(suffix: str) -> list[str]:
    with psycopg.connect(postgres_url()) as connection:
        rows = connection.execute(
            "SELECT datname FROM pg_database WHERE right(datname, %s) = %s ORDER BY 1",
            (len(suffix), suffix),
        ).fetchall()
    return [str(name) for (name,) in rows]


def create(*names: str) -> None:
    with psycopg.connect(postgres_url(), autocommit=True) as connection:
        for name in names:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


@pytest.fixture
def suffixes() -> Iterator[list[str]]:
    """Three picked suffixes; whatever a test leaves with them is dropped after it."""
    made = [picked() for _ in range(3)]
    yield made
    with psycopg.connect(postgres_url(), autocommit=True) as connection:
        for suffix in made:
            for name in databases_ending_with(suffix):
                statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                connection.execute(statement.format(sql.Identifier(name)))


def test_an_unset_suffix_is_picked_once_and_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(run_databases.RUN)
    monkeypatch.delenv(run_databases.OWNER)
    first = run_databases.run_suffix()
    assert re.fullmatch(r"_r[0-9a-f]{8}", first)
    assert run_databases.run_suffix() == first == os.environ[run_databases.RUN]
    assert run_databases.owns_the_run()
    monkeypatch.setenv(run_databases.OWNER, "1")  # a nested run: another process owns it
    assert not run_databases.owns_the_run()


def test_a_suffix_given_by_hand_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(run_databases.RUN, "_mine")
    assert run_databases.run_suffix() == "_mine"


def test_a_gone_runs_databases_are_dropped_a_live_runs_kept(suffixes: list[str]) -> None:
    ours, gone, live = suffixes
    create(f"test_venturi{gone}", f"venturi_readme{gone}", f"venturi_demo{live}")
    create(f"unrelated{gone}")  # not a name the suite gives: never dropped
    live_run = run_databases.RunDatabases(postgres_url(), live)
    hold = run_databases.RunDatabases(postgres_url(), ours)
    try:
        assert gone in hold.drop_stale()
        assert databases_ending_with(gone) == [f"unrelated{gone}"]
        assert databases_ending_with(live) == [f"venturi_demo{live}"]
        create(f"venturi_e2e{ours}")
        hold.close()
        assert databases_ending_with(ours) == []
    finally:
        hold.release()
        live_run.release()


def test_a_run_drops_its_databases_at_its_end() -> None:
    """A run of its own with a suffix of its own: its test database is gone after it,
    though the test asked pytest-django to keep it (`--reuse-db`)."""
    suffix = picked()
    env = {key: value for key, value in os.environ.items() if key != run_databases.OWNER}
    env[run_databases.RUN] = suffix
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--reuse-db"),
            "tests/test_enqueue.py::test_enqueue_returns_the_ready_row[postgresql]",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"this run's databases end with {suffix}" in result.stdout
    assert databases_ending_with(suffix) == []


def test_a_runs_lock_file_is_held_while_it_runs(suffixes: list[str]) -> None:
    live, never_owned = suffixes[:2]
    hold = run_databases.RunDatabases(postgres_url(), live)
    try:
        assert not run_databases.run_is_gone_here(live)
    finally:
        hold.close()
    assert run_databases.run_is_gone_here(live)
    assert run_databases.run_is_gone_here(never_owned)


def test_the_private_clusters_of_a_gone_run_are_dropped_a_live_runs_kept(
    suffixes: list[str],
) -> None:
    require_private_clusters()
    gone, live = suffixes[:2]
    hold = run_databases.RunDatabases(postgres_url(), live)
    made = [clusters.Cluster(f"venturi_sweep{suffix}") for suffix in (gone, live)]
    try:
        for cluster in made:
            clusters.run("pg_createcluster", clusters.VERSION, cluster.name)
        assert clusters.drop_clusters_of_gone_runs() == [f"venturi_sweep{gone}"]
        assert set(clusters.existing_clusters()) & {c.name for c in made} == {made[1].name}
    finally:
        hold.close()
        for cluster in made:
            cluster.drop()


def test_a_second_run_with_a_live_runs_suffix_is_refused(suffixes: list[str]) -> None:
    first = run_databases.RunDatabases(postgres_url(), suffixes[0])
    try:
        with pytest.raises(run_databases.SuffixInUse, match="VENTURI_TEST_RUN"):
            run_databases.RunDatabases(postgres_url(), suffixes[0])
    finally:
        first.close()
    run_databases.RunDatabases(postgres_url(), suffixes[0]).close()  # free again
