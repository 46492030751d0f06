"""Write tests/file_costs.json, the seconds each test file took, from a JUnit XML report of a whole run.

    python -m pytest --junitxml=/tmp/junit.xml && python tests/_costs.py /tmp/junit.xml

``tests/conftest.py`` hands the files to the two workers costliest first, so that both end together; refresh the
costs when a file's share of the run changes much (a new end-to-end test, a search made smaller).
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

COSTS = Path(__file__).with_name("file_costs.json")


def costliest_first(items: list, costs: dict[str, float]) -> None:
    """Sort the test ``items`` in place by their file's cost in ``costs``, costliest first; a file's tests keep their
    order, and a file ``costs`` lacks counts as free."""
    items.sort(key=lambda item: -costs.get(item.nodeid.split("::")[0], 0.0))  # a stable sort


def load_costs() -> dict[str, float]:
    """The costs in tests/file_costs.json (none when it is missing)."""
    return json.loads(COSTS.read_text()) if COSTS.is_file() else {}


def file_costs(junit: Path) -> dict[str, float]:
    """Sum the seconds of each test file's tests (setup, call and teardown) in the JUnit report ``junit``."""
    costs: Counter[str] = Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        path = "/".join(part for part in module if part[:1].islower()) + ".py"  # drop a test class's name
        costs[path] += float(case.get("time", 0.0))
    return {path: round(seconds, 1) for path, seconds in sorted(costs.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    COSTS.write_text(json.dumps(file_costs(Path(sys.argv[1])), indent=0) + "\n")
    print(f"wrote {COSTS}")
