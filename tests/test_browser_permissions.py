"""End to end in headless Chromium: the example project's admin, as staff who are no superusers.

Each user logs in through the login form and holds only what docs/howto/admin.md
grants, through the groups of docs/examples/admin_groups.py (`grant`): an observer
the view permissions (`SEE`), an operator `SUPPORT` (`SEE` and `retry_job`) and
`pause_queues`. The pages must offer neither of them what their permissions leave
out, the views must refuse it when it is posted all the same, and the database
tells what changed. The example site, its live worker and Chromium are those of
test_browser.py (its fixtures, a site of this module's own).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from psycopg.rows import dict_row

from docs.examples.admin_groups import SEE, SUPPORT
from tests.test_browser import (  # noqa: F401 - the fixtures
    PASSWORD,
    browser,
    chromium,
    example_env,
    example_site,
    logged_in_page,
    manage,
    screenshot,
)

if TYPE_CHECKING:
    from playwright.sync_api import APIResponse, Browser, Page

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # a worker run, waited for

JOBS = "/admin/django_venturi/job/"
FAILED_CHARGES = f"{JOBS}?state__exact=failed&kind=shop.charge_card"
"""The demo's charges are declined for good: failed jobs nothing retries on its own."""
STATS = f"{JOBS}stats/"
PERIODIC = "/admin/django_venturi/periodictask/"
SCHEDULE = "shop.signup_report"
"""The demo's one schedule (nightly): nothing enqueues it during the test but run now."""


def create_staff(username: str, groups: dict[str, list[str]]) -> None:
    """A staff user, no superuser, in groups made by the docs' own `grant()`."""
    manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User\n"
        "from docs.examples.admin_groups import grant\n"
        f"user = User.objects.create_user({username!r}, password={PASSWORD!r}, is_staff=True)\n"
        f"for name, codenames in {groups!r}.items():\n"
        "    user.groups.add(grant(name, codenames))\n"
        "assert not user.is_superuser\n",
    )


def query(sql: str, *params: Any) -> list[dict[str, Any]]:
    """Rows of the example site's database, read beside the browser."""
    with psycopg.connect(example_env()["DATABASE_URL"], row_factory=dict_row) as connection:
        return connection.execute(sql, params).fetchall()


def job_row(job_id: int) -> dict[str, Any] | None:
    rows = query(
        "SELECT state, attempt, failures, run_at, finished_at, cancel_requested_at, last_error"
        " FROM django_venturi_job WHERE id = %s",
        job_id,
    )
    return rows[0] if rows else None


def pauses() -> list[tuple[str, str, str]]:
    rows = query("SELECT scope, name, paused_by FROM django_venturi_pause ORDER BY scope, name")
    return [(row["scope"], row["name"], row["paused_by"]) for row in rows]


def schedule_state() -> tuple[list[dict[str, Any]], int]:
    """The schedule's stored state (empty: never disabled or enabled) and how many jobs of
    its task exist."""
    states = query(
        "SELECT enabled, changed_by FROM django_venturi_schedulestate WHERE kind = %s", SCHEDULE
    )
    [count] = query("SELECT count(*) AS n FROM django_venturi_job WHERE kind = %s", SCHEDULE)
    return states, int(count["n"])


def open_a_failed_charge(page: Page, site: str) -> int:
    """Open the job page of a failed charge from the list; its id."""
    page.goto(site + FAILED_CHARGES)
    link = page.locator("#result_list tbody tr th a").first
    job_id = int(link.inner_text())
    link.click()
    page.wait_for_url(re.compile(rf"{JOBS}{job_id}/change/"))
    return job_id


def forged_post(page: Page, url: str, fields: dict[str, Any]) -> APIResponse:
    """A POST the page offers no form for, with the session's cookies and CSRF token.

    The token is right, so a 403 is the permission's; redirects are not followed.
    """
    [token] = [c["value"] for c in page.context.cookies() if c["name"] == "csrftoken"]
    response = page.request.post(
        url, form={"csrfmiddlewaretoken": token, **fields}, max_redirects=0
    )
    assert "CSRF" not in response.text(), response.text()[:500]
    return response


def action_post(action: str, job_id: int) -> dict[str, Any]:
    """The job list's action form, submitted with the confirmation already given."""
    return {"action": action, "_selected_action": str(job_id), "index": "0", "post": "yes"}


def test_an_observer_sees_jobs_and_errors_but_is_offered_no_action_and_is_refused_each_one(
    browser: Browser,  # noqa: F811 - the fixture
    example_site: str,  # noqa: F811 - the fixture
) -> None:
    from playwright.sync_api import expect

    create_staff("observer", {"Observers": SEE})
    page = logged_in_page(browser, example_site, 1600, 900, username="observer")
    expect(page.locator("#result_list tbody tr").first).to_be_visible()
    expect(page.locator("#user-tools")).to_contain_text("observer")
    # Jobs can be listed but not selected: no action, no cleanup page.
    expect(page.locator("select[name=action]")).to_have_count(0)
    expect(page.locator("#result_list input.action-select")).to_have_count(0)
    expect(page.get_by_role("link", name="Clean up finished jobs")).to_have_count(0)
    screenshot(page, "observer-1-jobs")

    job_id = open_a_failed_charge(page, example_site)
    before = job_row(job_id)
    assert before is not None and before["state"] == "failed", before
    expect(page.locator(".field-state")).to_contain_text("failed")
    expect(page.locator(".field-last_error_text")).to_contain_text("card declined for")
    expect(page.locator(".field-state_history_table")).to_contain_text("failed")
    expect(page.locator("form.venturi-button")).to_have_count(0)  # no Retry now
    expect(page.get_by_role("button", name="Retry now")).to_have_count(0)
    expect(page.locator("a.deletelink")).to_have_count(0)
    screenshot(page, "observer-2-failed-job")

    page.goto(example_site + STATS)
    expect(page.locator("#venturi-paused")).to_contain_text("Nothing is paused.")
    expect(page.locator("#venturi-pause-form")).to_have_count(0)
    screenshot(page, "observer-3-stats")

    # Posted all the same, each is refused and changes nothing.
    site = example_site
    for action in ("retry_now", "cancel_jobs", "delete_selected"):
        response = forged_post(page, site + JOBS, action_post(action, job_id))
        assert response.status == 200, (action, response.status)  # the list, nothing done
        assert job_row(job_id) == before, action
    for url, fields in [
        (f"{JOBS}{job_id}/retry/", {"post": "yes"}),
        (f"{JOBS}{job_id}/cancel/", {"post": "yes"}),
        (f"{JOBS}{job_id}/delete/", {"post": "yes"}),
        (f"{JOBS}cleanup/", {"older_than": "0s", "states": "failed", "confirm": "1"}),
        (f"{JOBS}pause/", {"scope": "kind", "name": "shop.charge_card"}),
    ]:
        assert forged_post(page, site + url, fields).status == 403, url
    assert job_row(job_id) == before
    assert pauses() == []
    page.goto(f"{site}{JOBS}{job_id}/change/")
    expect(page.locator(".field-state")).to_contain_text("failed")

    # Schedules: seen, not acted on, by GET or by POST.
    page.goto(site + PERIODIC)
    schedule = page.locator(f"tr.venturi-schedule[data-kind='{SCHEDULE}']")
    expect(schedule).to_contain_text("enabled")
    expect(page.locator(".venturi-schedule-actions")).to_have_count(0)
    expect(page.get_by_role("link", name="Run now")).to_have_count(0)
    before_schedule = schedule_state()
    for action in ("run", "disable", "enable"):
        url = f"{site}{PERIODIC}{SCHEDULE}/{action}/"
        assert page.request.get(url, max_redirects=0).status == 403, url
        assert forged_post(page, url, {}).status == 403, url
    assert schedule_state() == before_schedule
    page.close()


def test_an_operator_pauses_a_kind_retries_its_failed_job_then_resumes_it_but_cannot_cancel(
    browser: Browser,  # noqa: F811 - the fixture
    example_site: str,  # noqa: F811 - the fixture
) -> None:
    from playwright.sync_api import expect

    create_staff(
        "operator",
        {"Support": SUPPORT, "Pausers": ["pause_queues"], "Schedulers": ["manage_schedules"]},
    )
    page = logged_in_page(browser, example_site, 1600, 900, username="operator")
    # Of the list's actions, only the one held: no cancel, no delete, no cleanup page.
    options = page.locator("select[name=action] option")
    expect(options).to_have_count(2)
    assert options.evaluate_all("options => options.map(o => o.value)") == ["", "retry_now"]
    expect(page.get_by_role("link", name="Clean up finished jobs")).to_have_count(0)

    # Pause the kind first: the retried job then stays ready for the test to look at.
    page.get_by_role("link", name="Queue stats").click()
    form = page.locator("#venturi-pause-form")
    form.locator("select[name=scope]").select_option("kind")
    form.locator("input[name=name]").fill("shop.charge_card")
    form.get_by_role("button", name="Pause").click()
    expect(page.locator(".messagelist")).to_contain_text("Paused kind shop.charge_card")
    expect(page.locator("#venturi-paused tbody")).to_contain_text("operator")
    assert pauses() == [("kind", "shop.charge_card", "operator")]
    screenshot(page, "operator-1-paused")

    job_id = open_a_failed_charge(page, example_site)
    before = job_row(job_id)
    assert before is not None and before["state"] == "failed", before
    expect(page.locator(".field-last_error_text")).to_contain_text("card declined for")
    page.get_by_role("button", name="Retry now").click()
    expect(page.get_by_role("heading", name="Retry these jobs now?")).to_be_visible()
    page.click("input[type=submit][value^='Yes']")
    expect(page.locator(".messagelist")).to_contain_text("1 job will run now.")
    expect(page.locator(".field-state")).to_contain_text("ready")
    expect(page.locator(".field-state_history_table")).to_contain_text(
        "retried from the admin: ready"
    )
    retried = job_row(job_id)
    assert retried is not None
    assert (retried["state"], retried["failures"], retried["finished_at"]) == ("ready", 0, None)
    assert retried["attempt"] == before["attempt"]  # the paused kind is not claimed
    assert retried["run_at"] >= before["finished_at"]
    screenshot(page, "operator-2-retried")

    # A ready job could be cancelled, but not by this operator.
    expect(page.get_by_role("button", name=re.compile("Cancel"))).to_have_count(0)
    site = example_site
    assert forged_post(page, f"{site}{JOBS}{job_id}/cancel/", {"post": "yes"}).status == 403
    for action in ("cancel_jobs", "delete_selected"):  # not among this user's actions
        forged_post(page, site + JOBS, action_post(action, job_id))
        assert job_row(job_id) == retried, action

    # Resumed, the kind's jobs are claimed again: the live worker runs the charge,
    # declined once more.
    page.goto(site + STATS)
    resume = page.locator("#venturi-paused tbody tr", has_text="shop.charge_card")
    resume.get_by_role("button", name="Resume").click()
    expect(page.locator(".messagelist")).to_contain_text("Resumed kind shop.charge_card.")
    expect(page.locator("#venturi-paused")).to_contain_text("Nothing is paused.")
    assert pauses() == []
    deadline = time.monotonic() + 180
    while (row := job_row(job_id)) is not None and row["state"] != "failed":
        assert time.monotonic() < deadline, f"the worker did not run job {job_id} again: {row}"
        time.sleep(0.2)
    assert row is not None and (row["attempt"], row["failures"]) == (before["attempt"] + 1, 1)
    page.goto(f"{site}{JOBS}{job_id}/change/")
    expect(page.locator(".field-state_history_table")).to_contain_text(
        f"attempt {before['attempt'] + 1}"
    )
    expect(page.locator(".field-state")).to_contain_text("failed")
    screenshot(page, "operator-3-run-again")

    # With `manage_schedules`, the schedule runs now, through its confirmation.
    _, jobs_before = schedule_state()
    page.goto(site + PERIODIC)
    page.locator(f"tr.venturi-schedule[data-kind='{SCHEDULE}']").get_by_role(
        "link", name="Run now"
    ).click()
    expect(page.get_by_role("heading", name="Run this schedule's task now?")).to_be_visible()
    page.click("input[type=submit][value='Yes, run now']")
    message = page.locator(".messagelist")
    enqueued_now = rf"{re.escape(SCHEDULE)}: job #\d+ enqueued to run now\."
    expect(message).to_contain_text(re.compile(enqueued_now, re.IGNORECASE))  # the admin's capfirst
    run_id = int(re.findall(r"job #(\d+)", message.inner_text())[0])
    assert schedule_state()[1] == jobs_before + 1
    [enqueued] = query("SELECT kind FROM django_venturi_job WHERE id = %s", run_id)
    assert enqueued["kind"] == SCHEDULE
    [logged] = query(
        "SELECT u.username, e.change_message FROM django_admin_log e"
        " JOIN auth_user u ON u.id = e.user_id WHERE e.object_id = %s ORDER BY e.id DESC",
        SCHEDULE,
    )
    assert logged == {"username": "operator", "change_message": f"Ran now: job #{run_id}."}
    page.close()
