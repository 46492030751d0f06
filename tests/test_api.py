"""The package's public API: one obvious name per verb, loaded lazily; every module says what it owns."""

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
    from vitplast_tune.plan import SearchOptions
    from vitplast_tune.records.search import load_search
    from vitplast_tune.run.driver import run_search
    from vitplast_tune.space import load_space
    from vitplast_tune.vit import best_model, models, training

    assert vt.run_search is run_search and vt.SearchOptions is SearchOptions and vt.load_search is load_search
    assert vt.load_space is load_space and vt.finetune is training.finetune
    assert vt.create_model is models.create_model and vt.UserError is errors.UserError
    assert vt.load_best_model is best_model.load_best_model
    assert set(vt.__all__) <= set(dir(vt))
    spec = vt.load_space("component_subsets")
    assert spec.algorithm == "optuna"


def test_every_module_names_what_it_owns():
    for path in PACKAGE.rglob("*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and len(doc.split()) >= 5, f"{path.name} has no module docstring"
