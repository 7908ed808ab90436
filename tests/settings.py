"""Settings of the test suite: PostgreSQL from DATABASE_URL (or testcontainers), plus SQLite."""

from __future__ import annotations

import json
import os
from pathlib import Path

import environ

from tests.database import postgres_url

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "tests-only-not-secret"
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

# Two runs at once (tox envs, a developer beside CI) need their own test databases.
RUN_SUFFIX = os.environ.get("VENTURI_TEST_RUN", "")
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

# Worker subprocesses started by the tests connect to the test databases directly.
for alias, name in json.loads(os.environ.get("VENTURI_TEST_DATABASE_NAMES", "{}")).items():
    DATABASES[alias]["NAME"] = name

VENTURI = {
    "TASK_MODULES": ["tests.testapp.scheduling_tasks", "tests.testapp.dedup_tasks"],
    "POLL_INTERVAL": 0.2,
    "RESCUE_INTERVAL": 0.5,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_venturi": {"handlers": ["stderr"], "level": "INFO"}},
}
