"""The answer a search's summary opens with: its numbers (``Answer``) and the words made from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from vitplast_tune.analysis.analyze import SearchAnalysis
from vitplast_tune.analysis.prediction import TARGET_LABELS, finished_trials, judged_scores
from vitplast_tune.records.finalists import FinalAnswer, final_answer
from vitplast_tune.records.table import instruction, params_text, pct, search_trials

CLOSE_POINTS = 1.0  # "close to the best": within this many points of its best validation accuracy
BASELINES = (("head", "the linear probe"), ("all", "full finetuning"))


@dataclass(frozen=True)
class Baseline:
    """How the best trial compares with one baseline (the linear probe or full finetuning)."""

    components: str
    label: str
    kind: str  # missing, itself, compared, or stopped (every baseline trial stopped before the best's budget)
    accuracy: float | None = None  # the baseline's best trial's
    gap: float | None = None  # points over that trial
    step: int | None = None  # the budget compared at


@dataclass(frozen=True)
class Answer:
    """The numbers behind the printed answer: the best trial, the cheapest trial close to it, the baselines."""

    n_trials: int
    best: dict[str, Any]  # the best trial's row of the trial table
    cheaper: dict[str, Any] | None = None  # the full-budget trial with the fewest parameters within CLOSE_POINTS
    cheaper_share: float | None = None  # its trainable parameters over the best's
    baselines: tuple[Baseline, ...] = field(default_factory=tuple)

    @property
    def line(self) -> str:
        """The summary's first line, ``Answer: finetune ...``."""
        best = self.best
        return (
            f"Answer: finetune {instruction(best)} ({pct(best['best_val_acc'])} best validation accuracy, test "
            f"{pct(best['test_acc'])}, {params_text(best)} trainable parameters), the best of {self.n_trials} trials."
        )

    def __str__(self) -> str:
        return self.line


def answer_of(trials: pd.DataFrame) -> Answer | FinalAnswer | None:
    """Find the answer's numbers: the finalists' where a finalist trained, else the best trial's; None before any."""
    if (final := final_answer(trials)) is not None:
        return final
    return _best_answer(search_trials(trials))


def _best_answer(trials: pd.DataFrame) -> Answer | None:
    """Find the best trial, the cheapest close to it and the baselines among the search's trials."""
    ok = trials[~trials["diverged"].astype(bool) & trials["best_val_acc"].notna()] if not trials.empty else trials
    if ok.empty:
        return None
    best = ok.sort_values("best_val_acc", ascending=False, kind="stable").iloc[0]
    cheap, share = _cheaper(ok, best)
    baselines = tuple(_baseline(ok, best, name, label) for name, label in BASELINES)
    return Answer(len(trials), best.to_dict(), None if cheap is None else cheap.to_dict(), share, baselines)


def answer_lines(trials: pd.DataFrame, analysis: SearchAnalysis | None = None) -> list[str]:
    """Write the summary's opening lines: the answer, then the comparisons the trials and ``analysis`` allow."""
    if (final := final_answer(trials)) is not None:
        return [*final.lines(), f"  {_plasticity(analysis)}"]
    found = _best_answer(search_trials(trials))
    if found is None:
        return ["Answer: none yet (no trial reported a validation accuracy)."]
    lines = [found.line]
    cheaper = ""
    if found.cheaper is not None and found.cheaper_share is not None:
        c = found.cheaper
        cheaper = (
            f"Within {CLOSE_POINTS:g} point of it, fewest parameters: {instruction(c)} ({pct(c['best_val_acc'])}, "
            f"{params_text(c)} trainable, {ratio(found.cheaper_share)} the best's)."
        )
    against = "Against the baselines (validation accuracy): " + "; ".join(map(_said, found.baselines)) + "."
    lines += [f"  {line}" for line in (cheaper, against, _plasticity(analysis)) if line]
    return lines


def ratio(value: float) -> str:
    """Write a ratio with three significant digits, so that 0.997 is not 1: ``0.997x``."""
    return f"{value:.3g}x"


def _cheaper(ok: pd.DataFrame, best: pd.Series) -> tuple[pd.Series | None, float | None]:
    """Find the full-budget trial with the fewest parameters within CLOSE_POINTS of the best, if cheaper."""
    done = finished_trials(ok).dropna(subset=["trainable_params"])
    close = done[done["best_val_acc"] >= best["best_val_acc"] - CLOSE_POINTS / 100]
    if close.empty or pd.isna(best.get("trainable_params")):
        return None, None
    cheap = close.loc[close["trainable_params"].idxmin()]
    if cheap["trainable_params"] >= best["trainable_params"]:
        return None, None
    return cheap, float(cheap["trainable_params"] / best["trainable_params"])


def _step(row: pd.Series | dict[str, Any]) -> int | None:
    step = row.get("step")
    return None if step is None or pd.isna(step) else int(step)


def _baseline(ok: pd.DataFrame, best: pd.Series, name: str, label: str) -> Baseline:
    """Compare the best trial with one baseline's trials at the best's step budget."""
    rows = ok[ok["components"] == name]
    if "depth" in rows:
        rows = rows[rows["depth"].fillna("all").isin(["all", ""])]
    if rows.empty:
        return Baseline(name, label, "missing")
    if best["components"] == name and (rows["best_val_acc"] <= best["best_val_acc"]).all():
        return Baseline(name, label, "itself")
    budget = _step(best)
    reached = rows if budget is None else rows[rows["step"].fillna(0) >= budget]
    if reached.empty:  # every one stopped before the best's budget: not compared
        top = rows.loc[rows["best_val_acc"].idxmax()]
        return Baseline(name, label, "stopped", float(top["best_val_acc"]), step=_step(top))
    accuracy = float(reached["best_val_acc"].max())
    return Baseline(name, label, "compared", accuracy, 100 * (float(best["best_val_acc"]) - accuracy), budget)


def _said(b: Baseline) -> str:
    """Put one baseline's comparison in words."""
    if b.kind == "missing":
        return f"no {b.label.removeprefix('the ')} trial in this search"
    if b.kind == "itself":
        return f"it is {b.label}"
    if b.kind == "stopped":
        return (
            f"{b.label}'s trials were all stopped before the best's step budget (its best {pct(b.accuracy)} at step "
            f"{b.step}): not compared"
        )
    return f"{b.gap:+.2f} points over {b.label}'s best trial of {b.step} steps or more ({pct(b.accuracy)})"


def _plasticity(analysis: SearchAnalysis | None) -> str:
    """Say whether plasticity ranked the trials better than their parameter count, grouped by verdict."""
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
    """Write the scores of one verdict with their differences and Holm p-values."""
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
