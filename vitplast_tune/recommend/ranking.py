"""Recommending which component subsets to finetune before any search, with the evidence behind the ranking.

``recommend`` measures the pre-training predictors of a model on a dataset (the paper plasticity, the
in-network plasticity, the gradient criteria: ``report``), scores every non-empty subset, and ranks them by
the criterion that predicted accuracy best on the searches recorded under the storage folder (criteria-lab
tables ``analysis/criteria.csv`` first, per-trial ``analysis/correlations.csv`` otherwise), or by the paper's
mean plasticity when there is no evidence yet. Checking a recommendation with a real search is ``verify``'s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vitplast_tune.analysis.lab import LAB_PREDICTORS
from vitplast_tune.components import HEAD, all_subsets, count_trainable, parse_subset, subset_name
from vitplast_tune.config import FinetuneConfig, trial_config
from vitplast_tune.predictors import report
from vitplast_tune.predictors.scores import BASELINE, contains_mha_or_fc, log_trainable_params
from vitplast_tune.storage import SEARCH_FILE

DEFAULT_CRITERION = "plasticity_mean"  # the paper's: without evidence, rank by the mean plasticity of the subset


@dataclass
class Recommendation:
    """Every subset scored and ranked, the criterion that ranks them, and the evidence for each criterion."""

    model: str
    dataset: str
    ranked: pd.DataFrame  # one row per subset within the budget, best first
    criterion: str
    evidence: pd.DataFrame  # read_evidence's rows
    budget: int | None = None
    seconds: float = 0.0
    settings: FinetuneConfig = field(default_factory=FinetuneConfig)


def subset_scores(
    predictors: report.Predictors,
    settings: FinetuneConfig,
    in_network: pd.DataFrame | None = None,
    subsets: Iterable[str] | None = None,
) -> pd.DataFrame:
    """One row per subset (default: every non-empty subset, in full; or ``subsets``, which may name methods such as
    "mha:lora+fc1"): its trainable parameters (by its methods, in the blocks of ``settings``' depth, at its LoRA rank,
    head included) and every pre-training predictor of the lab."""
    from vitplast_tune.vit.methods import trainable_parameters

    summary = predictors.plasticity.meta["parameter_summary"]  # of the model without its head
    head = trainable_parameters(trial_config({"components": HEAD}, settings))
    num_blocks = 1 + max((r["block"] for r in summary if r["block"] is not None), default=-1)
    rows = []
    for subset in all_subsets() if subsets is None else subsets:
        cfg = settings.merged({"components": subset})
        chosen = parse_subset(subset)
        counts = count_trainable(summary, subset, cfg.block_indices(num_blocks), cfg.lora_rank)
        trainable = head + sum(counts[c] for c in chosen)
        rows.append(
            {
                "components": subset_name(subset),
                "trainable_params": trainable,
                BASELINE: log_trainable_params(trainable),
                "contains_mha_or_fc": contains_mha_or_fc(chosen),
                **predictors.trial_scores(cfg),
            }
        )
    table = pd.DataFrame(rows)
    if in_network is not None:
        table["in_network_mean"] = table["components"].map(in_network["in_network_mean"])
    return table


def read_evidence(storage: Path) -> pd.DataFrame:
    """How well each criterion predicted accuracy on the searches stored under ``storage``: one row per search and
    criterion.

    Criteria-lab tables (``analysis/criteria.csv``: test accuracy per subset at its best lr; of a lab at several step
    budgets, the longest) have ``source`` "lab";
    per-trial correlations (``analysis/correlations.csv``, final validation accuracy, confounded by lr) "trials".
    """
    rows = []
    for record_path in sorted(Path(storage).expanduser().glob(f"*/{SEARCH_FILE}")):
        directory = record_path.parent
        settings = json.loads(record_path.read_text()).get("settings", {})
        where = {"search": directory.name, "model": settings.get("model"), "dataset": settings.get("dataset")}
        lab, trials = directory / "analysis" / "criteria.csv", directory / "analysis" / "correlations.csv"
        if lab.is_file():
            rows += [dict(where, source="lab", **r) for r in _evidence_rows(_longest_budget(pd.read_csv(lab)))]
        elif trials.is_file():
            table = pd.read_csv(trials)
            rows += [dict(where, source="trials", **r) for r in _evidence_rows(table[table["target"] == "val_acc"])]
    return pd.DataFrame(
        rows,
        columns=[
            *("search", "model", "dataset", "source", "criterion"),
            *("spearman", "spearman_low", "spearman_high", "n", "verdict"),
        ],
    )


def _longest_budget(table: pd.DataFrame) -> pd.DataFrame:
    """A lab table at several step budgets (a ``budget`` column) as the rows of its longest: where the subsets end,
    not how fast they start."""
    if "budget" not in table:
        return table
    return table[table["budget"] == table["budget"].max()]


def _evidence_rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    ok = table[table["spearman"].notna()] if "spearman" in table else table.head(0)
    verdicts = ok["verdict"] if "verdict" in ok else pd.Series(None, index=ok.index, dtype=object)
    return [
        {
            "criterion": r.predictor,
            "spearman": r.spearman,
            "spearman_low": r.spearman_low,
            "spearman_high": r.spearman_high,
            "n": int(r.n),
            "verdict": verdict if isinstance(verdict, str) else None,  # a lab's, against the parameter count
        }
        for r, verdict in zip(ok.itertuples(), verdicts)
    ]


def choose_criterion(evidence: pd.DataFrame, model: str | None = None, dataset: str | None = None) -> tuple[str, str]:
    """The criterion to rank by, and why: on the best evidence there is (criteria labs on this model and dataset,
    then any lab, then per-trial correlations), the highest mean Spearman; where labs judged their predictors
    against the parameter count, one they found clearly better, else the parameter count. Without evidence, the
    paper's mean plasticity."""
    usable = evidence[evidence["criterion"].isin(LAB_PREDICTORS)]
    same = (usable["model"] == model) & (usable["dataset"] == dataset)
    for rows, what in (
        (usable[same & (usable["source"] == "lab")], f"criteria labs on {model} / {dataset}"),
        (usable[usable["source"] == "lab"], "criteria labs (other models or datasets)"),
        (usable[same], f"per-trial correlations on {model} / {dataset} (confounded by lr)"),
        (usable, "per-trial correlations (other models or datasets; confounded by lr)"),
    ):
        if rows.empty:
            continue
        judged = _lab_judgement(rows)
        if judged is not None:
            return judged
        mean = rows.groupby("criterion")["spearman"].mean().sort_values(ascending=False)
        best, rho = mean.index[0], mean.iloc[0]
        chosen = rows[rows["criterion"] == best]
        why = (
            f"best mean Spearman {rho:+.2f} with accuracy over {chosen['search'].nunique()} search(es) "
            f"(n={int(chosen['n'].sum())}): {what}"
        )
        return best, why + (
            "" if rho > 0 else "; no criterion predicted accuracy positively, treat the ranking as a guess"
        )
    return DEFAULT_CRITERION, "the paper's criterion; no evidence yet (no criteria lab or search results recorded)"


def _lab_judgement(rows: pd.DataFrame) -> tuple[str, str] | None:
    """Labs that judged their predictors against the parameter count (a ``verdict`` per row) decide by it: the
    criterion every lab found clearly better (the highest mean Spearman of those), else the parameter count itself.
    None when the rows carry no verdicts (per-trial correlations, older labs)."""
    if rows["verdict"].isna().all() or BASELINE not in set(rows["criterion"]):
        return None
    labs = rows["search"].nunique()
    verdicts = rows[rows["criterion"] != BASELINE].groupby("criterion")["verdict"]
    better = [c for c, v in verdicts if (v == "better").sum() == labs]  # judged better by each lab
    if better:
        mean = rows[rows["criterion"].isin(better)].groupby("criterion")["spearman"].mean().sort_values()
        return mean.index[-1], (
            f"clearly better than log(#trainable params) in every criteria lab ({labs}), mean Spearman "
            f"{mean.iloc[-1]:+.2f}"
        )
    rho = rows.loc[rows["criterion"] == BASELINE, "spearman"].mean()
    return BASELINE, (
        f"no criterion ranked the subsets clearly better than the parameter count in the criteria lab(s) ({labs}; "
        f"its mean Spearman {rho:+.2f}), so the ranking is by the parameter count"
    )


def rank(scores: pd.DataFrame, criterion: str, budget: int | None = None) -> pd.DataFrame:
    """The subsets within ``budget`` trainable parameters, best first by ``criterion`` (higher first); ties: fewer
    parameters."""
    shown = scores if budget is None else scores[scores["trainable_params"] <= budget]
    shown = shown.dropna(subset=[criterion])
    ranked = shown.sort_values([criterion, "trainable_params"], ascending=[False, True], kind="stable")
    return ranked.reset_index(drop=True).assign(rank=lambda t: np.arange(1, len(t) + 1))


def recommend(
    settings: FinetuneConfig,
    storage: Path,
    *,
    budget: int | None = None,
    reference: str = "fractals",
    plasticity_pairs: int | None = None,
    num_batches: int = 5,
) -> Recommendation:
    """Measure the predictors of ``settings``' model and dataset (cached plasticity reused) and rank every subset."""
    started = time.perf_counter()
    s = settings
    measured = report.search_report(s, reference=reference, max_pairs=plasticity_pairs)
    gradients = report.gradient_report(s, num_batches=num_batches)
    in_network = report.in_network_scores(s, all_subsets(), reference=reference, plasticity_pairs=plasticity_pairs)
    scores = subset_scores(report.Predictors(measured, gradients), s, in_network)
    evidence = read_evidence(storage)
    criterion, _ = choose_criterion(evidence, s.model, s.dataset)
    ranked = rank(scores, criterion, budget)
    return Recommendation(s.model, s.dataset, ranked, criterion, evidence, budget, time.perf_counter() - started, s)


def describe(rec: Recommendation, top: int = 10) -> str:
    """The ranked subsets with their scores, the criterion that ranks them and the evidence for every criterion."""
    _, why = choose_criterion(rec.evidence, rec.model, rec.dataset)
    budget = "" if rec.budget is None else f", within {rec.budget:,} trainable parameters"
    lines = [
        f"Recommended subsets to finetune for {rec.model} on {rec.dataset}{budget} "
        f"(measured in {rec.seconds:.0f} s, no training):",
        f"ranked by {rec.criterion}: {why}.",
    ]
    if rec.ranked.empty:
        return "\n".join(lines + ["no subset fits the budget: only the linear probe (head) does"])
    shown = ["rank", "components", "trainable_params", rec.criterion] + [
        c for c in ("plasticity_mean", "in_network_mean", "auto_rgn", BASELINE) if c != rec.criterion
    ]
    table = rec.ranked.head(top)[shown].copy()
    table["trainable_params"] = table["trainable_params"].map(lambda v: f"{int(v):,}")
    lines.append(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    lines += [
        "",
        "Evidence: Spearman of each criterion with accuracy on the searches recorded so far "
        "(lab: test accuracy per subset at its best lr; trials: final validation accuracy per trial):",
    ]
    if rec.evidence.empty:
        lines.append("  no evidence yet: run a criteria lab (vitplast search --space criteria_lab) or --verify")
    for r in rec.evidence.sort_values(["criterion", "search"]).itertuples():
        lines.append(
            f"  {r.criterion:<22} {r.spearman:+.2f} [{r.spearman_low:+.2f}, {r.spearman_high:+.2f}] n={r.n:<3} "
            f"{r.source} {r.search} ({r.model} / {r.dataset})"
        )
    return "\n".join(lines)


def warm_start_subsets(
    predictors: report.Predictors, settings: FinetuneConfig, storage: str | Path, budget: int | None = None
) -> list[str]:
    """Every subset within ``budget`` trainable parameters, ranked best first by the criterion the evidence recorded
    under ``storage`` backs (``choose_criterion``): the subsets a space with ``warm_start`` lets TPE try first."""
    scores = subset_scores(predictors, settings)
    ranked = rank(scores, choose_criterion(read_evidence(Path(storage)))[0], budget)
    return list(ranked["components"])
