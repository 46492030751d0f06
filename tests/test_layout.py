"""The shape of the house: the torch boundary the folder tree shows, arrows between packages pointing only down the
floors, no import cycle, short functions, light subpackage faces. The boundary and the floors are each checked on a
copy of the package with a planted violation too."""

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
# The floors of the house, top down: a package imports only packages on lower floors (every import counted, those
# inside functions and under TYPE_CHECKING too). The ground floor holds the root's modules and _compat.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("__main__",),
    ("cli",),
    ("labs",),  # the criteria lab: runs searches, and times them as workflows' dry run does
    ("workflows",),
    ("run",),
    ("recommend",),
    ("records", "plan"),
    ("analysis",),
    ("predictors",),
    ("vit",),
    ("data", "space"),
)


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
    assert "vitplast_tune.run.driver" in modules and "vitplast_tune.cli" in modules
    assert not any(m.startswith("vitplast_tune.vit.") for m in modules)
    assert loaded_after_import(modules) == []


def test_the_boundary_check_fails_when_a_driver_module_imports_torch(tmp_path):
    """The same check on a copy of the package where one driver-side module imports torch at the top."""
    shutil.copytree(PACKAGE, tmp_path / "vitplast_tune", ignore=shutil.ignore_patterns("__pycache__", "weights"))
    spaces = tmp_path / "vitplast_tune" / "space" / "files.py"
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


def floor_of(unit: str) -> int:
    """The floor of a package or root module (0 is the top; the ground floor, root modules, is ``len(FLOORS)``)."""
    return next((i for i, floor in enumerate(FLOORS) if unit in floor), len(FLOORS))


def package_arrows(package: Path = PACKAGE) -> set[tuple[str, str]]:
    """(importer, imported) of every import between the package's subpackages and root modules, each named by its
    first part under ``vitplast_tune`` ("run", "config", ...)."""
    arrows = set()
    for path in package.rglob("*.py"):
        here = path.relative_to(package).with_suffix("").parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vitplast_tune"):
                parts = node.module.split(".")
                targets = [parts[1]] if len(parts) > 1 else [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".")[1] for a in node.names if a.name.startswith("vitplast_tune.")]
            else:
                continue
            arrows |= {(here, t) for t in targets if t != here and t != "__version__"}
    return arrows


def upward(arrows: set[tuple[str, str]]) -> list[str]:
    """The arrows that do not point to a lower floor (siblings on one floor importing each other count)."""
    ground = len(FLOORS)
    bad = [(a, b) for a, b in arrows if not (floor_of(b) > floor_of(a) or floor_of(a) == floor_of(b) == ground)]
    return sorted(f"{a} -> {b}" for a, b in bad)


def test_arrows_between_packages_point_down_the_floors():
    arrows = package_arrows()
    assert ("run", "records") in arrows and ("workflows", "run") in arrows  # the check reads real imports
    assert upward(arrows) == []


def test_the_floors_check_fails_on_a_planted_upward_import(tmp_path):
    """records importing run (inside a function, as a lazy import would) is an arrow up a floor, and a cycle."""
    shutil.copytree(PACKAGE, tmp_path / "vitplast_tune", ignore=shutil.ignore_patterns("__pycache__", "weights"))
    trials = tmp_path / "vitplast_tune" / "records" / "table.py"
    trials.write_text(trials.read_text() + "\n\ndef planted():\n    from vitplast_tune.run import driver\n")
    arrows = package_arrows(tmp_path / "vitplast_tune")
    assert upward(arrows) == ["records -> run"] and ("run", "records") in arrows


def test_subpackage_faces_load_nothing_until_asked():
    """Each subpackage's face names its exports (``__all__``) and imports only lazy_loader; importing it loads none
    of its modules, and each name it exports resolves."""
    for init in sorted(PACKAGE.rglob("__init__.py")):
        if init.parent in (PACKAGE, PACKAGE / "cli"):  # the package's own face (lazy too), and the command
            continue
        body = ast.parse(init.read_text()).body
        imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert all(isinstance(n, ast.Import) and n.names[0].name == "lazy_loader" for n in imports), init
    faces = sorted(module_name(p) for p in PACKAGE.rglob("__init__.py") if p.parent not in (PACKAGE, PACKAGE / "cli"))
    code = (
        "import importlib, json, sys\n"
        f"faces = {faces!r}\n"
        "loaded = {f: sorted(m for m in sys.modules if m.startswith(f + '.')) for f in faces if importlib.import_module(f)}\n"
        "exports = {f: sorted(getattr(sys.modules[f], '__all__', [])) for f in faces}\n"
        "print(json.dumps([loaded, exports]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    loaded, exports = json.loads(out.stdout)
    assert {f: m for f, m in loaded.items() if m} == {}
    for face, names in exports.items():
        module = __import__(face, fromlist=["_"])
        assert all(getattr(module, name) is not None for name in names), face
        # A name that is also a submodule's would turn into that module once the submodule is imported.
        submodules = {p.stem for p in Path(module.__file__).parent.glob("*.py")} | {"__init__"}
        assert not submodules & set(names), (face, submodules & set(names))


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
