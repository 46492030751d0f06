"""The shape of the house: the torch boundary the folder tree shows, no import cycle, short functions, light
subpackage faces."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vitplast_tune"
TORCH_SIDE = ("vit", "data")  # the subpackages that may import torch, timm and torchvision at the top
TORCH_FREE_THERE = (  # what the driver uses there: a decoded dataset it unpickles; the files it stages
    "vitplast_tune.data.decoded",
    "vitplast_tune.data.staging",
)
HEAVY = ("torch", "timm", "torchvision")
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> list[str]:
    return sorted(module_name(p) for p in PACKAGE.rglob("*.py"))


def driver_side_modules() -> list[str]:
    side = tuple(f"vitplast_tune.{p}." for p in TORCH_SIDE)
    return [m for m in package_modules() if not m.startswith(side) or m in TORCH_FREE_THERE]


def loaded_after_import(modules: list[str], root: Path = ROOT) -> list[str]:
    """The heavy modules a fresh interpreter holds after importing ``modules`` (the package found in ``root``)."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root, env=env)
    return json.loads(out.stdout)


def test_the_driver_side_of_the_package_imports_no_torch():
    modules = driver_side_modules()
    assert "vitplast_tune.search.driver" in modules and "vitplast_tune.cli" in modules
    assert not any(m.startswith("vitplast_tune.vit.") for m in modules)
    assert loaded_after_import(modules) == []


def test_the_boundary_check_fails_when_a_driver_module_imports_torch(tmp_path):
    """The same check on a copy of the package where one driver-side module imports torch at the top."""
    shutil.copytree(PACKAGE, tmp_path / "vitplast_tune", ignore=shutil.ignore_patterns("__pycache__", "weights"))
    spaces = tmp_path / "vitplast_tune" / "search" / "spaces.py"
    spaces.write_text(spaces.read_text().replace("import yaml\n", "import torch  # planted\nimport yaml\n", 1))
    assert loaded_after_import(driver_side_modules(), root=tmp_path) == ["torch"]


def imports_of(path: Path) -> set[str]:
    """The package modules that a file imports (at any depth of its code), resolved to module names."""
    names = set(package_modules())
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vitplast_tune"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in names else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in names)
    return found & names


def test_no_import_cycle():
    graph = {module_name(p): imports_of(p) - {module_name(p)} for p in PACKAGE.rglob("*.py")}
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}  # a package's face
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                pytest.fail("import cycle: " + " -> ".join([*path[path.index(dep) :], dep]))
            if dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_subpackage_faces_import_nothing():
    for init in PACKAGE.rglob("__init__.py"):
        if init.parent == PACKAGE:
            continue  # the package's own face loads names lazily (PEP 562)
        body = ast.parse(init.read_text()).body
        assert not [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))], init


@pytest.mark.parametrize("folder", ["vitplast_tune", "benchmarks"])
def test_no_function_is_longer_than_a_screen(folder):
    long = []
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long
