"""App configuration: register checks, import task modules. Nothing else at start-up."""

from __future__ import annotations

from importlib import import_module

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class VenturiConfig(AppConfig):
    name = "django_venturi"
    label = "django_venturi"
    verbose_name = "Venturi jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_venturi import (  # noqa: F401 - register the checks
            checks,
            database_support,
            migration_state,
        )
        from django_venturi.conf import venturi_settings

        autodiscover_modules("tasks")
        for module in venturi_settings.TASK_MODULES:
            import_module(module)
