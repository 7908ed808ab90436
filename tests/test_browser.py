"""End to end in headless Chromium: the example project's admin, as an operator uses it.

The example project runs under `runserver` on its own PostgreSQL database, filled
by `venturi_demo` (jobs of every outcome, failed ones included), with a live
worker so the stats page has one to show. Playwright drives Debian's
`/usr/bin/chromium` (never a downloaded browser). Screenshots go to
`tests/artifacts/browser/` (ignored by git).

Without Chromium the test is skipped with the reason and how to install it, except
in CI (`CI=true`), where it fails: CI must not pass without running it.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ROOT
from tests.database import postgres_url

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "tests" / "artifacts" / "browser"
DATABASE = "venturi_e2e" + os.environ.get("VENTURI_TEST_RUN", "")
PASSWORD = "e2e-admin-password"
MANAGE = [sys.executable, str(ROOT / "example_project" / "manage.py")]

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def example_env() -> dict[str, str]:
    base = postgres_url()
    url = base[: base.rindex("/")] + f"/{DATABASE}"
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "example_project.settings",
            "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
            "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
            "PYTHONUNBUFFERED": "1",
            "DEBUG": "1",
            "VENTURI_LOG_LEVEL": "WARNING",
        }
    )
    return env


def manage(*args: str) -> None:
    result = subprocess.run(
        [*MANAGE, *args], env=example_env(), cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"manage.py {' '.join(args)} failed:\n{result.stderr}"


@pytest.fixture
def example_site(tmp_path: Path) -> Iterator[str]:
    """The example project's admin at a local URL, with demo jobs and one live worker."""
    with psycopg.connect(postgres_url(), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{DATABASE}"')
    manage("venturi_demo", "--count", "3")
    manage("createsuperuser", "--noinput", "--username", "admin", "--email", "admin@example.com")
    port = free_port()
    logs = (tmp_path / "server.log").open("wb"), (tmp_path / "worker.log").open("wb")
    server = subprocess.Popen(
        [*MANAGE, "runserver", f"127.0.0.1:{port}", "--noreload"],
        env=example_env(),
        cwd=ROOT,
        stdout=logs[0],
        stderr=subprocess.STDOUT,
    )
    worker = subprocess.Popen(
        [*MANAGE, "venturi_worker", "--concurrency", "2"],
        env=example_env(),
        cwd=ROOT,
        stdout=logs[1],
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/admin/login/", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError(
                        "runserver did not answer:\n" + (tmp_path / "server.log").read_text()
                    ) from None
                time.sleep(0.2)
        yield url
    finally:
        for process in (server, worker):
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
        with psycopg.connect(postgres_url(), autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


def test_an_operator_finds_a_failed_job_retries_it_and_reads_the_stats(example_site: str) -> None:
    if not CHROMIUM.exists():
        reason = (
            f"{CHROMIUM} is missing: the browser test needs Debian's Chromium. Install it with\n"
            "  apt-get install -y chromium\n(.ci/run does this when it is missing)."
        )
        if os.environ.get("CI"):
            pytest.fail(reason)  # CI must run it
        pytest.skip(reason)
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": 1600, "height": 900})
        page.set_default_timeout(20_000)

        page.goto(f"{example_site}/admin/django_venturi/job/")
        expect(page).to_have_url(re.compile(r"/admin/login/"))  # anonymous: sent to log in
        page.fill("#id_username", "admin")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        expect(page.locator("#result_list")).to_be_visible()
        page.screenshot(path=ARTIFACTS / "1-jobs.png", full_page=True)

        page.locator("#changelist-filter").get_by_role("link", name="failed", exact=True).click()
        expect(page).to_have_url(re.compile(r"state__exact=failed"))
        rows = page.locator("#result_list tbody tr")
        expect(rows.first).to_contain_text("failed")
        page.screenshot(path=ARTIFACTS / "2-failed-jobs.png", full_page=True)
        job_link = rows.first.locator("th a").first
        job_id = job_link.inner_text()

        rows.first.locator("input.action-select").check()
        page.select_option("select[name=action]", "retry_now")
        page.click("button[name=index]")
        expect(page.get_by_role("heading", name="Retry these jobs now?")).to_be_visible()
        page.screenshot(path=ARTIFACTS / "3-confirm-retry.png", full_page=True)
        page.click("input[type=submit][value^='Yes']")
        expect(page.locator(".messagelist")).to_contain_text("1 job will run now.")
        page.screenshot(path=ARTIFACTS / "4-retried.png", full_page=True)

        page.goto(f"{example_site}/admin/django_venturi/job/{job_id}/change/")
        expect(page.locator(".field-state_history_table")).to_be_visible()
        expect(page.locator(".field-state_history_table")).to_contain_text("enqueued: ready")
        page.screenshot(path=ARTIFACTS / "5-job-page.png", full_page=True)

        page.goto(f"{example_site}/admin/django_venturi/job/")
        page.get_by_role("link", name="Queue stats").click()
        expect(page.locator("#venturi-hour svg")).to_be_visible()
        expect(page.locator("#venturi-workers tbody tr").first).not_to_contain_text(
            "No worker is running"
        )
        expect(page.locator("#venturi-last-hour tbody")).to_contain_text("shop.charge_card")
        page.screenshot(path=ARTIFACTS / "6-stats.png", full_page=True)

        page.goto(f"{example_site}/admin/django_venturi/job/")
        page.get_by_role("link", name="Clean up finished jobs").click()
        page.fill("#id_older_than", "1d")
        page.get_by_role("button", name="Count what would be deleted").click()
        expect(page.locator(".venturi-preview")).to_contain_text("This deletes 0 jobs")
        page.screenshot(path=ARTIFACTS / "7-cleanup.png", full_page=True)
        browser.close()
