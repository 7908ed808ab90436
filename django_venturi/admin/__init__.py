"""The Django admin as the queue's dashboard: browse jobs, act on them, watch the queue.

Django imports this package (admin autodiscovery); importing it registers the
model admins. Nothing in django_venturi imports it. It may import everything
else: it is the top of the house.

- `jobs`: `JobAdmin`, the job list and a job's page, and the URLs of the extra pages;
- `journal`: `JournalEntryAdmin`, every run of every job, read-only;
- `periodic`: the periodic tasks' page: next runs, last run, enabled or not;
- `schedule_actions`: its run now, disable and enable, their confirmation page and permission;
- `job_list`: the job list's estimated count, filters, search and columns' rules;
- `filters`: the error type, kind and date filters of the job list and the journal;
- `error_groups`: the current errors grouped by type and first line, with links;
- `bulk_actions`: retry all and cancel all in this filter, in batches;
- `job_page`: a job's page: its form, journal inline, state history, workflow links;
- `actions`: retry now and cancel, their confirmation page and the job page's buttons;
- `cleanup`: the cleanup page for old finished jobs;
- `stats`: the stats page: live counts, latency, orphans, the last hour and its chart;
- `pauses`: the stats page's pause and resume buttons;
- `display`: the small formatting helpers the pages share (times, ages, cut cells, JSON);
- `breadcrumbs`: the own pages' breadcrumbs, in the running Django admin's own markup.
"""

from django_venturi.admin import jobs, journal, periodic  # noqa: F401 - registers the admins
