"""The analysis's figures (analysis/plots.py, the plasticity plot), and a library that imports without a plotting
backend, Ray or MLflow."""

from __future__ import annotations

import subprocess
import sys

from tests.analysis._tables import is_png, make_trials, plasticity_table
from vitplast_tune.analysis.plots import plot_score_vs_accuracy
from vitplast_tune.predictors.report import plot_plasticity


def test_plots_write_png_files(tmp_path):
    assert is_png(plot_plasticity(plasticity_table(), tmp_path / "plasticity.png"))
    trials = make_trials().dropna().assign(score=lambda t: t["val_acc"] * 2)
    assert is_png(plot_score_vs_accuracy(trials, "score", "val_acc", tmp_path / "sub" / "scatter.png"))
    assert is_png(plot_score_vs_accuracy(trials.drop(columns="lr"), "score", "val_acc", tmp_path / "plain.png"))


def test_importing_the_library_selects_no_backend_and_needs_no_ray_or_mlflow():
    code = (
        "import sys, vitplast_tune.analysis.prediction, vitplast_tune.vit.plasticity\n"
        "bad = [m for m in ('matplotlib.pyplot', 'ray', 'mlflow') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
