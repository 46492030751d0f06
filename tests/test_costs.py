"""The test files' costs read from a JUnit report, and the order the workers get the files in."""

from __future__ import annotations

from types import SimpleNamespace

from _costs import costliest_first, file_costs

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.run.test_cluster" name="test_a" time="10.5"/>
<testcase classname="tests.run.test_cluster.TestTwoNodeCluster" name="test_b" time="80.0"/>
<testcase classname="tests.test_layout" name="test_c" time="0.25"/>
<testcase classname="tests.test_layout" name="test_d" time="0.25"/>
</testsuite></testsuites>"""


def test_a_files_cost_sums_its_tests_and_its_classes_tests(tmp_path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    costs = file_costs(tmp_path / "junit.xml")
    assert costs == {"tests/run/test_cluster.py": 90.5, "tests/test_layout.py": 0.5}
    assert list(costs) == ["tests/run/test_cluster.py", "tests/test_layout.py"]  # costliest first


def test_files_are_ordered_costliest_first_each_keeping_its_tests_order():
    ids = ["tests/a.py::t1", "tests/b.py::t1", "tests/a.py::t2", "tests/new.py::t1", "tests/b.py::C::t2"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    costliest_first(items, {"tests/a.py": 3.0, "tests/b.py": 50.0})
    assert [i.nodeid for i in items] == [
        "tests/b.py::t1",
        "tests/b.py::C::t2",
        "tests/a.py::t1",
        "tests/a.py::t2",
        "tests/new.py::t1",  # not measured yet: last
    ]
