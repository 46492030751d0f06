"""Rate how much each searched parameter matters for accuracy with Optuna's fANOVA, and which way it acts."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

MIN_TRIALS = 5  # fewer trials with a finite target get a note instead of an importance
MAX_FANOVA_TRIALS = 1000  # fANOVA fits a seeded sample of this many trials when there are more


@dataclass
class Importance:
    """Hold the importance table, most important first, what it was computed for, and why it is empty if so."""

    table: pd.DataFrame
    target: str
    n: int
    seed: int
    note: str = ""
    fitted: int | None = None  # the size of fANOVA's sample, when it took one

    @property
    def trials(self) -> str:
        """Count the trials in words, such as ``60 trials`` or ``1,000 of 3,000 trials``."""
        return f"{self.n} trials" if self.fitted is None else f"{self.fitted:,} of {self.n:,} trials"


def parameter_importance(
    params: pd.DataFrame,
    distributions: dict,
    target: pd.Series,
    *,
    label: str = "",
    seed: int = 0,
    min_trials: int = MIN_TRIALS,
    max_trials: int = MAX_FANOVA_TRIALS,
) -> Importance:
    """Measure how much each searched parameter matters for ``target`` with fANOVA, and which way it acts.

    Args:
        params: The searched parameters, a column each, a row per trial.
        distributions: The Optuna distribution of each column, by column.
        target: What they should explain, a Series aligned with ``params``.
        label: What the target is, by default its name.
        seed: The seed of fANOVA and of its sample.
        min_trials: The fewest trials with finite values that get an importance.
        max_trials: The most trials fANOVA is fitted on, as a seeded sample.

    Returns:
        The importance. Its table is empty, with a note, for too few trials or a constant target.
    """
    label = label or str(target.name)
    keep = np.isfinite(pd.to_numeric(target, errors="coerce").to_numpy(dtype=float)) & params.notna().all(axis=1)
    x, y = params[keep], pd.to_numeric(target[keep]).astype(float)
    names = [n for n in distributions if n in params]
    if len(y) < min_trials or not names:
        return Importance(_empty(), label, len(y), seed, f"too few trials ({len(y)} < {min_trials})")
    if y.nunique() < 2:
        return Importance(_empty(), label, len(y), seed, "the target is the same in every trial")
    sample = (
        np.sort(np.random.default_rng(seed).choice(len(y), max_trials, replace=False)) if len(y) > max_trials else None
    )
    fit_x, fit_y = (x, y) if sample is None else (x.iloc[sample], y.iloc[sample])
    scores = _fanova(fit_x, {n: distributions[n] for n in names}, fit_y, seed)
    rows = [{"parameter": n, "importance": scores.get(n, 0.0), **_direction(x[n], y)} for n in names]
    table = pd.DataFrame(rows).sort_values("importance", ascending=False, kind="stable").reset_index(drop=True)
    return Importance(table, label, len(y), seed, fitted=None if sample is None else len(sample))


def _fanova(x: pd.DataFrame, distributions: dict, y: pd.Series, seed: int) -> dict[str, float]:
    """Compute Optuna's fANOVA importances through an in-memory study of complete trials."""
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances
    from optuna.trial import create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for (_, row), value in zip(x.iterrows(), y):
        params = {n: _plain(row[n]) for n in distributions}
        study.add_trial(create_trial(value=float(value), params=params, distributions=distributions))
    evaluator = FanovaImportanceEvaluator(seed=seed)
    return get_param_importances(study, evaluator=evaluator, params=list(distributions))


def _direction(values: pd.Series, y: pd.Series) -> dict:
    """Measure which way a parameter acts: with minus without, Spearman for a number, else best minus worst."""
    if values.map(lambda v: isinstance(v, (bool, np.bool_))).all():
        on = values.astype(bool)
        n_on, n_off = int(on.sum()), int((~on).sum())
        effect = y[on].mean() - y[~on].mean() if n_on and n_off else math.nan
        return {"effect": effect, "effect_kind": "with - without", "detail": f"{n_on} with, {n_off} without"}
    numeric = pd.to_numeric(values, errors="coerce")
    if numeric.notna().all() and not values.map(lambda v: isinstance(v, str)).any():
        rho = stats.spearmanr(numeric, y).statistic if numeric.nunique() > 1 else math.nan
        return {"effect": float(rho), "effect_kind": "spearman", "detail": f"{numeric.nunique()} values"}
    means = y.groupby(values.astype(str)).mean().sort_values()
    return {
        "effect": means.iloc[-1] - means.iloc[0],
        "effect_kind": "best - worst",
        "detail": f"best {means.index[-1]}, worst {means.index[0]}",
    }


def describe_importance(found: Importance) -> str:
    """Describe the importance for a search's summary, one line per parameter."""
    trials = found.trials + ("" if found.fitted is None else " (a seeded sample)")
    head = (
        f"Which settings matter? fANOVA importance (Optuna, seed {found.seed}; shares of the variance, summing to 1) "
        f"of {found.target}, {trials}; direction: mean accuracy with minus without a component, Spearman for "
        "a number such as lr:"
    )
    if found.note:
        return f"{head}\n  {found.note}"
    lines = [head]
    for row in found.table.itertuples():
        lines.append(f"  {row.parameter:<12} {row.importance:5.3f}   {_effect_text(row)}")
    return "\n".join(lines)


def _effect_text(row) -> str:
    if not np.isfinite(row.effect):
        return f"no direction ({row.detail})"
    if row.effect_kind == "with - without":
        return f"{100 * row.effect:+6.2f} pts with it ({row.detail})"
    if row.effect_kind == "spearman":
        return f"Spearman {row.effect:+.2f} with accuracy"
    return f"{100 * row.effect:+6.2f} pts best minus worst ({row.detail})"


def _empty() -> pd.DataFrame:
    return pd.DataFrame(columns=["parameter", "importance", "effect", "effect_kind", "detail"])


def _plain(value):
    return value.item() if hasattr(value, "item") else value
