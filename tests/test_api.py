"""The package's public API: one obvious name per verb, loaded lazily, and no import cycle inside."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vitplast_tune"


def test_importing_the_package_loads_no_heavy_module():
    code = "import sys, vitplast_tune; print(sorted(m for m in ('torch', 'ray', 'mlflow', 'timm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_public_names_resolve_to_the_documented_objects():
    import vitplast_tune as vt
    from vitplast_tune import errors
    from vitplast_tune.search import driver, plan, spaces
    from vitplast_tune.vit import best_model, models, training

    assert vt.run_search is driver.run and vt.SearchOptions is plan.SearchOptions
    assert vt.load_space is spaces.load_space and vt.finetune is training.finetune
    assert vt.create_model is models.create_model and vt.UserError is errors.UserError
    assert vt.load_best_model is best_model.load_best_model
    assert set(vt.__all__) <= set(dir(vt))
    spec = vt.load_space("component_subsets")
    assert spec.algorithm == "optuna"


def _imports(path: Path) -> set[str]:
    """The package modules a module imports (at any depth of its body)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vitplast_tune"):
            if node.module == "vitplast_tune":
                found |= {alias.name for alias in node.names}
            else:
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("vitplast_tune.")}
    return found


def test_no_import_cycle_inside_the_package():
    graph = {p.stem: _imports(p) - {p.stem} for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            assert state.get(nxt) != 1, f"import cycle: {' -> '.join(path + [node, nxt])}"
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_every_module_names_what_it_owns():
    for path in PACKAGE.glob("*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and len(doc.split()) >= 5, f"{path.name} has no module docstring"
