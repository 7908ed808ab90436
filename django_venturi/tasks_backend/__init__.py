"""Django Tasks (`django.tasks`, or the `django-tasks` backport) on venturi's queue.

The backend (`backend.VenturiBackend`, also importable as
`django_venturi.backend.VenturiBackend`), the runner the worker calls for
Django Tasks jobs, and the shim over the two Tasks frameworks.

May import: `store/` and `payloads/`. Never `worker/` or `admin/`.
"""
