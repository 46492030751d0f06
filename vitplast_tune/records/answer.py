"""The answer a search opens its summary with: the subset and rate to use, how it compares with the linear probe,
full finetuning and the cheapest trial close to it, and whether plasticity predicted the trials' accuracy; the
numbers first (``Answer``, what ``vt.load_search(name).answer`` gives), every word chosen from them. A search with a
finalists stage answers by its finalists instead (``records.finalists``: the one-standard-error rule).

Like is compared with like: a baseline is compared at the best trial's step budget, so a baseline trial that the
scheduler stopped earlier is not compared with a longer-trained best; it is named as stopped, with its step.
"""

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
    """How the best trial compares with one baseline (the linear probe or full finetuning).

    ``kind``: ``missing`` (no such trial), ``itself`` (the best is that baseline), ``compared`` (``gap`` points over
    the baseline's best trial, ``accuracy``, among those that trained the best's ``step`` steps or more), or ``stopped`` (every such trial stopped
    before the best's step budget; ``accuracy`` and ``step`` are its best one's).
    """

    components: str
    label: str
    kind: str
    accuracy: float | None = None
    gap: float | None = None
    step: int | None = None


@dataclass(frozen=True)
class Answer:
    """The numbers behind the printed answer: the best trial, the cheapest trial close to it, the baselines.

    Printed (``str``), it is the answer's line, the summary's first (``line``).
    """

    n_trials: int
    best: dict[str, Any]  # the best trial's row of the trial table
    cheaper: dict[str, Any] | None = None  # the full-budget trial with the fewest parameters within CLOSE_POINTS
    cheaper_share: float | None = None  # its trainable parameters over the best's
    baselines: tuple[Baseline, ...] = field(default_factory=tuple)

    @property
    def line(self) -> str:
        """The answer as the summary opens with it: ``Answer: finetune ...``, the best trial as an instruction."""
        best = self.best
        return (
            f"Answer: finetune {instruction(best)} ({pct(best['best_val_acc'])} best validation accuracy, test "
            f"{pct(best['test_acc'])}, {params_text(best)} trainable parameters), the best of {self.n_trials} trials."
        )

    def __str__(self) -> str:
        return self.line


def answer_of(trials: pd.DataFrame) -> Answer | FinalAnswer | None:
    """The answer's numbers from a trial table.

    Args:
        trials: the search's trial table (``records.trial_table``), one row per trial.

    Returns:
        The finalists' ``FinalAnswer`` (``records.finalists``: the one-standard-error rule) where a finalist trained;
        else the ``Answer`` of the search's best trial; None when no trial reported a validation accuracy.
    """
    if (final := final_answer(trials)) is not None:
        return final
    return best_answer(search_trials(trials))


def best_answer(trials: pd.DataFrame) -> Answer | None:
    """The answer's numbers from the search's trials alone: its best trial, the cheapest close to it, the baselines.

    Args:
        trials: the search's trials (no finalists).

    Returns:
        The ``Answer``, or None when no trial reported a validation accuracy.
    """
    ok = trials[~trials["diverged"].astype(bool) & trials["best_val_acc"].notna()] if not trials.empty else trials
    if ok.empty:
        return None
    best = ok.sort_values("best_val_acc", ascending=False, kind="stable").iloc[0]
    cheap, share = _cheaper(ok, best)
    baselines = tuple(_baseline(ok, best, name, label) for name, label in BASELINES)
    return Answer(len(trials), best.to_dict(), None if cheap is None else cheap.to_dict(), share, baselines)


def answer_lines(trials: pd.DataFrame, analysis: SearchAnalysis | None = None) -> list[str]:
    """The summary's opening lines: the finalists' answer where a finalist trained (``records.finalists``), else the
    best trial as an instruction; then the comparisons the trials allow.

    Args:
        trials: the search's trial table.
        analysis: its analysis, for the plasticity line (None: plasticity not measured).

    Returns:
        The lines, the first one ``Answer: ...``.
    """
    if (final := final_answer(trials)) is not None:
        return [*final.lines(), f"  {_plasticity(analysis)}"]
    found = best_answer(search_trials(trials))
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
    """A ratio as the answer prints it, three significant digits so that 0.997 is not 1: ``0.997x``, ``0.5x``."""
    return f"{value:.3g}x"


def _cheaper(ok: pd.DataFrame, best: pd.Series) -> tuple[pd.Series | None, float | None]:
    """The full-budget trial with the fewest trainable parameters within CLOSE_POINTS of the best, if cheaper."""
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
    """The best trial against one baseline's trials, at the best's step budget (see ``Baseline``)."""
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
    """One baseline's comparison in words."""
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
