"""doc/python.md's account of this suite against the suite itself."""

import os
import re

import pytest

from conftest import COLLECTED

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "doc", "python.md")


def test_doc_counts_the_tests(request):
    config = request.config
    if config.option.keyword or config.option.markexpr or [os.path.basename(a) for a in config.args] != ["tests"]:
        pytest.skip("a part of the suite is running, not the whole of it")
    with open(DOC, encoding="utf-8") as doc:
        stated = re.search(r"Its (\d+) tests", doc.read())
    assert stated, "doc/python.md no longer says how many tests the suite has"
    assert int(stated.group(1)) == config.stash[COLLECTED], "doc/python.md's count of the Python tests"
