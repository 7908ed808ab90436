"""The Django Tasks backend's public path, as settings name it.

    TASKS = {"default": {"BACKEND": "django_venturi.backend.VenturiBackend"}}

The backend itself lives in `tasks_backend/backend.py`, beside its runner and
the frameworks shim; this module keeps the name that settings use.
"""

from django_venturi.tasks_backend.backend import VenturiBackend

__all__ = ["VenturiBackend"]
