"""Every environment variable the package reads is registered in ``vitplast_tune.environment`` and read through it:
no module reads ``os.environ`` itself, a name read is registered (the reference page, generated from the registry,
names it), and the SLURM script's own variables are on that page too."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
import yaml

from vitplast_tune import environment
from vitplast_tune.records import tracking
from vitplast_tune.run import tuner

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vitplast_tune"


def environ_reads(tree: ast.AST) -> list[int]:
    """Lines that read ``os.environ`` by name: ``.get``, ``os.getenv``, ``os.environ[NAME]``, ``NAME in os.environ``."""

    def is_environ(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and is_environ(node.func.value) or node.func.attr == "getenv":
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Subscript)
            and is_environ(node.value)
            and isinstance(node.ctx, ast.Load)
            or isinstance(node, ast.Compare)
            and any(is_environ(c) for c in node.comparators)
        ):
            lines.append(node.lineno)
    return lines


def registry_reads(path: Path, tree: ast.AST) -> list[tuple[str | None, int]]:
    """The names passed to ``environment.read`` / ``is_set`` in a module: a literal or a module-level constant
    (None where the name is computed at run time)."""
    module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        if node.func.attr not in ("read", "is_set") or getattr(node.func.value, "id", None) != "environment":
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant):
            found.append((arg.value, node.lineno))
        elif isinstance(arg, ast.Name) and isinstance(getattr(module, arg.id, None), str):
            found.append((getattr(module, arg.id), node.lineno))
        else:
            found.append((None, node.lineno))
    return found


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "environment.py" or p.parent != PACKAGE)


def test_no_module_reads_the_environment_but_through_the_registry():
    reads = {str(p.relative_to(ROOT)): environ_reads(ast.parse(p.read_text())) for p in modules()}
    assert {path: lines for path, lines in reads.items() if lines} == {}


def test_every_name_the_package_reads_is_registered():
    names, computed = set(), []
    for path in modules():
        for name, line in registry_reads(path, ast.parse(path.read_text())):
            if name is None:
                computed.append(f"{path.relative_to(ROOT)}:{line}")
            else:
                names.add(name)
    assert names and names <= set(environment.VARIABLES), sorted(names - set(environment.VARIABLES))
    # The names computed at run time: Tune's settings while a search runs (tuner.tune_environment) and MLflow's bounds
    # on its calls (tracking.bounded_calls), all registered.
    assert sorted(c.split(":")[0] for c in computed) == [
        "vitplast_tune/records/tracking.py",
        "vitplast_tune/run/tuner.py",
    ]
    assert {*tuner.TUNE_SETTINGS, tuner.PENDING_ENV, *tracking.BOUNDED_ENV} <= set(environment.VARIABLES)
    assert {"VITPLAST_RESULTS_DIR", "VITPLAST_CACHE_DIR", "MLFLOW_TRACKING_URI"} <= names


def test_an_unregistered_name_cannot_be_read(monkeypatch):
    monkeypatch.setenv("VITPLAST_RESULTS_DIR", "/somewhere")
    assert environment.read("VITPLAST_RESULTS_DIR") == "/somewhere" and environment.is_set("VITPLAST_RESULTS_DIR")
    with pytest.raises(KeyError, match="VITPLAST_NOT_A_VARIABLE is not registered"):
        environment.read("VITPLAST_NOT_A_VARIABLE")


def test_the_slurm_scripts_variables_are_registered():
    script = (ROOT / "scripts" / "cluster" / "slurm.sbatch").read_text()
    read = set(re.findall(r"\$\{(VITPLAST_[A-Z_]+):-", script))  # a variable the user may set, with its default
    assert read and read == set(environment.SCRIPT_VARIABLES)


def test_the_reference_page_is_generated_from_the_registry():
    import sys

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import environment_reference
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    page = (ROOT / "docs" / "reference" / "environment.md").read_text()
    built = environment_reference.on_page_markdown(page, None, None, None)
    assert environment_reference.MARKER in page and environment_reference.MARKER not in built
    for v in [*environment.VARIABLES.values(), *environment.SCRIPT_VARIABLES.values()]:
        assert f"| `{v.name}` | {v.what.replace('|', chr(92) + '|')} |" in built
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    reference = next(item["Reference"] for item in nav if "Reference" in item)
    assert {"Environment variables": "reference/environment.md"} in reference
