"""The criteria that score a subset before training, in one registry (``CRITERIA``: name -> kind and function), and
the tables they read: plasticity (per component, then a subset's mean, max and parameter-weighted mean), the gradient
criteria (a subset's gradient norm, its ratio to the weight norm, Auto-RGN, averaged over the head initialisations
they were measured with), what the subset trains, and its trainable parameter count.

pandas only: the search's driver scores every trial without torch; ``vit/plasticity.py`` and ``vit/gradients.py``
measure the tables. The baseline every criterion must beat is the base-10 log of the trainable parameter count
(``log_trainable_params``, the one place it is computed: the search's trial table, its analysis and ``recommend``
show the same number). Adding a criterion is one ``register`` call at the end of this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from vitplast_tune.components import COMPONENTS, parse_subset
from vitplast_tune.errors import UserError, did_you_mean

BASELINE = "log_trainable_params"  # the naive criterion every other one must beat: log10 of the trainable parameters
# What a criterion reads (``Criterion.kind``)
PLASTICITY, IN_NETWORK, GRADIENTS, SUBSET, COUNT = "plasticity", "in_network", "gradients", "subset", "count"


@dataclass(frozen=True)
class Criterion:
    """One criterion: what it reads (its kind) and the function that scores a subset from that.

    Attributes:
        kind: What ``score`` is given. ``plasticity`` and ``in_network``: the plasticity of each of the subset's block
            components (an array; measured on image pairs, or on the network's own inputs at a search's end) and
            their parameter counts (an array). ``gradients``: the gradient table's rows of the subset's components
            for one head seed, one row of sums per component (``grad_sq``, ``weight_sq``, ``rgn_sum``, ``tensors``).
            ``subset``: the subset's component names. ``count``: its trainable parameter count.
        score: The function; it returns a float (NaN where it is undefined).
    """

    kind: str
    score: Callable[..., float]


CRITERIA: dict[str, Criterion] = {}  # in the pre-registration's order (``register`` below)


def register(name: str, kind: str, score: Callable[..., float]) -> None:
    """Add a criterion: every search scores its subsets by it, and the criteria lab judges it against the baseline.

    Args:
        name: Its name, the column of the trial table and the row of the lab's comparison.
        kind: What ``score`` reads: ``PLASTICITY``, ``IN_NETWORK``, ``GRADIENTS``, ``SUBSET`` or ``COUNT``.
        score: The function (see ``Criterion``).
    """
    CRITERIA[name] = Criterion(kind, score)


def criteria(kind: str) -> list[str]:
    """List the criteria of one kind.

    Args:
        kind: The kind.

    Returns:
        Their names, in the registry's order.
    """
    return [name for name, c in CRITERIA.items() if c.kind == kind]


def lab_criteria() -> tuple[str, ...]:
    """List what a criteria lab judges.

    Returns:
        Every criterion's name in the registry's order, the baseline last.
    """
    return (*(name for name in CRITERIA if name != BASELINE), BASELINE)


def aggregate_plasticity(table: pd.DataFrame) -> pd.DataFrame:
    """Summarize a per-layer plasticity table per component.

    Args:
        table: The per-layer table of a plasticity report.

    Returns:
        One row per component present, in the order emb, ln1, mha, ln2, fc1, fc2: the mean ``plasticity`` over
        layers, its ``spread`` (std over layers), ``min``, ``max``, ``n_layers``, and ``rank`` among the block
        components (1 = most plastic). ``emb`` has no rank: its ratio is relative to pixels, another scale.
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
    table: pd.DataFrame,
    subset: str | Iterable[str],
    param_counts: dict[str, int],
    blocks: Iterable[int] | None = None,
    kind: str = PLASTICITY,
) -> dict[str, float]:
    """Score a subset of components by the per-component plasticity means of its block components.

    ``emb`` never enters: its ratio is relative to pixels, another scale (``aggregate_plasticity`` gives it no
    rank), so ``emb+fc1`` scores as ``fc1`` and ``all`` as its five block components.

    Args:
        table: The per-layer table of a plasticity report.
        subset: The subset.
        param_counts: The parameters per component, ``freezing.count_parameters(model, layout=...)``.
        blocks: The block indices whose layers count (a trial's depth); None for every block.
        kind: The criteria it scores: ``PLASTICITY``, or ``IN_NETWORK`` for a table measured in the network.

    Returns:
        Each criterion of ``kind`` (``plasticity_mean``, ``plasticity_max``, ``plasticity_weighted``); NaN each for
        a subset without a block component (the head alone, ``emb``).

    Raises:
        UserError: If the table or ``param_counts`` lacks one of the subset's components.
    """
    names = tuple(c for c in parse_subset(subset) if c != "emb")
    if not names:
        return dict.fromkeys(criteria(kind), math.nan)
    if blocks is not None:
        table = table[(table["component"] == "emb") | table["layer"].isin(list(blocks))]
    means = aggregate_plasticity(table).set_index("component")["plasticity"]
    missing = [c for c in names if c not in means.index]
    if missing:
        raise UserError(f"the plasticity table has no rows for {', '.join(missing)}")
    missing = [c for c in names if c not in param_counts]
    if missing:
        raise UserError(
            f"param_counts has no count for {', '.join(missing)}; pass freezing.count_parameters(model, layout=...)"
        )
    values = np.array([means[c] for c in names], dtype=float)
    weights = np.array([param_counts[c] for c in names], dtype=float)
    return {name: float(CRITERIA[name].score(values, weights)) for name in criteria(kind)}


def num_blocks(table: pd.DataFrame) -> int:
    """The number of blocks of the model a plasticity table was measured on (its block components' layers)."""
    layers = table.loc[table["component"] != "emb", "layer"]
    return int(layers.max()) + 1 if len(layers) else 0


def layer_table(table: pd.DataFrame) -> pd.DataFrame:
    """Plasticity per block component (rows, the paper's order) and layer (columns): the table beside a depth search."""
    rows = table[table["component"] != "emb"]
    wide = rows.pivot_table(index="component", columns="layer", values="plasticity", aggfunc="mean")
    return wide.reindex([c for c in COMPONENTS if c in wide.index])


def gradient_criteria(rows: pd.DataFrame) -> pd.DataFrame:
    """Add each gradient criterion to a table of gradient sums, one row at a time (a layer's, or a component's).

    Args:
        rows: Rows with the sums of ``vit.gradients.gradient_table`` (``grad_sq``, ``weight_sq``, ``rgn_sum``,
            ``tensors``).

    Returns:
        The table with one more column per criterion of kind ``GRADIENTS``.
    """
    rows = rows.reset_index(drop=True)
    found = {name: [CRITERIA[name].score(rows.iloc[[i]]) for i in range(len(rows))] for name in criteria(GRADIENTS)}
    return rows.assign(**{name: pd.Series(values, index=rows.index, dtype=float) for name, values in found.items()})


def _component_sums(table: pd.DataFrame) -> pd.DataFrame:
    """Per component (and per ``head_seed`` when the table has several heads): the gradient sums over its layers."""
    keys = ["head_seed", "component"] if "head_seed" in table else ["component"]
    out = table.groupby(keys, sort=False)[["grad_sq", "weight_sq", "params", "tensors", "rgn_sum"]].sum().reset_index()
    order = out["component"].map({c: i for i, c in enumerate(COMPONENTS)})
    return out.iloc[np.lexsort((order, out["head_seed"]) if "head_seed" in out else (order,))].reset_index(drop=True)


def aggregate_criteria(table: pd.DataFrame) -> pd.DataFrame:
    """Per component (and per ``head_seed`` when the table has several heads): the gradient criteria over all its
    layers (``gradient_criteria`` of its sums): grad_norm and grad_norm_ratio of its whole parameter vector,
    auto_rgn the mean over all its tensors."""
    return gradient_criteria(_component_sums(table)).drop(columns="rgn_sum")


def criteria_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per component and gradient criterion (kind ``GRADIENTS``) over the head seeds: mean, std (ddof=1), min, max, the rank
    of the mean (1 = highest, over every component) and ``rank_changes``, whether some head seed ranks the
    components in another order for that criterion."""
    per = aggregate_criteria(table)
    seeds = per["head_seed"] if "head_seed" in per else pd.Series(0, index=per.index)
    rows = []
    for criterion in criteria(GRADIENTS):
        wide = per.pivot_table(index=seeds.rename("head_seed"), columns="component", values=criterion, sort=False)
        wide = wide[[c for c in COMPONENTS if c in wide.columns]]
        orders = {tuple(wide.loc[s].sort_values(ascending=False, kind="stable").index) for s in wide.index}
        mean = wide.mean()
        for component in wide.columns:
            values = wide[component]
            rows.append(
                {
                    "criterion": criterion,
                    "component": component,
                    "mean": mean[component],
                    "std": values.std(ddof=1) if len(values) > 1 else math.nan,
                    "min": values.min(),
                    "max": values.max(),
                    "rank": int(mean.rank(ascending=False, method="min")[component]),
                    "head_seeds": len(values),
                    "rank_changes": len(orders) > 1,
                }
            )
    return pd.DataFrame(rows)


def top_by_seed(table: pd.DataFrame, criterion: str) -> pd.Series:
    """How many head seeds rank each component first by ``criterion`` (components that never are left out)."""
    per = aggregate_criteria(table)
    if "head_seed" not in per:
        per = per.assign(head_seed=0)
    tops = per.loc[per.groupby("head_seed")[criterion].idxmax(), "component"]
    return tops.value_counts()


def subset_criteria(table: pd.DataFrame, subset: str | Iterable[str]) -> dict[str, float]:
    """Gradient criteria of a subset (like ``subset_scores``), the mean over head seeds of each seed's score.

    Per head seed: grad_norm = ||g_S|| and grad_norm_ratio = ||g_S|| / ||theta_S|| over every parameter of the
    subset; auto_rgn = the mean of its components' Auto-RGN (each the mean over the component's tensors).
    ``table`` is ``measure_gradients``' (or one ``gradient_table``); the head-only subset gives NaN.
    """
    names, kind = parse_subset(subset), criteria(GRADIENTS)
    if not names:
        return dict.fromkeys(kind, math.nan)
    per = _component_sums(table)
    missing = [c for c in names if c not in set(per["component"])]
    if missing:
        raise UserError(f"the gradient table has no rows for {', '.join(missing)}")
    rows = per[per["component"].isin(names)]
    by_seed = [rows_of_seed for _, rows_of_seed in rows.groupby("head_seed")] if "head_seed" in rows else [rows]
    return {name: float(np.mean([CRITERIA[name].score(part) for part in by_seed])) for name in kind}


def _check_table(table: pd.DataFrame) -> None:
    missing = {"component", "layer", "plasticity"} - set(table.columns)
    if missing:
        raise UserError(f"not a plasticity table: missing column(s) {', '.join(sorted(missing))}")
    unknown = sorted(set(table["component"]) - set(COMPONENTS))
    if unknown:
        hint = did_you_mean(unknown[0], COMPONENTS)
        raise UserError(f'unknown component "{unknown[0]}"{hint} in the plasticity table')


def log_trainable_params(counts: float | Iterable[float] | pd.Series) -> float | np.ndarray:
    """Compute the baseline predictor, the base-10 log of a trainable-parameter count (6.0 for a million).

    Every log of a parameter count a user sees is this one: the search's trial table (``log10_trainable_params``),
    its analysis and ``recommend`` (``log_trainable_params``). Rank statistics read any base alike.

    Args:
        counts: A count, or an array or column of counts.

    Returns:
        The log10 of the count (a float), or of each count (an array); NaN where it is not a positive number.
    """
    values = np.asarray(pd.to_numeric(counts, errors="coerce"), dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(values > 0, np.log10(values), np.nan)
    return float(logs) if logs.ndim == 0 else logs


def contains_mha_or_fc(subset: str | Iterable[str]) -> float:
    """1.0 when a subset trains attention or a feed-forward layer (the paper's high-plasticity components), else 0.0."""
    return float(bool({"mha", "fc1", "fc2"} & set(parse_subset(subset))))


def structure_scores(subset: str | Iterable[str], trainable_params: float | None) -> dict[str, float]:
    """Score a subset by the criteria that need no measurement: its components and its trainable parameter count.

    Args:
        subset: The subset.
        trainable_params: Its trainable parameter count (None: unknown, NaN scores).

    Returns:
        Each criterion of kind ``SUBSET`` and ``COUNT``.
    """
    names = parse_subset(subset)
    found = {name: CRITERIA[name].score(names) for name in criteria(SUBSET)}
    return found | {name: CRITERIA[name].score(trainable_params) for name in criteria(COUNT)}


def _mean(values: np.ndarray, weights: np.ndarray) -> float:
    return float(values.mean())


def _weighted(values: np.ndarray, weights: np.ndarray) -> float:
    return float(values @ weights / weights.sum()) if weights.sum() > 0 else math.nan


def _grad_norm(rows: pd.DataFrame) -> float:
    return math.sqrt(rows["grad_sq"].sum())


def _grad_norm_ratio(rows: pd.DataFrame) -> float:
    weight = math.sqrt(rows["weight_sq"].sum())
    return _grad_norm(rows) / weight if weight > 0 else math.nan


def _auto_rgn(rows: pd.DataFrame) -> float:
    return float((rows["rgn_sum"] / rows["tensors"].replace(0, np.nan)).mean())


register("plasticity_mean", PLASTICITY, _mean)
register("plasticity_max", PLASTICITY, lambda values, weights: float(values.max()))
register("plasticity_weighted", PLASTICITY, _weighted)
register("in_network_mean", IN_NETWORK, _mean)
register("grad_norm", GRADIENTS, _grad_norm)
register("grad_norm_ratio", GRADIENTS, _grad_norm_ratio)
register("auto_rgn", GRADIENTS, _auto_rgn)
register("contains_mha_or_fc", SUBSET, contains_mha_or_fc)
register(BASELINE, COUNT, log_trainable_params)
