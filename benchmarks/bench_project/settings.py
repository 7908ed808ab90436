"""Django settings of the benchmark project: one PostgreSQL database named by the environment.

VENTURI_BENCH_DB      database name (the harness creates and drops it)
VENTURI_BENCH_SINK    the sink file the handler appends to
VENTURI_BENCH_HOST, VENTURI_BENCH_PORT, VENTURI_BENCH_USER, VENTURI_BENCH_PASSWORD
                      the server (default 127.0.0.1:5432, user postgres, trust auth;
                      always TCP, never a Unix socket)
VENTURI_BENCH_CONN_MAX_AGE  Django CONN_MAX_AGE (default 0, Django's default)
VENTURI_BENCH_HISTORY=0     VENTURI["HISTORY"] off (`flow_control.py`'s history_off variant)

VENTURI is otherwise left at the library's defaults; the worker's flags change what a run needs.
LOGGING is not set, so `venturi_worker` configures its own stderr logging (INFO at -v 1).
"""

from __future__ import annotations

import os

SECRET_KEY = "benchmarks-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS: list[str] = []

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_venturi",
    "benchmarks.bench_project.benchapp",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("VENTURI_BENCH_DB", "venturi_bench"),
        "USER": os.environ.get("VENTURI_BENCH_USER", "postgres"),
        "PASSWORD": os.environ.get("VENTURI_BENCH_PASSWORD", ""),
        "HOST": os.environ.get("VENTURI_BENCH_HOST", "127.0.0.1"),
        "PORT": os.environ.get("VENTURI_BENCH_PORT", "5432"),
        "CONN_MAX_AGE": int(os.environ.get("VENTURI_BENCH_CONN_MAX_AGE", "0")),
    }
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if os.environ.get("VENTURI_BENCH_HISTORY") == "0":
    VENTURI = {"HISTORY": False}
