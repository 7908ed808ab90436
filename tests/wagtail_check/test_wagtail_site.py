"""A site that `wagtail start` makes runs every task Wagtail enqueues on venturi workers.

The test makes a fresh site from Wagtail's own project template (Wagtail 8: its default
apps, `wagtail.search` among them), adds exactly what the Tasks how-to names (venturi's
app, and TASKS pointed at its backend) and a PostgreSQL database of its own, migrates
it, and then works as an editor would, through Wagtail's admin views (editor.py, run in
the site's own processes). Real `venturi_worker --burst` processes of the site's
`manage.py` run what Wagtail enqueued: among them `modelsearch.tasks`, the module of a
library that is not an installed app, which the jobs' signatures admit.

Run with `tox -e wagtail` (Wagtail installed; the site imports venturi as installed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import environ
import psycopg
import pytest
from psycopg import sql

from tests.database import postgres_url

SITE = "venturisite"
WORD = "zephyrquill"
"""The slug of the page, and the word search must find it by."""
RUN_SUFFIX = os.environ.get("VENTURI_TEST_RUN", "")
DATABASE = f"venturi_wagtail_site{RUN_SUFFIX}".lower()

SEARCH_INDEX_KIND = "tasks:modelsearch.tasks.insert_or_update_object_task"
REFERENCE_INDEX_KIND = "tasks:wagtail.tasks.update_reference_index_task"
PURGE_KIND = "tasks:wagtail.contrib.frontend_cache.tasks.purge_urls_from_cache_task"
DELETE_FILE_KIND = "tasks:wagtail.tasks.delete_file_from_storage_task"

LOCAL_SETTINGS = '''"""Added by venturi's Wagtail check to what `wagtail start` made."""

from .base import INSTALLED_APPS

# What the Tasks how-to names: venturi's app, and TASKS pointed at its backend.
INSTALLED_APPS = [*INSTALLED_APPS, "django_venturi"]
TASKS = {{"default": {{"BACKEND": "django_venturi.backend.VenturiBackend"}}}}

# PostgreSQL, with the app Django requires there for Wagtail's search (postgres.E005).
INSTALLED_APPS += ["django.contrib.postgres"]
DATABASES = {{"default": {database!r}}}
'''


@dataclasses.dataclass(frozen=True)
class Site:
    """A site made by `wagtail start`, run in processes of its own."""

    directory: Path

    def python(self, *args: str, timeout: float = 90) -> str:
        """Run the site's Python with `args` in its directory; fail on a non-zero exit."""
        env = {
            name: value
            for name, value in os.environ.items()
            if name not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH"}
        }
        env["DJANGO_SETTINGS_MODULE"] = f"{SITE}.settings.dev"
        done = subprocess.run(
            [sys.executable, *args],
            cwd=self.directory,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stderr}"
        return done.stdout

    def edit(self, step: str, *arguments: str) -> Any:
        """One step of editor.py, and what it saw."""
        return json.loads(self.python("editor.py", step, *arguments))

    def burst(self) -> None:
        """A worker of the site runs every due job, then exits."""
        self.python("manage.py", "venturi_worker", "--burst")


def admin_connection() -> psycopg.Connection[Any]:
    return psycopg.connect(postgres_url(), autocommit=True, connect_timeout=10)


def database_settings() -> dict[str, Any]:
    settings = dict(environ.Env.db_url_config(postgres_url()))
    settings["NAME"] = DATABASE
    return settings


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """A new site from Wagtail's template, with its own database, migrated."""
    directory = tmp_path_factory.mktemp("wagtail") / SITE
    wagtail = Path(sys.executable).with_name("wagtail")
    subprocess.run(
        [str(wagtail), "start", SITE, str(directory)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    local = LOCAL_SETTINGS.format(database=database_settings())
    (directory / SITE / "settings" / "local.py").write_text(local)
    shutil.copy(Path(__file__).with_name("editor.py"), directory / "editor.py")
    with admin_connection() as connection:
        connection.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DATABASE)))
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    site = Site(directory)
    try:
        site.python("manage.py", "migrate", "--no-input", timeout=180)
        yield site
    finally:
        with admin_connection() as connection:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            connection.execute(drop.format(sql.Identifier(DATABASE)))


@pytest.mark.timeout(300)
def test_a_wagtail_start_site_runs_every_task_wagtail_enqueues_on_venturi_workers(
    site: Site,
) -> None:
    published = site.edit("publish", WORD)

    # Wagtail enqueued its tasks in the editor's requests; nothing ran before a worker did.
    waiting = site.edit("jobs")
    assert {SEARCH_INDEX_KIND, REFERENCE_INDEX_KIND, PURGE_KIND} <= {j["kind"] for j in waiting}
    assert {(job["state"], job["status"]) for job in waiting} == {("ready", "READY")}
    assert published["search"] == []
    before = site.edit("indexes", WORD)
    assert (before["search"], before["image_references"]) == ([], [])

    site.burst()

    after = site.edit("indexes", WORD)
    assert (after["live"], after["title"]) == (True, f"Venturi {WORD}")
    assert after["search"] == [published["page"]], "the search index holds the page"
    assert after["image_references"] == ["collection"]
    assert after["document_references"] == ["collection"]

    document_file = Path(published["document_path"])
    assert document_file.read_bytes() == b"the minutes"
    assert site.edit("delete-document", str(published["document"])) == {"exists": False}
    assert document_file.exists(), "Wagtail deletes the file in a task, on a worker"

    site.burst()

    assert not document_file.exists()
    jobs = site.edit("jobs")
    assert DELETE_FILE_KIND in {job["kind"] for job in jobs}
    unsuccessful = [
        job for job in jobs if (job["state"], job["status"]) != ("completed", "SUCCESSFUL")
    ]
    assert unsuccessful == []
    assert len(jobs) > len(waiting)
