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


def test_default_context_saves_its_programs_at_exit(tmp_path):
    """The default context is freed at exit, which writes the programs it built to the disk
    cache: the next process loads them instead of compiling."""
    import sys

    code = ("import numpy as np, iha\n"
            "q = np.linspace(-1, 1, 2 * 8 * 4, dtype=np.float32).reshape(1, 2, 8, 4)\n"
            "o, lse = iha.attention(q, q, q, pseudo=2)\n"
            "assert np.isfinite(o).all()\n")
    env = dict(os.environ, IHA_CACHE_DIR=str(tmp_path / "cache"), IHA_PROFILE="off")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    written = [p.name for p in (tmp_path / "cache").iterdir() if p.name.endswith(".clbin")]
    assert written, "no program binary in the cache after the process ended"
