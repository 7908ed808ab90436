"""The testing how-to's example, docs/examples/test_signups.py, run as part of the suite.

That module is a project's own test module: it needs nothing from this suite but
pytest-django's fixtures and the `venturi_queue` fixture of django-venturi's pytest
plugin. Its tests (and its fixture) are collected here, with no marker of ours, so
they run exactly as they would in a project.
"""

import re

from docs.examples.test_signups import *  # noqa: F403
from tests.conftest import ROOT


def test_the_guide_quotes_this_example_word_for_word() -> None:
    """Every Python block of the guide's testing section is a piece of the module run here."""
    guide = (ROOT / "docs" / "guide.md").read_text()
    section = guide[guide.index("## 17. Testing your tasks") : guide.index("## 18.")]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    example = (ROOT / "docs" / "examples" / "test_signups.py").read_text()
    assert len(blocks) >= 6
    for block in blocks:
        assert block in example, f"not in docs/examples/test_signups.py:\n{block}"
