"""The testing how-to's example, docs/examples/test_signups.py, run as part of the suite.

That module is a project's own test module: it needs nothing from this suite but
pytest-django's fixtures and the `venturi_queue` fixture of django-venturi's pytest
plugin. Its tests (and its fixture) are collected here, with no marker of ours, so
they run exactly as they would in a project.
"""

from docs.examples.test_signups import *  # noqa: F403
