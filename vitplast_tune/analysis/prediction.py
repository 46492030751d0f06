"""Test whether the plasticity of each trial's subset predicts its accuracy better than the parameter count."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from vitplast_tune.analysis import multiple
from vitplast_tune.analysis.correlation import (
    _numeric,
    compare_predictors,
    compare_with_baseline,
    interval,
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

TEXT_COLUMNS = ("note", "verdict")  # the text columns of the correlations table


@dataclass
class TrialAnalysis:
    """Hold plasticity against accuracy over a search's finished trials, with the files written."""

    correlations: pd.DataFrame
    single_components: pd.DataFrame
    files: list[Path]
    n_finished: int


def read_correlations(path: str | Path) -> pd.DataFrame:
    """Read ``correlations.csv`` back as it was written, with empty notes and verdicts as "" rather than NaN."""
    return _with_text(pd.read_csv(path))


def _with_text(table: pd.DataFrame) -> pd.DataFrame:
    """Turn missing notes and verdicts into ""."""
    present = [c for c in TEXT_COLUMNS if c in table]
    return table.assign(**{c: table[c].astype(object).where(table[c].notna(), "") for c in present})


def finished_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """Keep the trials that trained their whole step budget without error or divergence."""
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
    """Correlate each plasticity score and the parameter count with accuracy, and write the tables and plots."""
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    trials = trials.copy()
    trials[BASELINE] = log_trainable_params(trials["trainable_params"])
    done = finished_trials(trials)
    single = single_component_table(done, target) if len(done) else pd.DataFrame()
    views = [(target, done)]
    if "relative_gain" in single:
        done["relative_gain"] = relative_gain(
            _numeric(done[target]), single.loc[single["components"] == HEAD, "mean"].iloc[0]
        )
        views.append(("relative_gain", done))
    if "val_acc_common" in trials and trials["val_acc_common"].notna().any():  # the fair view under early stopping
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
    table = _adjust_verdicts(table, dict(views), n_boot=n_boot, seed=seed)
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


def _adjust_verdicts(
    table: pd.DataFrame, frames: dict[str, pd.DataFrame], *, n_boot: int, seed: int, alpha: float = multiple.ALPHA
) -> pd.DataFrame:
    """Judge every verdict of the per-trial analysis in one Holm family, with intervals at the adjusted levels."""
    table = table.assign(p_holm=math.nan, level=math.nan)
    table.attrs["alpha"] = alpha
    same_ranks = table["target"] == "relative_gain"  # it ranks trials as the accuracy does, so it is not judged again
    table.loc[same_ranks, "verdict"] = ""
    tested = table.index[
        table["predictor"].isin(criteria(PLASTICITY)) & table["verdict"].isin(JUDGED) & table["diff_p"].notna()
    ]
    p = table.loc[tested, "diff_p"].to_numpy(float)
    table.loc[tested, "p_holm"], table.loc[tested, "level"] = multiple.holm(p), multiple.interval_levels(p, alpha)
    for i in tested:
        row = table.loc[i]
        frame = frames[row["target"]]
        base = _numeric(frame[BASELINE])
        common = frame[np.isfinite(base) & np.isfinite(_numeric(frame[row["predictor"]]))]
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
    """Add each predictor's partial Spearman given lr, on the same rows as its other figures, when lr varies."""
    for column in ("partial_spearman", "partial_low", "partial_high"):
        table[column] = math.nan
    if not ("lr" in frame and pd.to_numeric(frame["lr"], errors="coerce").nunique() > 1):
        return table
    base = _numeric(frame[BASELINE])
    for i, row in table[_with_text(table)["note"] == ""].iterrows():
        common = frame[np.isfinite(base) & np.isfinite(_numeric(frame[row["predictor"]]))]
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
    """Describe each target's correlations and verdicts as text."""
    table = _with_text(table)
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
    """Say whether each plasticity score ranked the trials better than the parameter count, on the fullest target."""
    target, rows = judged_scores(table)
    sentences = _verdicts(rows) if target else []
    return f"on {TARGET_LABELS.get(target, target)}: {' '.join(sentences)}" if sentences else ""


def judged_scores(table: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    """Return the target with the most trials and its plasticity rows that carry a verdict, or "" and no rows."""
    table = _with_text(table)
    scored = table[(table["note"] == "") & table["predictor"].isin(criteria(PLASTICITY))] if not table.empty else table
    if scored.empty or "verdict" not in scored:
        return "", scored.head(0)
    target = scored.groupby("target", sort=False)["n"].max().idxmax()
    rows = scored[(scored["target"] == target) & (scored["verdict"] != "")]
    return (target, rows) if not rows.empty else ("", rows)


def _verdicts(rows: pd.DataFrame) -> list[str]:
    """Word each plasticity score's comparison with the parameter count, one sentence each."""
    rows = _with_text(rows)
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
            figures += f" ({multiple._describe_level(p.level)}, {corrected_p(multiple.CORRECTION)}={p.p_holm:.2g})"
        figures += f", n={p.n}"
        if p.verdict not in words:  # too few trials for a verdict
            out.append(f"{p.predictor} vs log(trainable parameters): {figures}; {p.verdict}: too few trials to judge.")
        else:
            out.append(f"{p.predictor} {words[p.verdict]} log(trainable parameters): {figures}.")
    return out
