"""The installed package: its own libiha.so.0, whose dependencies the dynamic loader finds
without help, and the devices it sees."""

import os
import shutil
import subprocess

import pytest

import iha
from iha import _lib


def test_library_ships_in_the_package():
    if os.environ.get("IHA_LIBRARY"):
        pytest.skip("IHA_LIBRARY names another library")
    path = _lib.lib._name
    assert os.path.dirname(path) == os.path.dirname(os.path.abspath(iha.__file__))
    assert iha.__version__.count(".") == 2


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_library_dependencies_resolve():
    listing = subprocess.run(["ldd", _lib.lib._name], capture_output=True, text=True, check=True).stdout
    assert "not found" not in listing
    assert "libOpenCL.so.1" in listing


def test_devices():
    found = iha.devices()
    assert found and all(d.selector.count(":") == 1 and d.name for d in found)
