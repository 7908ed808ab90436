"""Settings of the pytest process of the Wagtail check (`tox -e wagtail`): the suite's own.

The site under test is not configured here: the test makes it with `wagtail start`, and
it runs in its own processes with its own settings (test_wagtail_site.py).
"""

from __future__ import annotations

from tests.settings import *  # noqa: F403
