"""The shape of the house: the floors (arrows between packages only down), the torch boundary the folder tree shows and
no import cycle inside a package, as import-linter contracts (pyproject.toml's tool.importlinter), each also broken
on a copy of the package with a planted violation; that importing the driver side loads no torch (which no static
check sees: a module may import torch at run time through another), checked in a fresh interpreter; short
functions; light subpackage faces."""

from __future__ import annotations

import ast
import collections
import json
import os
import shutil
import subprocess
import sys
import tomllib
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
MAX_MODULE_LINES = 450  # a module a newcomer reads top to bottom (issue 43)
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


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
    spaces = tmp_path / "vitplast_tune" / "space" / "reading.py"  # imports yaml at the top
    spaces.write_text(spaces.read_text().replace("import yaml\n", "import torch  # planted\nimport yaml\n", 1))
    assert loaded_after_import(driver_side_modules(), root=tmp_path) == ["torch"]


def lint_imports(root: Path = ROOT, *contracts: str) -> subprocess.CompletedProcess:
    """``lint-imports`` (import-linter) with the contracts of pyproject.toml, on the package found in ``root``; only
    ``contracts`` (their ids) when given."""
    command = [str(Path(sys.executable).parent / "lint-imports"), str(ROOT / "pyproject.toml"), "--no-cache"]
    command += [a for c in contracts for a in ("--contract", c)]
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(command, capture_output=True, text=True, cwd=root, env=env)


def contracts() -> dict[str, dict]:
    """The import-linter contracts of pyproject.toml, by id."""
    return {c["id"]: c for c in PYPROJECT["tool"]["importlinter"]["contracts"]}


def test_the_import_contracts_hold():
    """The floors (arrows only down, siblings on a floor apart), the torch boundary and no cycle inside a package,
    as import-linter reads every import (those in functions and under TYPE_CHECKING too)."""
    floors = contracts()["floors"]
    assert floors["exhaustive"] and floors["layers"][:2] == ["__main__", "cli"]  # every package declares its floor
    found = lint_imports()
    assert found.returncode == 0, found.stdout[-3000:]
    assert f"Contracts: {len(contracts())} kept, 0 broken." in found.stdout


PLANTED = {  # what is planted: (file, text appended, the contracts it breaks, what they name)
    "an arrow up": (
        "records/study.py",
        "\n\ndef planted():\n    from vitplast_tune.run import driver\n",
        {"floors", "acyclic"},  # run imports records: an arrow up a floor is a cycle too
        "vitplast_tune.records.study -> vitplast_tune.run.driver",
    ),
    "siblings on a floor": (
        "plan/state.py",
        "\n\ndef planted():\n    from vitplast_tune.records import table\n",
        {"floors"},
        "vitplast_tune.plan.state -> vitplast_tune.records.table",
    ),
    "torch on the driver side": (
        "space/files.py",
        "\n\ndef planted():\n    import torch\n",
        {"torch-boundary"},
        "vitplast_tune.space.files -> torch",
    ),
    "timm in what the driver uses of data": (
        "data/decoded.py",
        "\nimport timm  # planted\n",
        {"torch-free-data"},
        "vitplast_tune.data.decoded -> timm",
    ),
    "a cycle in a package": (
        "records/pareto.py",
        "\n\ndef planted():\n    from vitplast_tune.records import study\n",
        {"acyclic"},
        "vitplast_tune.records",
    ),
}


@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_each_import_contract_fails_on_a_planted_violation(tmp_path, planted):
    """The contracts on a copy of the package with one planted violation: the contracts it breaks, and only those,
    break, naming the import."""
    shutil.copytree(PACKAGE, tmp_path / "vitplast_tune", ignore=shutil.ignore_patterns("__pycache__", "weights"))
    relative, text, broken, named = PLANTED[planted]
    path = tmp_path / "vitplast_tune" / relative
    path.write_text(path.read_text() + text)
    if planted == "a cycle in a package":  # the way back
        study = tmp_path / "vitplast_tune" / "records" / "study.py"
        study.write_text(study.read_text() + "\n\ndef planted():\n    from vitplast_tune.records import pareto\n")
    found = lint_imports(tmp_path)
    said = " ".join(found.stdout.split())  # its lines wrapped at 80 columns
    assert found.returncode == 1, found.stdout[-3000:]
    assert f"Contracts: {len(contracts()) - len(broken)} kept, {len(broken)} broken." in said
    report = said.split("Broken contracts", 1)[1]
    assert {i for i, c in contracts().items() if c["name"] in report} == broken and named in report


def test_a_package_without_a_floor_breaks_the_floors(tmp_path):
    """A new package (here ``extra/``) must declare its floor in the one list of floors (``exhaustive``)."""
    shutil.copytree(PACKAGE, tmp_path / "vitplast_tune", ignore=shutil.ignore_patterns("__pycache__", "weights"))
    (tmp_path / "vitplast_tune" / "extra").mkdir()
    (tmp_path / "vitplast_tune" / "extra" / "__init__.py").write_text("")
    found = lint_imports(tmp_path, "floors")
    assert found.returncode == 1 and "vitplast_tune.extra" in found.stdout, found.stdout[-3000:]


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


def test_no_package_module_is_longer_than_a_read():
    """Every module of the package is short enough to read top to bottom: a longer one is split by its concepts."""
    long = {
        str(path.relative_to(ROOT)): lines
        for path in (ROOT / "vitplast_tune").rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_test_modules_have_unique_names():
    """pytest imports test modules by their file name (the tests folders are not packages): two of one name in
    different folders stop collection with "import file mismatch"."""
    names = collections.Counter(p.name for p in (ROOT / "tests").rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
