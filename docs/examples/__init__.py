"""Example code shown in the documentation; the test suite runs every piece.

tests/test_docs_examples.py runs the modules; test_signups.py is itself a test module,
collected by tests/test_docs_testing_example.py.
"""
