"""Settings of the test suite: PostgreSQL (DATABASE_URL, Docker or embedded), plus SQLite."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import django
import environ

from tests.database import postgres_url
from tests.run_databases import run_suffix

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "tests-only-not-secret"
# Worker subprocesses of a test may run with a rotated key (tests/test_django_tasks.py).
SECRET_KEY = os.environ.get("VENTURI_TEST_SECRET_KEY", SECRET_KEY)
SECRET_KEY_FALLBACKS = json.loads(os.environ.get("VENTURI_TEST_SECRET_KEY_FALLBACKS", "[]"))
DEBUG = False
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_venturi",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# Test users' passwords: a hash that costs nothing. The default (PBKDF2, a million
# rounds) cost about 0.4 s for each user made and each login, a minute of the suite.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Two runs at once (tox envs, a developer beside CI) need their own test databases: each
# run's names end with VENTURI_TEST_RUN, picked anew when unset (tests/run_databases.py).
RUN_SUFFIX = run_suffix()
SQLITE_PATH = BASE_DIR / f"venturi-tests{RUN_SUFFIX}.sqlite3"

DATABASES = {
    "default": {
        **environ.Env.db_url_config(postgres_url()),
        "TEST": {"NAME": f"test_venturi{RUN_SUFFIX}"},
    },
    "sqlite": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(SQLITE_PATH),
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
        "TEST": {"NAME": str(SQLITE_PATH.with_name("test_" + SQLITE_PATH.name))},
    },
}

# MariaDB or MySQL as a third job database, when VENTURI_TEST_MARIADB_URL names a server
# (e.g. mysql://root@127.0.0.1:3306/venturi): the `alias` fixture then runs the
# backend-neutral tests on it too, in a test database of this run's own.
MARIADB_URL = os.environ.get("VENTURI_TEST_MARIADB_URL")
if MARIADB_URL:
    DATABASES["mariadb"] = {
        **environ.Env.db_url_config(MARIADB_URL),
        "TEST": {"NAME": f"test_venturi{RUN_SUFFIX}", "CHARSET": "utf8mb4"},
    }

# Worker subprocesses started by the tests connect to the test databases directly.
for alias, name in json.loads(os.environ.get("VENTURI_TEST_DATABASE_NAMES", "{}")).items():
    DATABASES[alias]["NAME"] = name

# Worker subprocesses on a private cluster (tests/cluster_workers.py) get `default` from
# DATABASE_URL, and may be given a separate connection to LISTEN on (LISTEN_DATABASE).
LISTEN_URL = os.environ.get("VENTURI_TEST_LISTEN_URL")
if LISTEN_URL:
    DATABASES["listen"] = environ.Env.db_url_config(LISTEN_URL)

# Worker subprocesses of tests/test_pgbouncer.py: `default` goes through PgBouncer in
# transaction mode, and the listener gets the direct connection LISTEN needs.
PGBOUNCER_PORT = os.environ.get("VENTURI_TEST_PGBOUNCER_PORT")
if PGBOUNCER_PORT:
    DATABASES["direct"] = dict(DATABASES["default"])
    DATABASES["default"] = {**DATABASES["default"], "HOST": "127.0.0.1", "PORT": PGBOUNCER_PORT}

# Worker subprocesses of tests/test_frozen_claimer.py may reach `default` through a TCP
# proxy of the test's, which keeps a dead worker's server connections open (a lost host).
PROXY_PORT = os.environ.get("VENTURI_TEST_PROXY_PORT")
if PROXY_PORT:
    DATABASES["default"] = {**DATABASES["default"], "HOST": "127.0.0.1", "PORT": PROXY_PORT}

# The documentation's examples (docs/examples/) run in tests/test_docs_examples.py, so
# worker subprocesses must know their tasks; their kinds all start with "docs.".
# Not docs.examples.periodic: its schedules would make every worker of the suite enqueue
# its ticks (its test lists it for its own worker only).
DOCS_EXAMPLE_TASK_MODULES = [
    f"docs.examples.{name}"
    for name in (
        "quickstart",
        "payloads",
        "enqueueing",
        "outcomes",
        "scheduling",
        "flow_control",
        "dedup",
        "long_running",
        "workflows",
    )
]
# The Tasks how-to's example: it imports only where a Tasks framework is installed (the
# settings below), and its @task functions must be in a module that workers may import.
if importlib.util.find_spec("django_tasks") is not None or django.VERSION >= (6, 0):
    DOCS_EXAMPLE_TASK_MODULES += ["docs.examples.django_tasks"]
# Worker subprocesses run the docs' e-mail task: keep its mail in memory.
if django.VERSION >= (6, 1):  # MAILERS replaces EMAIL_BACKEND from Django 6.1
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
else:
    EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"

VENTURI = {
    "TASK_MODULES": [
        "tests.testapp.scheduling_tasks",
        "tests.testapp.dedup_tasks",
        "tests.testapp.control_tasks",
        "tests.testapp.workflow_tasks",
        "tests.testapp.hardening_tasks",
        "tests.testapp.text_tasks",
        "tests.testapp.flow_tasks",
        "tests.testapp.limit_tasks",
        *DOCS_EXAMPLE_TASK_MODULES,
    ],
    "POLL_INTERVAL": 0.2,
    "TIMEOUT_GRACE": 1,
    "RESCUE_INTERVAL": 0.5,
}
if PGBOUNCER_PORT:
    VENTURI["LISTEN_DATABASE"] = "direct"
# Worker subprocesses of a test can be given more settings (e.g. RETENTION) as JSON.
VENTURI.update(json.loads(os.environ.get("VENTURI_TEST_SETTINGS", "{}")))
if LISTEN_URL:
    VENTURI["LISTEN_DATABASE"] = "listen"

# Periodic schedules for the worker subprocesses of tests/test_periodic.py only.
if os.environ.get("VENTURI_TEST_PERIODIC"):
    VENTURI["PERIODIC"] = json.loads(os.environ["VENTURI_TEST_PERIODIC"])
    VENTURI["PERIODIC_INTERVAL"] = 0.1

# Django's Tasks framework on venturi (tests/test_django_tasks.py): Django 6's own
# `django.tasks`, the django-tasks backport, or both at once; neither: no TASKS.
HAS_BACKPORT = importlib.util.find_spec("django_tasks") is not None
if HAS_BACKPORT:
    INSTALLED_APPS += ["django_tasks"]
if HAS_BACKPORT or django.VERSION >= (6, 0):
    INSTALLED_APPS += ["tests.thirdparty"]
    TASKS = {
        "default": {
            "BACKEND": "django_venturi.backend.VenturiBackend",
            "QUEUES": ["default", "emails"],
        },
        "retrying": {
            "BACKEND": "django_venturi.backend.VenturiBackend",
            "OPTIONS": {"MAX_ATTEMPTS": 3},
        },
        "sqlite": {
            "BACKEND": "django_venturi.backend.VenturiBackend",
            "OPTIONS": {"DATABASE": "sqlite"},
        },
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_venturi": {"handlers": ["stderr"], "level": "INFO"},
        # The Tasks frameworks' own records of failed tasks, with their tracebacks.
        "django.tasks": {"handlers": ["stderr"], "level": "ERROR", "propagate": False},
        "django_tasks": {"handlers": ["stderr"], "level": "ERROR", "propagate": False},
    },
}
if os.environ.get("VENTURI_TEST_WORKER_LOG"):
    # A project that configures no logging: `venturi_worker` sets up its own stderr log.
    LOGGING = {"version": 1, "disable_existing_loggers": False}
