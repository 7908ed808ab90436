"""Not collected by the suite (not `test_*.py`): tests/test_allowed_skips.py runs it in a
pytest of its own, to see what a skip no allowed skip names does to a run."""

import pytest


def test_that_skips_for_a_reason_no_allowed_skip_names() -> None:
    pytest.skip("a reason tests/skips.py does not name")


def test_that_passes() -> None:
    assert True
