"""Settings of the Wagtail check (`tox -e wagtail`): the test suite's settings plus the
Wagtail apps whose own background tasks run through the Tasks API on venturi workers."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, RUN_SUFFIX

INSTALLED_APPS = [
    *INSTALLED_APPS,
    "taggit",
    "wagtail",
    "wagtail.admin",
    "wagtail.users",
    "wagtail.documents",
    "tests.wagtail_check.site",
]

# The test process and its worker subprocesses share this: a worker deletes a document's
# file from the storage that Wagtail deconstructs into the task's arguments.
MEDIA_ROOT = str(Path(tempfile.gettempdir()) / f"venturi-wagtail-media{RUN_SUFFIX}")
MEDIA_URL = "/media/"
STATIC_URL = "/static/"

WAGTAIL_SITE_NAME = "venturi check"
WAGTAILADMIN_BASE_URL = "http://localhost"
