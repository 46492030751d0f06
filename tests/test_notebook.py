"""The notebook of the docs (docs/examples/quickstart.ipynb) runs as a reader would run it, top to bottom in a fresh
Jupyter kernel (nbclient): a small search from Python, read back by name, its trials as a DataFrame, the plot of
plasticity against accuracy and the best model on a test batch. It is kept in git without outputs (the docs site
executes nothing: it shows the cells)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
from _raycluster import OwnedRay
from nbclient import NotebookClient

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "examples" / "quickstart.ipynb"


def text_of(cell) -> str:
    """What a cell printed and its value's text, joined."""
    said = []
    for out in cell.outputs:
        said.append(out.get("text", ""))
        said.append(out.get("data", {}).get("text/plain", ""))
    return "".join(said)


def test_the_notebook_is_kept_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_the_notebook_runs_top_to_bottom(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    owned = OwnedRay()  # every Ray process the kernel's search starts, killed after by its own RAY_TMPDIR
    env = {**owned.env, "PYTHONPATH": os.pathsep.join([str(ROOT), owned.env.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    try:
        client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
        client.execute(env=env)
    finally:
        owned.kill_all()
    code = [c for c in nb.cells if c.cell_type == "code"]
    said = [text_of(c) for c in code]
    assert re.search(r"Search\('notebook', finished, 6/6 trials, best \S+ \d+\.\d\d%\)", said[1]), said[1]
    assert said[2].startswith("Answer: finetune ") and "run_id" in said[2] and "plasticity_mean" in said[2]
    assert re.match(r"6 Optuna trials; 6 MLflow runs", said[3]) and "spearman" in said[3].lower()
    assert any("image/png" in out.get("data", {}) for out in code[4].outputs)  # the plot, drawn
    correct = re.search(r"(\d+)/32 of a test batch classified right", said[5])
    assert correct and int(correct.group(1)) > 32 // 10, said[5]  # better than chance over 10 digits
