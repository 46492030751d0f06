"""The analysis of one search's trials: does the plasticity of a trial's subset predict its accuracy,
beside the naive baseline log10(trainable parameters)? Correlations per view, written and described.

Pure functions on pandas objects; nothing here needs Ray or MLflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from vitplast_tune.analysis import multiple
from vitplast_tune.analysis.correlation import (
    compare_predictors,
    compare_with_baseline,
    interval,
    numeric,
    partial_correlations,
)
from vitplast_tune.analysis.plots import plot_score_vs_accuracy
from vitplast_tune.analysis.protocol import (
    relative_gain,
    single_component_table,
)
from vitplast_tune.analysis.verdicts import corrected_p, family_clause
from vitplast_tune.components import HEAD
from vitplast_tune.predictors.scores import BASELINE, PLASTICITY, criteria, log_trainable_params

TEXT_COLUMNS = ("note", "verdict")  # the correlations table's text, "" where a row has none


@dataclass
class TrialAnalysis:
    """Plasticity vs accuracy over a search's finished trials, with the files written."""

    correlations: pd.DataFrame
    single_components: pd.DataFrame
    files: list[Path]
    n_finished: int


def read_correlations(path: str | Path) -> pd.DataFrame:
    """Read a correlations table (``correlations.csv``, ``analyze_trials``) back as it was written.

    pandas reads an empty field as NaN, which is true where the "" written was false: the notes and verdicts come
    back as text, "" where a row has none.

    Args:
        path: The CSV file.

    Returns:
        The table, one row per predictor and target.
    """
    return with_text(pd.read_csv(path))


def with_text(table: pd.DataFrame) -> pd.DataFrame:
    """Give a correlations table its notes and verdicts as text, "" where one is missing (NaN, None)."""
    present = [c for c in TEXT_COLUMNS if c in table]
    return table.assign(**{c: table[c].astype(object).where(table[c].notna(), "") for c in present})


def finished_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials that trained their whole step budget without error or divergence (early-stopped ones are left out)."""
    ok = trials["step"].fillna(0) >= trials["max_steps"]
    if "diverged" in trials:
        ok &= ~trials["diverged"].astype(bool)
    if "error" in trials:
        ok &= trials["error"].isna()
    return trials[ok].copy()


def analyze_trials(
    trials: pd.DataFrame,
    out_dir: str | Path,
    *,
    target: str = "val_acc",
    min_trials: int = 5,
    n_boot: int = 1000,
    seed: int = 0,
) -> TrialAnalysis:
    """Correlate each plasticity score, and the naive baseline log10(trainable parameters), with accuracy.

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
    trials[BASELINE] = log_trainable_params(trials["trainable_params"])
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
    predictors = [c for c in criteria(PLASTICITY) if c in trials] + [BASELINE]
    options = dict(n_boot=n_boot, seed=seed, min_trials=min_trials)
    table = pd.concat(
        [
            _with_partials(compare_with_baseline(frame, predictors, BASELINE, t, **options), frame, **options)
            for t, frame in views
        ],
        ignore_index=True,
    )
    table = adjust_verdicts(table, dict(views), n_boot=n_boot, seed=seed)
    files = [out / "correlations.csv", out / "single_components.csv", out / "finished_trials.csv"]
    table.to_csv(files[0], index=False)
    single.to_csv(files[1], index=False)
    done.to_csv(files[2], index=False)
    for t, frame in views:
        for predictor in ("plasticity_mean", BASELINE):
            if t != "relative_gain" and predictor in frame and frame[predictor].notna().any():
                files.append(plot_score_vs_accuracy(frame, predictor, t, out / f"{predictor}_vs_{t}.png"))
    return TrialAnalysis(table, single, files, len(done))


JUDGED = ("better", "worse", "no clear difference")


def adjust_verdicts(
    table: pd.DataFrame, frames: dict[str, pd.DataFrame], *, n_boot: int, seed: int, alpha: float = multiple.ALPHA
) -> pd.DataFrame:
    """Holm over every verdict the per-trial analysis prints (each plasticity score against the baseline, in each
    view): ``p_holm``, the adjusted interval of the difference (``diff_low``/``diff_high`` at ``level``: the BCa
    interval again at the Holm step of a rejected hypothesis, Bonferroni's level otherwise) and the verdict, "better"
    or "worse" only where Holm's p is below ``alpha`` and that interval excludes 0."""
    table = table.assign(p_holm=math.nan, level=math.nan)
    table.attrs["alpha"] = alpha
    same_ranks = table["target"] == "relative_gain"  # a monotone function of the accuracy: its ranks, its verdicts
    table.loc[same_ranks, "verdict"] = ""
    tested = table.index[
        table["predictor"].isin(criteria(PLASTICITY)) & table["verdict"].isin(JUDGED) & table["diff_p"].notna()
    ]
    p = table.loc[tested, "diff_p"].to_numpy(float)
    table.loc[tested, "p_holm"], table.loc[tested, "level"] = multiple.holm(p), multiple.interval_levels(p, alpha)
    for i in tested:
        row = table.loc[i]
        frame = frames[row["target"]]
        base = numeric(frame[BASELINE])
        common = frame[np.isfinite(base) & np.isfinite(numeric(frame[row["predictor"]]))]
        c = compare_predictors(
            common, row["predictor"], BASELINE, row["target"], n_boot=n_boot, seed=seed, level=row["level"]
        )
        low, high = c["diff_low"], c["diff_high"]
        word = "no clear difference"
        if row["p_holm"] < alpha and (low > 0 or high < 0):
            word = "better" if low > 0 else "worse"
        table.loc[i, ["diff_low", "diff_high", "verdict"]] = [low, high, word]
    return table


def _with_partials(
    table: pd.DataFrame, frame: pd.DataFrame, *, n_boot: int, seed: int, min_trials: int
) -> pd.DataFrame:
    """Add each predictor's partial Spearman given lr (when lr varies), on the same rows as its other figures."""
    for column in ("partial_spearman", "partial_low", "partial_high"):
        table[column] = math.nan
    if not ("lr" in frame and pd.to_numeric(frame["lr"], errors="coerce").nunique() > 1):
        return table
    base = numeric(frame[BASELINE])
    for i, row in table[with_text(table)["note"] == ""].iterrows():
        common = frame[np.isfinite(base) & np.isfinite(numeric(frame[row["predictor"]]))]
        p = partial_correlations(
            common, [row["predictor"]], row["target"], "lr", n_boot=n_boot, seed=seed, min_trials=min_trials
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
    table = with_text(table)  # read back from CSV, an empty note is NaN: no note all the same
    lines = [f"  ({CONFOUND_NOTE})"] if "partial_spearman" in table and table["partial_spearman"].notna().any() else []
    if "p_holm" in table and table["p_holm"].notna().any():
        family = int(table["p_holm"].notna().sum())
        lines.append(
            f"  (each plasticity score's verdict is adjusted for the verdicts below: "
            f"{family_clause(table.attrs.get('alpha', multiple.ALPHA), multiple.CORRECTION, family)}; the relative "
            "gain ranks the trials as the accuracy does and is not judged again)"
        )
    for target, rows in table.groupby("target", sort=False):
        lines.append(f"  {TARGET_LABELS.get(target, target)}:")
        for row in rows.itertuples():
            if row.note:
                lines.append(f"    {row.predictor:<22} n={row.n}: {row.note}")
                continue
            line = (
                f"    {row.predictor:<22} Spearman {row.spearman:+.2f} {interval(row.spearman_low, row.spearman_high)}"
                f", Kendall {row.kendall:+.2f}, n={row.n}"
            )
            if np.isfinite(getattr(row, "partial_spearman", math.nan)):
                line += f"; given lr {row.partial_spearman:+.2f} {interval(row.partial_low, row.partial_high)}"
            lines.append(line)
        lines += [f"    -> {line}" for line in _verdicts(rows)]
    return "\n".join(lines)


def plasticity_verdict(table: pd.DataFrame) -> str:
    """The sentences that say whether each plasticity score ranked the trials better than log10(trainable parameters)
    (their verdicts adjusted together, Holm), on the target with the most trials ("" when the table supports no
    verdict), prefixed by that target's name."""
    target, rows = judged_scores(table)
    sentences = _verdicts(rows) if target else []
    return f"on {TARGET_LABELS.get(target, target)}: {' '.join(sentences)}" if sentences else ""


def judged_scores(table: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    """The target with the most trials and its plasticity scores' rows that carry a verdict (or its "no verdict");
    ("", empty) when none does."""
    table = with_text(table)
    scored = table[(table["note"] == "") & table["predictor"].isin(criteria(PLASTICITY))] if not table.empty else table
    if scored.empty or "verdict" not in scored:
        return "", scored.head(0)
    target = scored.groupby("target", sort=False)["n"].max().idxmax()
    rows = scored[(scored["target"] == target) & (scored["verdict"] != "")]
    return (target, rows) if not rows.empty else ("", rows)


def _verdicts(rows: pd.DataFrame) -> list[str]:
    """Each plasticity score against log10(trainable params), paired bootstrap, its interval and verdict adjusted for
    every verdict of the analysis (Holm); below ``correlation.MIN_POINTS`` trials the figures without a verdict."""
    rows = with_text(rows)
    valid = rows[(rows["note"] == "") & rows["predictor"].isin(criteria(PLASTICITY))]
    if valid.empty or "verdict" not in valid or not (valid["verdict"] != "").any():
        return []
    words = {
        "better": "ranks these trials better than",
        "worse": "ranks these trials worse than",
        "no clear difference": "is not clearly different from",
        "undetermined": "cannot be compared (the interval of the difference is undetermined) with",
    }
    out = []
    for p in valid.itertuples():
        figures = f"Spearman difference {p.diff_vs_baseline:+.2f} {interval(p.diff_low, p.diff_high)}"
        if np.isfinite(p.p_holm):
            figures += f" ({multiple.describe_level(p.level)}, {corrected_p(multiple.CORRECTION)}={p.p_holm:.2g})"
        figures += f", n={p.n}"
        if p.verdict not in words:  # no verdict: too few trials
            out.append(f"{p.predictor} vs log(trainable parameters): {figures}; {p.verdict}: too few trials to judge.")
        else:
            out.append(f"{p.predictor} {words[p.verdict]} log(trainable parameters): {figures}.")
    return out
