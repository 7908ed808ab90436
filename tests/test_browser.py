"""End to end in headless Chromium: the example project's admin, as an operator uses it.

The example project runs under `runserver` on its own PostgreSQL database, filled
by `venturi_demo` (jobs of every outcome, failed ones included), with a live
worker so the stats page has one to show. Playwright drives Debian's
`/usr/bin/chromium` (never a downloaded browser). Screenshots go to
`tests/artifacts/browser/` (ignored by git); their paths are printed (`pytest -s`).
With `VENTURI_SCREENSHOTS=docs`, the pictures the docs show are written again too,
to `docs/_static/screenshots/` at a fixed viewport (`docs_screenshot`).

Without Chromium the tests are skipped with the reason and how to install it, except
in CI (`CI=true`), where they fail: CI must not pass without running them.
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
from typing import TYPE_CHECKING

import psycopg
import pytest

from tests.conftest import ROOT
from tests.database import postgres_url
from tests.skips import missing_tool

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

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
DOCS_SCREENSHOTS = ROOT / "docs" / "_static" / "screenshots"
DOCS_VIEWPORT = {"width": 1366, "height": 768}
"""The docs' pictures: one size for all, the laptop screen the admin's pages must fit."""
SCREENS = {"1366x768": (1366, 768), "1920x1080": (1920, 1080)}
"""A common laptop screen and a common desktop one."""

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


@pytest.fixture(scope="module")
def chromium() -> Path:
    """Debian's Chromium; skip loudly without it, fail in CI (`CI=true`)."""
    if not CHROMIUM.exists():
        reason = (
            f"BROWSER TEST NOT RUN: {CHROMIUM} is missing. The admin's browser test needs "
            "Debian's Chromium; install it with\n  apt-get install -y chromium\n"
            "(.ci/run does this when it is missing)."
        )
        missing_tool(reason)  # CI must run it
    return CHROMIUM


@pytest.fixture(scope="module")
def example_site(chromium: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The example project's admin at a local URL, with demo jobs and one live worker."""
    tmp_path = tmp_path_factory.mktemp("example_site")
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


@pytest.fixture(scope="module")
def browser(chromium: Path) -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


def logged_in_page(
    browser: Browser, site: str, width: int, height: int, username: str = "admin"
) -> Page:
    """A new page, logged in through the login form (every user here has `PASSWORD`)."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(20_000)
    page.goto(f"{site}/admin/django_venturi/job/")
    expect(page).to_have_url(re.compile(r"/admin/login/"))  # anonymous: sent to log in
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    expect(page.locator("#result_list")).to_be_visible()
    return page


def screenshot(page: Page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=path, full_page=True)
    print(f"screenshot: {path}")
    return path


def docs_screenshot(page: Page, name: str, selector: str | None = None) -> Path | None:
    """With `VENTURI_SCREENSHOTS=docs`, write the docs' picture `name`: the page as the
    viewport shows it (`DOCS_VIEWPORT`), or only the element `selector` picks."""
    if os.environ.get("VENTURI_SCREENSHOTS") != "docs":
        return None
    assert page.viewport_size == DOCS_VIEWPORT, page.viewport_size
    DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = DOCS_SCREENSHOTS / f"{name}.png"
    page.mouse.move(0, 0)  # no hover effect in the picture
    if selector is None:
        page.screenshot(path=path)
    else:
        page.locator(selector).screenshot(path=path)
    print(f"docs screenshot: {path}")
    return path


SIDEWAYS_OVERFLOW = """() => {
    const scrolling = [...document.querySelectorAll("*")].filter(
        (box) => ["auto", "scroll"].includes(getComputedStyle(box).overflowX)
    );
    const boxes = [document.documentElement, ...scrolling];
    return Object.fromEntries(boxes.map((box) => [
        box.id || box.className || box.tagName, box.scrollWidth - box.clientWidth,
    ]).filter(([, width]) => width > 0));
}"""


def sideways_overflow(page: Page) -> dict[str, int]:
    """What scrolls sideways, and by how many pixels: the page (`scrollWidth` of the
    document against its `clientWidth`) or a box inside it, such as the admin's
    `.results`, which scrolls the job list's table on its own. Empty: it all fits."""
    return dict(page.evaluate(SIDEWAYS_OVERFLOW))


def test_the_admin_pages_fit_a_laptop_screen(browser: Browser, example_site: str) -> None:
    """The job list, a failed job's page, the journal and the stats page at two sizes.

    At 1366 px the job list used to scroll sideways, hiding the enqueued and last
    error columns.
    """
    from playwright.sync_api import expect

    overflows: dict[str, dict[str, int]] = {}
    for screen, (width, height) in SCREENS.items():
        page = logged_in_page(browser, example_site, width, height)
        pages = {"jobs": "/admin/django_venturi/job/"}
        page.goto(f"{example_site}/admin/django_venturi/job/?state__exact=failed")
        failed_job = page.locator("#result_list tbody tr th a").first.get_attribute("href")
        assert failed_job, "the demo left no failed job"
        pages["failed-job"] = failed_job
        pages["journal"] = "/admin/django_venturi/journalentry/"
        pages["stats"] = "/admin/django_venturi/job/stats/"
        for name, url in pages.items():
            page.goto(example_site + url if url.startswith("/") else url)
            expect(page.locator("#content")).to_be_visible()
            screenshot(page, f"{screen}-{name}")
            overflows[f"{name} at {screen}"] = sideways_overflow(page)
        page.close()
    assert overflows["jobs at 1366x768"] == {}, overflows
    assert not any(overflows.values()), overflows


def test_an_operator_finds_a_failed_job_retries_it_and_reads_the_stats(
    browser: Browser, example_site: str
) -> None:
    from playwright.sync_api import expect

    page = logged_in_page(browser, example_site, 1600, 900)
    screenshot(page, "1-jobs")

    page.locator("#changelist-filter").get_by_role("link", name="failed", exact=True).click()
    expect(page).to_have_url(re.compile(r"state__exact=failed"))
    rows = page.locator("#result_list tbody tr")
    expect(rows.first).to_contain_text("failed")
    screenshot(page, "2-failed-jobs")
    job_id = rows.first.locator("th a").first.inner_text()

    rows.first.locator("input.action-select").check()
    page.select_option("select[name=action]", "retry_now")
    page.click("button[name=index]")
    expect(page.get_by_role("heading", name="Retry these jobs now?")).to_be_visible()
    screenshot(page, "3-confirm-retry")
    page.click("input[type=submit][value^='Yes']")
    expect(page.locator(".messagelist")).to_contain_text("1 job will run now.")
    screenshot(page, "4-retried")

    page.goto(f"{example_site}/admin/django_venturi/job/{job_id}/change/")
    expect(page.locator(".field-state_history_table")).to_be_visible()
    expect(page.locator(".field-state_history_table")).to_contain_text("enqueued: ready")
    screenshot(page, "5-job-page")

    # Another failed job, retried from its own page's button.
    page.goto(f"{example_site}/admin/django_venturi/job/?state__exact=failed")
    page.locator("#result_list tbody tr th a").first.click()
    job_page = page.url.partition("?")[0]
    page.get_by_role("button", name="Retry now").click()
    expect(page.get_by_role("heading", name="Retry these jobs now?")).to_be_visible()
    page.click("input[type=submit][value^='Yes']")
    expect(page.locator(".messagelist")).to_contain_text("1 job will run now.")
    assert (
        page.url.partition("?")[0] == job_page
    )  # back on the job's page (the live worker may run it already)
    screenshot(page, "6-retried-from-its-page")

    page.goto(f"{example_site}/admin/django_venturi/job/")
    page.get_by_role("link", name="Queue stats").click()
    expect(page.locator("#venturi-hour svg")).to_be_visible()
    expect(page.locator("#venturi-workers tbody tr").first).not_to_contain_text(
        "No worker is running"
    )
    expect(page.locator("#venturi-last-hour tbody")).to_contain_text("shop.charge_card")
    screenshot(page, "7-stats")

    page.goto(f"{example_site}/admin/django_venturi/job/")
    page.get_by_role("link", name="Clean up finished jobs").click()
    page.fill("#id_older_than", "1d")
    page.get_by_role("button", name="Count what would be deleted").click()
    expect(page.locator(".venturi-preview")).to_contain_text("This deletes 0 jobs")
    screenshot(page, "8-cleanup")
    page.close()


BREADCRUMBS_LOOK = """() => {
    const crumbs = document.querySelector(".breadcrumbs");
    if (crumbs === null) return null;
    const style = getComputedStyle(crumbs);
    const box = crumbs.getBoundingClientRect();
    const link = crumbs.querySelector("a");
    return {
        tag: crumbs.tagName,
        background: style.backgroundColor,
        color: style.color,
        padding: [style.paddingTop, style.paddingRight, style.paddingBottom, style.paddingLeft],
        margin: [style.marginTop, style.marginLeft],
        left: box.left,
        width: box.width,
        height: box.height,
        font: [style.fontSize, style.lineHeight],
        link: link === null ? null : getComputedStyle(link).color,
    };
}"""


def breadcrumbs_look(page: Page) -> dict[str, object] | None:
    """The computed look of the page's `.breadcrumbs` element (None: the page has none)."""
    look = page.evaluate(BREADCRUMBS_LOOK)
    return None if look is None else dict(look)


def crumb_links(page: Page) -> list[str]:
    """Where the breadcrumbs' links go, in order."""
    return [str(link.get_attribute("href")) for link in page.locator(".breadcrumbs a").all()]


def test_the_custom_pages_breadcrumbs_look_like_the_admins_own(
    browser: Browser, example_site: str
) -> None:
    """Stats, cleanup, periodic tasks and actions' confirmation pages: their breadcrumbs
    have the job list's computed look on the running Django version.

    Django 6.1 styles only `<ol class="breadcrumbs">`; the pages' old `<div>` showed
    there as plain text against the left edge.
    """
    from playwright.sync_api import expect

    page = logged_in_page(browser, example_site, 1366, 768)
    admins_own = breadcrumbs_look(page)
    assert admins_own is not None
    assert admins_own["background"] not in ("rgba(0, 0, 0, 0)", "transparent"), admins_own
    looks = {}
    trails = {}
    pages = {
        "stats": "/admin/django_venturi/job/stats/",
        "cleanup": "/admin/django_venturi/job/cleanup/",
        "periodic tasks": "/admin/django_venturi/periodictask/",
        "schedule confirmation": "/admin/django_venturi/periodictask/shop.signup_report/disable/",
        "kind page": "/admin/django_venturi/job/kinds/shop.charge_card/",
        "retry all confirmation": "/admin/django_venturi/job/retry_all/?state__exact=failed",
    }
    for name, url in pages.items():
        page.goto(example_site + url)
        expect(page.locator("#content")).to_be_visible()
        looks[name] = breadcrumbs_look(page)
        trails[name] = crumb_links(page)
    page.goto(f"{example_site}/admin/django_venturi/job/")
    page.locator("#result_list tbody tr").first.locator("input.action-select").check()
    page.select_option("select[name=action]", "retry_now")
    page.click("button[name=index]")
    expect(page.get_by_role("heading", name="Retry these jobs now?")).to_be_visible()
    looks["confirmation"] = breadcrumbs_look(page)
    trails["confirmation"] = crumb_links(page)
    screenshot(page, "breadcrumbs-confirmation")
    page.close()
    assert looks == dict.fromkeys(looks, admins_own)
    app = ["/admin/", "/admin/django_venturi/"]
    assert trails == {
        "stats": [*app, "/admin/django_venturi/job/"],
        "cleanup": [*app, "/admin/django_venturi/job/"],
        "periodic tasks": app,
        "schedule confirmation": [*app, "/admin/django_venturi/periodictask/"],
        "kind page": [*app, "/admin/django_venturi/job/"],
        "retry all confirmation": [*app, "/admin/django_venturi/job/"],
        "confirmation": [*app, "/admin/django_venturi/job/"],
    }


HISTORY_KINDS = ("shop.send_email", "shop.charge_card", "shop.sync_to_crm", "shop.ping_webhook")


def seed_an_hour_of_history() -> None:
    """Roll-ups of the hour before, as busy workers would have left them (the docs'
    pictures show charts with something in them): per minute, each demo kind's runs,
    wait and run times, and the depth samples; the last two minutes are left to the
    live worker, which samples the depth of the minute it takes."""
    from django_venturi.models import RUN_COLUMNS, WAIT_COLUMNS

    figures = {
        "completed": "20 + (m * 7) % 13 + k * 5",
        "failed": "CASE WHEN k = 2 AND m % 9 = 0 THEN 2 ELSE 0 END",
        "retried": "CASE WHEN k = 3 THEN m % 4 ELSE 0 END",
        "wait_03": "18 + (m * 7) % 13 + k * 5 - m % 4",
        "wait_05": "2 + m % 4",
        "wait_08": "CASE WHEN m % 10 = 0 THEN 5 ELSE 0 END",
        "run_05": "18 + (m * 7) % 13 + k * 5",
        "run_09": "CASE WHEN m % 6 = 0 THEN 4 ELSE 1 END",
    }
    buckets = [*WAIT_COLUMNS, *RUN_COLUMNS]
    columns = ["completed", "failed", "retried", *buckets]
    runs = ", ".join(figures.get(column, "0") for column in columns)
    zeros = ", ".join("0" for _ in columns)
    minutes = (
        "generate_series(date_trunc('minute', now()) - interval '60 minutes', "
        "date_trunc('minute', now()) - interval '2 minutes', interval '1 minute')"
    )
    names = ", ".join(columns)
    table = "django_venturi_historyrollup"
    kinds = "ARRAY[" + ", ".join(f"'{kind}'" for kind in HISTORY_KINDS) + "]"  # constants
    number = "(extract(epoch FROM start)::bigint / 60) % 60"
    with psycopg.connect(example_env()["DATABASE_URL"], autocommit=True) as connection:
        connection.execute(
            f"""INSERT INTO {table} (span, start, queue, kind, worker, ready, waiting, samples,
                                     {names})
                SELECT 'minute', start, 'default', kind, 'e2e-seed', 0, 0, 0, {runs}
                FROM {minutes} AS start, LATERAL (SELECT {number} AS m) AS minute,
                     unnest({kinds}) WITH ORDINALITY AS kinds(kind, k)
                UNION ALL
                SELECT 'minute', start, 'default', kind, '', 40 + (m * 11) % 35 + 10 * k,
                       CASE WHEN k = 1 THEN m % 5 ELSE 0 END, 0, {zeros}
                FROM {minutes} AS start, LATERAL (SELECT {number} AS m) AS minute,
                     unnest({kinds}) WITH ORDINALITY AS kinds(kind, k)
                UNION ALL
                SELECT 'minute', start, '', '', '', 0, 0, 1, {zeros} FROM {minutes} AS start
                ON CONFLICT DO NOTHING"""
        )


def enqueue_an_email() -> None:
    """One job the live worker completes (the demo's `shop.send_email`)."""
    manage(
        "shell",
        "-c",
        "from example_project.shop.tasks import SendEmail\n"
        "SendEmail(signup_id=0, to='e2e@example.com', subject='Hello').enqueue()\n",
    )


def test_the_console_history_refreshes_in_place_and_leads_to_a_kind_and_its_errors(
    browser: Browser, example_site: str
) -> None:
    """The stats page's history: a job finished while the page is open shows in its figures
    without a reload; its range switch; a kind's page from its name; the job list's error
    type filter and "Retry all in this filter" through its confirmation."""
    from playwright.sync_api import expect

    if os.environ.get("VENTURI_SCREENSHOTS") == "docs":
        seed_an_hour_of_history()  # charts worth a picture
    page = logged_in_page(browser, example_site, DOCS_VIEWPORT["width"], DOCS_VIEWPORT["height"])
    docs_screenshot(page, "job-list")
    page.get_by_role("link", name="Queue stats").click()
    history = page.locator("#venturi-history")
    expect(history.locator("h2")).to_contain_text("the last 1 hour")
    expect(history.locator("[data-chart=throughput] svg")).to_be_visible()
    page.evaluate("() => { window.venturiNotReloaded = true; }")  # gone if the page reloads
    completed = history.locator("[data-figure=completed]")
    before = int(completed.inner_text())
    enqueue_an_email()  # run by the live worker, written to the roll-ups within seconds
    expect(completed).not_to_have_text(str(before), timeout=90_000)
    assert int(completed.inner_text()) > before
    assert page.evaluate("() => window.venturiNotReloaded") is True  # in place, no reload
    docs_screenshot(page, "stats-history", "#venturi-history")

    history.get_by_role("link", name="24 hours").click()
    expect(page).to_have_url(re.compile(r"[?&]range=24h"))
    expect(history.locator("h2")).to_contain_text("the last 24 hours")
    expect(history.locator("a[aria-current=true]")).to_have_text("24 hours")
    expect(history.locator("[data-chart=throughput] svg")).to_be_visible()

    page.locator("#venturi-last-hour").get_by_role("link", name="shop.charge_card").click()
    expect(page).to_have_url(re.compile(r"/admin/django_venturi/job/kinds/shop\.charge_card/"))
    expect(page.locator("#content h1")).to_have_text("Kind shop.charge_card")
    expect(page.locator("#venturi-history h2")).to_contain_text("History of shop.charge_card")
    expect(page.locator(".venturi-error-groups")).to_contain_text("card declined for")
    screenshot(page, "console-kind-page")
    docs_screenshot(page, "kind-page")

    page.goto(f"{example_site}/admin/django_venturi/job/?has_error=yes")
    groups = page.locator(".venturi-error-groups")
    expect(groups).to_contain_text("ConnectionError")
    docs_screenshot(page, "job-list-error-groups")
    page.locator("#changelist-filter").get_by_role("link", name="ConnectionError").click()
    expect(page).to_have_url(re.compile(r"error_type=builtins\.ConnectionError"))
    rows = page.locator("#result_list tbody tr")
    expect(rows.first).to_contain_text("ConnectionError")
    listed = rows.count()
    assert rows.filter(has_text="ConnectionError").count() == listed
    page.get_by_role("link", name="Retry all in this filter").click()
    expect(page.get_by_role("heading", name="Retry every job in this filter now?")).to_be_visible()
    expect(page.locator("#content")).to_contain_text("error_type")  # names the filter
    screenshot(page, "console-retry-all")
    page.click("input[type=submit][value^='Yes']")
    expect(page).to_have_url(re.compile(r"/admin/django_venturi/job/\?.*error_type="))
    job_word = "job" if listed == 1 else "jobs"
    expect(page.locator(".messagelist")).to_contain_text(f"{listed} {job_word} will run now.")

    page.goto(f"{example_site}/admin/django_venturi/job/?state__exact=failed&kind=shop.charge_card")
    page.locator("#result_list tbody tr th a").first.click()
    expect(page.locator(".field-last_error_text")).to_contain_text("card declined for")
    docs_screenshot(page, "job-page")
    page.goto(f"{example_site}/admin/django_venturi/periodictask/")
    schedule = page.locator("tr.venturi-schedule[data-kind='shop.signup_report']")
    expect(schedule.locator(".venturi-next-runs")).to_contain_text(re.compile(r"\d\d:\d\d"))
    expect(schedule.get_by_role("link", name="Run now")).to_be_visible()
    docs_screenshot(page, "periodic")
    page.close()
