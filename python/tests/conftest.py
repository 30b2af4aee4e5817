"""Shared fixtures: one context per device choice for the whole suite (building programs is the
slow part), on the device IHA_DEVICE names (the library's default otherwise)."""

import pytest

import iha


@pytest.fixture(scope="package")
def context():
    with iha.Context() as ctx:
        yield ctx


@pytest.fixture(scope="package")
def copying_context():
    """A context that copies host arrays to device buffers and back, whatever the device."""
    with iha.Context(host_pointers=False) as ctx:
        yield ctx



# The number of tests collected, for test_docs.py's check of doc/python.md (which runs only when
# nothing is deselected, so the count here is the suite's).
COLLECTED = pytest.StashKey[int]()


def pytest_collection_modifyitems(config, items):
    config.stash[COLLECTED] = len(items)
