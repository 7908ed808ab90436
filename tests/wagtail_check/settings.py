"""Settings of the Wagtail check (`tox -e wagtail`): the test suite's settings plus the
Wagtail apps whose own background tasks run through the Tasks API on venturi workers."""

from __future__ import annotations

import os
import tempfile

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

# A fresh directory per test run, which its worker subprocesses inherit through the
# environment: a worker deletes a document's file from the storage that Wagtail
# deconstructs into the task's arguments.
if "VENTURI_TEST_MEDIA_ROOT" not in os.environ:
    prefix = f"venturi-wagtail-media{RUN_SUFFIX}-"
    os.environ["VENTURI_TEST_MEDIA_ROOT"] = tempfile.mkdtemp(prefix=prefix)
MEDIA_ROOT = os.environ["VENTURI_TEST_MEDIA_ROOT"]
MEDIA_URL = "/media/"
STATIC_URL = "/static/"

WAGTAIL_SITE_NAME = "venturi check"
WAGTAILADMIN_BASE_URL = "http://localhost"
