"""The answer a search opens its summary with: the subset and rate to use, how it compares with the linear probe,
full finetuning and the cheapest trial close to it, and whether plasticity predicted the trials' accuracy; every
word chosen from the trial table and the analysis."""

from __future__ import annotations

import pandas as pd

from vitplast_tune.analysis.analyze import SearchAnalysis
from vitplast_tune.analysis.prediction import TARGET_LABELS, finished_trials, judged_scores
from vitplast_tune.records.table import pct

CLOSE_POINTS = 1.0  # "close to the best": within this many points of its best validation accuracy


def answer_lines(trials: pd.DataFrame, analysis: SearchAnalysis | None = None) -> list[str]:
    """The summary's opening lines: the best trial as an instruction, then the comparisons the trials allow."""
    ok = trials[~trials["diverged"] & trials["best_val_acc"].notna()] if not trials.empty else trials
    if ok.empty:
        return ["Answer: none yet (no trial reported a validation accuracy)."]
    best = ok.sort_values("best_val_acc", ascending=False, kind="stable").iloc[0]
    lines = [
        f"Answer: finetune {_what(best)} ({pct(best['best_val_acc'])} best validation accuracy, test "
        f"{pct(best['test_acc'])}, {_params(best)} trainable parameters), the best of {len(trials)} trials."
    ]
    lines += [f"  {line}" for line in (_cheaper(ok, best), _against(ok, best), _plasticity(analysis)) if line]
    return lines


def _what(row: pd.Series) -> str:
    """A trial as an instruction: its subset (and depth) and learning rate."""
    depth = row.get("depth")
    where = f" in the {depth} blocks" if isinstance(depth, str) and depth not in ("", "all") else ""
    return f"{row['components']}{where} at lr {row['lr']:.3g}" if "lr" in row else f"{row['components']}{where}"


def _params(row: pd.Series) -> str:
    return "?" if pd.isna(row.get("trainable_params")) else f"{int(row['trainable_params']):,}"


def _cheaper(ok: pd.DataFrame, best: pd.Series) -> str:
    """The full-budget trial with the fewest trainable parameters within CLOSE_POINTS of the best, if cheaper."""
    done = finished_trials(ok).dropna(subset=["trainable_params"])
    close = done[done["best_val_acc"] >= best["best_val_acc"] - CLOSE_POINTS / 100]
    if close.empty or pd.isna(best.get("trainable_params")):
        return ""
    cheap = close.loc[close["trainable_params"].idxmin()]
    if cheap["trainable_params"] >= best["trainable_params"]:
        return ""
    share = cheap["trainable_params"] / best["trainable_params"]
    return (
        f"Within {CLOSE_POINTS:g} point of it, fewest parameters: {_what(cheap)} ({pct(cheap['best_val_acc'])}, "
        f"{_params(cheap)} trainable, {share:.2g}x the best's)."
    )


def _against(ok: pd.DataFrame, best: pd.Series) -> str:
    """The best trial's margin over the best linear-probe and full-finetuning trials, where the search has them."""
    parts = []
    for name, label in (("head", "the linear probe"), ("all", "full finetuning")):
        rows = ok[ok["components"] == name]
        if "depth" in rows:
            rows = rows[rows["depth"].fillna("all").isin(["all", ""])]
        if rows.empty:
            parts.append(f"no {label.removeprefix('the ')} trial in this search")
        elif best["components"] == name and (rows["best_val_acc"] <= best["best_val_acc"]).all():
            parts.append(f"it is {label}")
        else:
            gap = 100 * (best["best_val_acc"] - rows["best_val_acc"].max())
            parts.append(f"{gap:+.2f} points over {label}'s best trial ({pct(rows['best_val_acc'].max())})")
    return "Against the baselines (validation accuracy): " + "; ".join(parts) + "."


def _plasticity(analysis: SearchAnalysis | None) -> str:
    """Whether plasticity predicted the trials' accuracy better than their parameter count, as the analysis says: its
    scores grouped by verdict on the target with the most trials, with their differences and Holm p-values."""
    parts = [analysis] if analysis is not None else []
    parts = [a for a in parts + [b for a in parts for b in a.budgets] if a.trials is not None]
    if not parts:
        return "Plasticity: not measured in this search, so no word on whether it predicted accuracy."
    target, rows = judged_scores(parts[-1].trials.correlations)
    if rows.empty:
        return "Did plasticity predict it? No verdict: no plasticity score could be compared with the parameter count."
    groups = [_verdict_group(verdict, group) for verdict, group in rows.groupby("verdict", sort=False)]
    where = f"{TARGET_LABELS.get(target, target)}, n={int(rows['n'].max())}"
    return f"Did plasticity predict it? On {where}: " + "; ".join(groups) + "."


def _verdict_group(verdict: str, rows: pd.DataFrame) -> str:
    """Scores of one verdict: ``names: the verdict (their differences; their Holm p-values)``."""
    diffs = ", ".join(f"{d:+.2f}" for d in rows["diff_vs_baseline"])
    figures = f"Spearman difference{'s' if len(rows) > 1 else ''} {diffs}"
    if "p_holm" in rows and rows["p_holm"].notna().any():
        figures += "; Holm p " + ", ".join(f"{p:.2g}" for p in rows["p_holm"].dropna())
    said = VERDICTS.get(verdict, f"{verdict}, too few trials to judge")
    return f"{', '.join(rows['predictor'])}: {said} ({figures})"


VERDICTS = {  # a verdict of analysis.correlation, as the answer words it
    "better": "better than log(trainable parameters) at ranking the trials",
    "worse": "worse than log(trainable parameters) at ranking the trials",
    "no clear difference": "not clearly different from log(trainable parameters) at ranking the trials",
    "undetermined": "undetermined against log(trainable parameters) (the interval of the difference is undetermined)",
}
