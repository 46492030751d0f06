"""A subset's scores from the tables measured before training: plasticity (per component, then a subset's
mean, max and parameter-weighted mean) and the gradient criteria (a subset's gradient norm, Auto-RGN).

pandas only: the search's driver scores every trial without torch; ``vit/plasticity.py`` and ``vit/gradients.py``
measure the tables. The baseline every predictor must beat is the log of the trainable parameter count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from vitplast_tune.components import COMPONENTS, parse_subset
from vitplast_tune.errors import UserError, did_you_mean

GRADIENT_SCORES: tuple[str, ...] = ("grad_norm", "rgn", "rgn_mean")  # a subset's gradient scores (vit/gradients.py)
BASELINE = "log_trainable_params"  # the naive predictor every other one must beat


def aggregate_plasticity(table: pd.DataFrame) -> pd.DataFrame:
    """Per component: the mean of ``plasticity`` over layers, its spread (std over layers), min and max.

    Rows in the order emb, ln1, mha, ln2, fc1, fc2 (those present); ``rank`` orders the block
    components, 1 = most plastic. ``emb`` has no rank: its ratio is relative to pixels, another scale.
    """
    _check_table(table)
    grouped = table.groupby("component", sort=False)["plasticity"]
    out = pd.DataFrame(
        {
            "plasticity": grouped.mean(),
            "spread": grouped.std(ddof=0),
            "min": grouped.min(),
            "max": grouped.max(),
            "n_layers": grouped.count(),
        }
    )
    out = out.reindex([c for c in COMPONENTS if c in out.index])
    ranked = out.loc[out.index != "emb", "plasticity"].rank(ascending=False, method="min")
    out["rank"] = ranked.reindex(out.index).astype("Int64")
    out = out.rename_axis("component").reset_index()
    out.attrs.update(table.attrs)
    return out


def subset_scores(
    table: pd.DataFrame, subset: str | Iterable[str], param_counts: dict[str, int], blocks: Iterable[int] | None = None
) -> dict[str, float]:
    """Plasticity scores of a subset of components: mean, max, and parameter-weighted mean of the per-component means.

    ``param_counts`` is ``components.count_parameters(model)``; the head-only subset gives NaN for each score.
    ``blocks`` restricts the block components' layers to those block indices (a trial's depth: the mean
    plasticity of the layers it trains); ``emb`` is model level.
    """
    names = parse_subset(subset)
    if not names:
        return {"plasticity_mean": math.nan, "plasticity_max": math.nan, "plasticity_weighted": math.nan}
    if blocks is not None:
        table = table[(table["component"] == "emb") | table["layer"].isin(list(blocks))]
    means = aggregate_plasticity(table).set_index("component")["plasticity"]
    missing = [c for c in names if c not in means.index]
    if missing:
        raise UserError(f"the plasticity table has no rows for {', '.join(missing)}")
    missing = [c for c in names if c not in param_counts]
    if missing:
        raise UserError(f"param_counts has no count for {', '.join(missing)}; pass components.count_parameters(model)")
    values = np.array([means[c] for c in names], dtype=float)
    weights = np.array([param_counts[c] for c in names], dtype=float)
    weighted = float(values @ weights / weights.sum()) if weights.sum() > 0 else math.nan
    return {
        "plasticity_mean": float(values.mean()),
        "plasticity_max": float(values.max()),
        "plasticity_weighted": weighted,
    }


def num_blocks(table: pd.DataFrame) -> int:
    """The number of blocks of the model a plasticity table was measured on (its block components' layers)."""
    layers = table.loc[table["component"] != "emb", "layer"]
    return int(layers.max()) + 1 if len(layers) else 0


def layer_table(table: pd.DataFrame) -> pd.DataFrame:
    """Plasticity per block component (rows, the paper's order) and layer (columns): the table beside a depth search."""
    rows = table[table["component"] != "emb"]
    wide = rows.pivot_table(index="component", columns="layer", values="plasticity", aggfunc="mean")
    return wide.reindex([c for c in COMPONENTS if c in wide.index])


def aggregate_criteria(table: pd.DataFrame) -> pd.DataFrame:
    """Per component: grad_norm and rgn over all its layers together, and rgn_mean, the mean of rgn over layers."""
    grouped = table.groupby("component", sort=False)
    out = pd.DataFrame(
        {
            "grad_sq": grouped["grad_sq"].sum(),
            "weight_sq": grouped["weight_sq"].sum(),
            "params": grouped["params"].sum(),
            "rgn_mean": grouped["rgn"].mean(),
        }
    )
    out = out.reindex([c for c in COMPONENTS if c in out.index])
    out["grad_norm"] = np.sqrt(out["grad_sq"])
    out["rgn"] = out["grad_norm"] / np.sqrt(out["weight_sq"]).replace(0.0, np.nan)
    return out.rename_axis("component").reset_index()


def subset_criteria(table: pd.DataFrame, subset: str | Iterable[str]) -> dict[str, float]:
    """Criterion scores of a subset (like ``plasticity.subset_scores``): norms of its whole parameter vector.

    grad_norm = ||g_S||, rgn = ||g_S|| / ||theta_S|| over every parameter of the subset, rgn_mean = mean of the
    components' per-layer mean rgn. ``table`` is a ``gradient_table``; the head-only subset gives NaN.
    """
    names = parse_subset(subset)
    if not names:
        return dict.fromkeys(GRADIENT_SCORES, math.nan)
    per = aggregate_criteria(table).set_index("component")
    missing = [c for c in names if c not in per.index]
    if missing:
        raise UserError(f"the gradient table has no rows for {', '.join(missing)}")
    rows = per.loc[list(names)]
    grad, weight = math.sqrt(rows["grad_sq"].sum()), math.sqrt(rows["weight_sq"].sum())
    return {
        "grad_norm": grad,
        "rgn": grad / weight if weight > 0 else math.nan,
        "rgn_mean": float(rows["rgn_mean"].mean()),
    }


def _check_table(table: pd.DataFrame) -> None:
    missing = {"component", "layer", "plasticity"} - set(table.columns)
    if missing:
        raise UserError(f"not a plasticity table: missing column(s) {', '.join(sorted(missing))}")
    unknown = sorted(set(table["component"]) - set(COMPONENTS))
    if unknown:
        hint = did_you_mean(unknown[0], COMPONENTS)
        raise UserError(f'unknown component "{unknown[0]}"{hint} in the plasticity table')


def log_trainable_params(counts):
    """The baseline predictor: ln(trainable parameters) of a count, or of each count in an array or column (NaN where
    it is not a positive number)."""
    values = np.asarray(pd.to_numeric(counts, errors="coerce"), dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(values > 0, np.log(values), np.nan)
    return float(logs) if logs.ndim == 0 else logs


def contains_mha_or_fc(subset: str | Iterable[str]) -> float:
    """1.0 when a subset trains attention or a feed-forward layer (the paper's high-plasticity components), else 0.0."""
    return float(bool({"mha", "fc1", "fc2"} & set(parse_subset(subset))))
