"""Sphinx configuration: MyST markdown pages, the furo theme, autodoc for the API reference.

Build (warnings are errors):

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's django_venturi, and docs.examples

# autodoc imports the models: Django must be configured, with a database that needs no server.
os.environ["DJANGO_SETTINGS_MODULE"] = "docs.django_settings"
django.setup()

import django_venturi  # noqa: E402 - needs django.setup() first

project = "django-venturi"
author = "django-venturi developers"
copyright = "django-venturi developers"
version = release = django_venturi.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_include", "examples", "**/__pycache__"]

# MyST: `(#7-reliability)` links in guide.md point at headings; give headings down to
# level 4 their GitHub-style anchors so those links resolve on the site too.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]

# The guide's lifecycle section has a ```mermaid block for readers on GitHub, which
# renders it. Pygments has no mermaid lexer; show it as plain text (the site's
# lifecycle page has the drawn diagram).
# Unlabelled fences: try Python, and fall back to plain text without a warning.
highlight_language = "default"


def _mermaid_as_text(app: object) -> None:
    from pygments.lexers.special import TextLexer
    from sphinx.highlighting import lexers

    lexers["mermaid"] = TextLexer()


# Docstrings are reStructuredText; they quote names in single backticks, meaning code.
default_role = "literal"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options: dict[str, object] = {}  # each directive in api.md lists its members

html_theme = "furo"
html_title = f"django-venturi {release}"
html_static_path = ["_static"]


def _model_fields(
    app: object, what: str, name: str, obj: object, options: object, lines: list[str]
) -> None:
    """List a model's database fields under its docstring, with their help texts."""
    from django.db import models

    if what != "class" or not (isinstance(obj, type) and issubclass(obj, models.Model)):
        return
    lines.extend(["", "Fields:", ""])
    for field in obj._meta.concrete_fields:
        help_text = f": {field.help_text}" if field.help_text else ""
        lines.append(f"- ``{field.attname}`` ({type(field).__name__}){help_text}")
    lines.append("")


def setup(app: object) -> None:
    app.connect("builder-inited", _mermaid_as_text)  # type: ignore[attr-defined]
    app.connect("autodoc-process-docstring", _model_fields)  # type: ignore[attr-defined]
