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
