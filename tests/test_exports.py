"""Every name a face exports imports: ``__all__`` of the package and of each subpackage, each name fetched in a fresh
interpreter (a lazy face fails only when a name is used), and ``from vitplast_tune import *`` works."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vitplast_tune"
FACES = ["vitplast_tune"] + sorted(
    f"vitplast_tune.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py") if "__all__" in p.read_text()
)

FETCH = """
import importlib, json, sys
face = importlib.import_module(sys.argv[1])
broken = {}
for name in face.__all__:
    try:
        getattr(face, name)
    except Exception as exc:
        broken[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"all": list(face.__all__), "broken": broken}))
"""


def fetch(face: str) -> dict:
    out = subprocess.run([sys.executable, "-c", FETCH, face], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.slow  # a child process or a server of its own
@pytest.mark.parametrize("face", FACES)
def test_every_name_in_a_faces_all_imports(face):
    found = fetch(face)
    assert found["broken"] == {}, found["broken"]
    assert len(found["all"]) == len(set(found["all"])), "a name is exported twice"


def test_the_faces_are_the_subpackages_with_an_all():
    assert {"vitplast_tune", "vitplast_tune.records", "vitplast_tune.run", "vitplast_tune.vit"} <= set(FACES)


@pytest.mark.slow  # a child process or a server of its own
def test_star_import_of_the_package_works():
    code = "from vitplast_tune import *; import vitplast_tune as vt; print(sorted(set(vt.__all__) - set(dir())))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
