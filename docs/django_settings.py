"""Django settings for building the docs: autodoc imports the models, so Django must be set up.

SQLite in memory, nothing to connect to: the build needs no DATABASE_URL.
"""

SECRET_KEY = "docs-build-only-not-secret"  # noqa: S105
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django_venturi",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": ":memory:",
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
