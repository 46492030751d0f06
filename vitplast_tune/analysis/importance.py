"""Which searched settings matter for accuracy: Optuna's fANOVA importance of each parameter (a component's flag, the
learning rate, ...) and the direction of its effect.

Each trial with a finite target becomes a COMPLETE trial of an in-memory Optuna study whose value is the target;
``FanovaImportanceEvaluator`` (seeded) splits the variance of the target between the parameters (importances sum
to 1). A search's target is ``val_acc_common``, the validation accuracy at the last step every trial reached, so
that trials the scheduler stopped early count at the budget all trials share (Optuna's own importance would use
only the COMPLETE trials, those ASHA let finish: the best ones). The direction of a boolean (a component's flag) is
the mean target with it minus without it; of a number (the learning rate), Spearman's rank correlation with the
target; of another choice, the best mean minus the worst.

fANOVA's cost grows faster than linearly with the trials on a noisy target (its trees' leaves, each marginalized
over every subspace; measured on the dated scale page of the docs' results). Above ``MAX_FANOVA_TRIALS`` it is
fitted on a seeded random sample of that many trials, which the summary states; the directions are always over
every trial.

Pure functions on pandas objects and Optuna; nothing here needs Ray, MLflow or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

MIN_TRIALS = 5  # fewer trials with a finite target: no importance, only a note
MAX_FANOVA_TRIALS = 1000  # more: fANOVA on a seeded sample of this many (directions over all)


@dataclass
class Importance:
    """The importance table (``parameter``, ``importance``, ``effect``, ``effect_kind``, ``detail``; most important
    first), what it was computed for, and why it is empty when it is."""

    table: pd.DataFrame
    target: str
    n: int
    seed: int
    note: str = ""
    fitted: int | None = None  # the trials fANOVA was fitted on, when a sample of the ``n``

    @property
    def trials(self) -> str:
        """The trials it counts, in words: ``60 trials`` or ``1,000 of 3,000 trials`` (a sample)."""
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
    """Measure how much each searched parameter matters for ``target``, and which way: fANOVA importance and direction.

    fANOVA sees a seeded sample of ``max_trials`` trials when there are more.

    Args:
        params: The searched parameters, a column each, a row per trial.
        distributions: The Optuna distribution of each column, by column.
        target: What they should explain, a Series aligned with ``params``.
        label: What the target is (default: its name).
        seed: The seed of fANOVA and of its sample.
        min_trials: The fewest trials with finite values that get an importance.
        max_trials: The most trials fANOVA is fitted on.

    Returns:
        The importance table, most important first, and what it was computed for; empty (with a note saying why)
        with too few trials or a constant target.
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
    """Optuna's fANOVA importances of the columns of ``x`` for ``y``, through an in-memory study of COMPLETE trials."""
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
    """The sign of a parameter's effect: with minus without (a boolean), Spearman (a number), best minus worst mean."""
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
    """The importance block of a search's summary: one line per parameter, most important first."""
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
