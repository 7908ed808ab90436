"""A stand-in for a reusable third-party app that runs background work through Django's
Tasks API only (as Wagtail does with the django-tasks backport): it knows nothing of
venturi, and the project's TASKS setting decides where its tasks run."""
