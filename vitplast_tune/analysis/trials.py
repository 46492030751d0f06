"""The analysis of one search's trials: does the plasticity of a trial's subset predict its accuracy,
beside the naive baseline log(trainable parameters)? Correlations per view, written and described.

Pure functions on pandas objects; nothing here needs Ray or MLflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from vitplast_tune.analysis import lab
from vitplast_tune.analysis.correlation import (
    BASELINE,
    compare_predictors,
    correlations,
    numeric,
    partial_correlations,
)
from vitplast_tune.analysis.plots import plot_score_vs_accuracy
from vitplast_tune.analysis.protocol import (
    PaperResults,
    describe_paper,
    paper_results,
    relative_gain,
    single_component_table,
)
from vitplast_tune.components import HEAD

SCORES: tuple[str, ...] = ("plasticity_mean", "plasticity_max", "plasticity_weighted")


@dataclass
class TrialAnalysis:
    """Plasticity vs accuracy over a search's finished trials, with the files written."""

    correlations: pd.DataFrame
    single_components: pd.DataFrame
    files: list[Path]
    n_finished: int


def finished_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials that trained their whole step budget without error or divergence (early-stopped ones are left out)."""
    ok = trials["step"].fillna(0) >= trials["max_steps"]
    if "diverged" in trials:
        ok &= ~trials["diverged"].astype(bool)
    if "error" in trials:
        ok &= trials["error"].isna()
    return trials[ok].copy()


def analyse_trials(
    trials: pd.DataFrame,
    out_dir: str | Path,
    *,
    target: str = "val_acc",
    min_trials: int = 5,
    n_boot: int = 1000,
    seed: int = 0,
) -> TrialAnalysis:
    """Correlate each plasticity score, and the naive baseline log(trainable parameters), with accuracy.

    Two views: final ``target`` of the finished trials (those that trained their whole budget),
    and, when the table has it, ``val_acc_common`` of every trial (accuracy at the last step all
    trials reached, the fair view under early stopping). Adds the relative gain over the linear
    probe when the search has head-only trials. Each row also carries the paired-bootstrap difference
    of its Spearman against the baseline's (diff_vs_baseline, diff_low, diff_high, verdict) and, when
    the learning rate varies, the partial Spearman controlling for it (partial_spearman, _low, _high).
    Writes correlations.csv, single_components.csv and scatter plots to ``out_dir``.
    """
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    trials = trials.copy()
    trials[BASELINE] = np.log(pd.to_numeric(trials["trainable_params"], errors="coerce").astype(float))
    done = finished_trials(trials)
    single = single_component_table(done, target) if len(done) else pd.DataFrame()
    views = [(target, done)]
    if "relative_gain" in single:
        done["relative_gain"] = relative_gain(
            numeric(done[target]), single.loc[single["components"] == HEAD, "mean"].iloc[0]
        )
        views.append(("relative_gain", done))
    if "val_acc_common" in trials and trials["val_acc_common"].notna().any():
        views.append(("val_acc_common", trials))
    predictors = [c for c in SCORES if c in trials] + [BASELINE]
    table = pd.concat(
        [
            _with_comparisons(
                correlations(frame, predictors, t, n_boot=n_boot, seed=seed, min_trials=min_trials),
                frame,
                n_boot,
                seed,
                min_trials,
            )
            for t, frame in views
        ],
        ignore_index=True,
    )
    files = [out / "correlations.csv", out / "single_components.csv", out / "finished_trials.csv"]
    table.to_csv(files[0], index=False)
    single.to_csv(files[1], index=False)
    done.to_csv(files[2], index=False)
    for t, frame in views:
        for predictor in ("plasticity_mean", BASELINE):
            if t != "relative_gain" and predictor in frame and frame[predictor].notna().any():
                files.append(plot_score_vs_accuracy(frame, predictor, t, out / f"{predictor}_vs_{t}.png"))
    return TrialAnalysis(table, single, files, len(done))


def _with_comparisons(
    table: pd.DataFrame, frame: pd.DataFrame, n_boot: int, seed: int, min_trials: int
) -> pd.DataFrame:
    """Add each predictor's paired difference against the baseline and its partial Spearman given lr."""
    table = table.copy()
    for column in ("diff_vs_baseline", "diff_low", "diff_high", "partial_spearman", "partial_low", "partial_high"):
        table[column] = math.nan
    table["verdict"] = ""
    lr_varies = "lr" in frame and pd.to_numeric(frame["lr"], errors="coerce").nunique() > 1
    for i, row in table.iterrows():
        if row["note"]:
            continue
        if row["predictor"] != BASELINE:
            c = compare_predictors(frame, row["predictor"], BASELINE, row["target"], n_boot=n_boot, seed=seed)
            table.loc[i, ["diff_vs_baseline", "diff_low", "diff_high", "verdict"]] = [
                c["diff"],
                c["diff_low"],
                c["diff_high"],
                c["verdict"],
            ]
        if lr_varies:
            p = partial_correlations(
                frame, [row["predictor"]], row["target"], "lr", n_boot=n_boot, seed=seed, min_trials=min_trials
            ).iloc[0]
            table.loc[i, ["partial_spearman", "partial_low", "partial_high"]] = [
                p["partial_spearman"],
                p["partial_low"],
                p["partial_high"],
            ]
    return table


TARGET_LABELS = {
    "val_acc": "final validation accuracy, finished trials",
    "relative_gain": "relative gain over the linear probe, finished trials",
    "val_acc_common": "validation accuracy at the last step every trial reached, all trials",
}


CONFOUND_NOTE = (
    "per-trial correlations mix learning rates and stopping steps: they are confounded by the "
    "learning rate and by early stopping; the partial Spearman given lr removes the first only"
)


def describe_correlations(table: pd.DataFrame) -> str:
    """Plain lines per target: each predictor's Spearman with its interval, then plasticity vs the baseline."""
    lines = [f"  ({CONFOUND_NOTE})"] if "partial_spearman" in table and table["partial_spearman"].notna().any() else []
    for target, rows in table.groupby("target", sort=False):
        lines.append(f"  {TARGET_LABELS.get(target, target)}:")
        for row in rows.itertuples():
            if row.note:
                lines.append(f"    {row.predictor:<22} n={row.n}: {row.note}")
                continue
            line = (
                f"    {row.predictor:<22} Spearman {row.spearman:+.2f} [{row.spearman_low:+.2f}, "
                f"{row.spearman_high:+.2f}], Kendall {row.kendall:+.2f}, n={row.n}"
            )
            if np.isfinite(getattr(row, "partial_spearman", math.nan)):
                line += f"; given lr {row.partial_spearman:+.2f} [{row.partial_low:+.2f}, {row.partial_high:+.2f}]"
            lines.append(line)
        lines += [f"    -> {line}" for line in [_verdict(rows)] if line]
    return "\n".join(lines)


def _verdict(rows: pd.DataFrame) -> str:
    """Does the best plasticity score rank the trials better than log(trainable params)? Paired bootstrap."""
    valid = rows[(rows["note"] == "") & rows["predictor"].isin(SCORES)]
    if valid.empty or "verdict" not in valid or not (valid["verdict"] != "").any():
        return ""
    p = valid.loc[valid["spearman"].idxmax()]
    words = {
        "better": "ranks these trials better than",
        "worse": "ranks these trials worse than",
        "no clear difference": "is not clearly different from",
    }
    return (
        f"{p['predictor']} {words.get(p['verdict'], p['verdict'])} log(trainable parameters): paired bootstrap "
        f"of the Spearman difference {p['diff_vs_baseline']:+.2f} [{p['diff_low']:+.2f}, {p['diff_high']:+.2f}]."
    )


@dataclass
class SearchAnalysis:
    """Every analysis a search's trials support, and the files written."""

    trials: TrialAnalysis | None = None  # plasticity vs accuracy per trial (when plasticity was measured)
    paper: PaperResults | None = None  # the paper's protocol (a grid with seeds)
    criteria: pd.DataFrame | None = None  # the criteria lab (a space with ``criteria: true``)
    files: list[Path] = field(default_factory=list)

    def describe(self) -> str:
        """The analyses as plain text, in the order a person reads them."""
        parts = []
        if self.trials is not None:
            parts.append(
                "Does the plasticity of the trained subset predict accuracy? Spearman with a bootstrap 95% "
                "interval, beside the naive baseline log(trainable parameters):\n"
                + describe_correlations(self.trials.correlations)
            )
        if self.paper is not None:
            parts.append(describe_paper(self.paper))
        if self.criteria is not None:
            parts.append(lab.describe_criteria(self.criteria))
        return "\n\n".join(parts)


def analyse_search(
    trials: pd.DataFrame,
    spec,
    settings: dict,
    out_dir: str | Path,
    *,
    reference: str = "fractals",
    plasticity_pairs: int | None = None,
) -> SearchAnalysis:
    """The analyses a search supports: per-trial correlations (when its trials carry plasticity scores), the
    paper's protocol (a grid with seeds) and the criteria lab (``criteria: true``); files go to ``out_dir``."""
    out = Path(out_dir).expanduser()
    found = SearchAnalysis()
    if "plasticity_mean" in trials:
        found.trials = analyse_trials(trials, out)
        found.files += found.trials.files
    if spec.algorithm == "grid" and spec.has_seeds:
        found.paper = paper_results(trials, out)
        found.files += found.paper.files
    if spec.criteria:
        from vitplast_tune.predictors.report import in_network_scores

        subsets = lab.subset_table(trials)
        extra = in_network_scores(
            settings, subsets["components"], reference=reference, plasticity_pairs=plasticity_pairs
        )
        table = lab.subset_table(trials, extra)
        found.criteria = lab.criteria_comparison(table)
        found.files += [out / "criteria_subsets.csv", out / "criteria.csv"]
        table.to_csv(found.files[-2], index=False)
        found.criteria.to_csv(found.files[-1], index=False)
    return found
