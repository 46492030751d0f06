"""Rank the component subsets to finetune before any search, and show the evidence behind the ranking."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vitplast_tune.components import HEAD, all_subsets, parse_subset, subset_name
from vitplast_tune.config import FinetuneConfig, trial_config
from vitplast_tune.freezing import count_trainable
from vitplast_tune.predictors import report
from vitplast_tune.predictors.scores import BASELINE, structure_scores
from vitplast_tune.storage import SEARCH_FILE

POOLED_FILE = "pooled.json"  # vitplast lab pooled writes the pooled verdict here


@dataclass
class Recommendation:
    """Every subset scored and ranked, with the criterion that ranks them and the evidence for each criterion.

    Attributes:
        model: The model's name.
        dataset: The dataset's name.
        ranked: One row per subset within the budget, best first, with every score.
        criterion: The criterion that ranks them.
        evidence: How well each criterion predicted accuracy so far, as ``read_evidence`` reads it.
        budget: The most trainable parameters a subset may have, or None for no limit.
        seconds: How long measuring took.
        settings: The finetuning settings the predictors were measured under.
    """

    model: str
    dataset: str
    ranked: pd.DataFrame
    criterion: str
    evidence: pd.DataFrame
    budget: int | None = None
    seconds: float = 0.0
    settings: FinetuneConfig = field(default_factory=FinetuneConfig)


def subset_scores(
    predictors: report.Predictors,
    settings: FinetuneConfig,
    in_network: pd.DataFrame | None = None,
    subsets: Iterable[str] | None = None,
) -> pd.DataFrame:
    """Score each subset, such as "mha:lora+fc1", by its trainable parameters and every pre-training predictor."""
    from vitplast_tune.vit.methods import trainable_parameters

    summary = predictors.plasticity.meta["parameter_summary"]  # it leaves out the head
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
                **structure_scores(chosen, trainable),
                **predictors.trial_scores(cfg),
            }
        )
    table = pd.DataFrame(rows)
    if in_network is not None:
        table["in_network_mean"] = table["components"].map(in_network["in_network_mean"])
    return table


EVIDENCE_COLUMNS = (
    *("search", "model", "dataset", "source", "criterion"),
    *("spearman", "spearman_low", "spearman_high", "n", "verdict", "diff", "diff_low", "diff_high", "labs"),
)


def read_evidence(storage: Path) -> pd.DataFrame:
    """Read how well each criterion predicted accuracy in the verdicts, labs and searches under ``storage``."""
    root = Path(storage).expanduser()
    rows = []
    for path in sorted(root.glob(f"*/{POOLED_FILE}")):
        rows += _pooled_rows(path)
    for path in sorted(root.glob("*/lab.json")):
        record, lab = json.loads(path.read_text()), path.parent / "analysis" / "criteria.csv"
        if lab.is_file():
            where = {"search": path.parent.name, "model": record.get("model"), "dataset": record.get("dataset")}
            rows += [dict(where, source="lab", **r) for r in _evidence_rows(_longest_budget(pd.read_csv(lab)))]
    for record_path in sorted(root.glob(f"*/{SEARCH_FILE}")):
        directory = record_path.parent
        settings = json.loads(record_path.read_text()).get("settings", {})
        where = {"search": directory.name, "model": settings.get("model"), "dataset": settings.get("dataset")}
        lab, trials = directory / "analysis" / "criteria.csv", directory / "analysis" / "correlations.csv"
        if lab.is_file():
            rows += [dict(where, source="lab", **r) for r in _evidence_rows(_longest_budget(pd.read_csv(lab)))]
        elif trials.is_file():
            table = pd.read_csv(trials)
            rows += [dict(where, source="trials", **r) for r in _evidence_rows(table[table["target"] == "val_acc"])]
    return pd.DataFrame(rows, columns=list(EVIDENCE_COLUMNS))


def _pooled_rows(path: Path) -> list[dict[str, Any]]:
    """Read one row per criterion from a pooled verdict."""
    pooled = json.loads(path.read_text())
    if pooled.get("complete") is False:  # an interim look backs no criterion
        return []
    labs = pooled.get("labs", [])
    where = {
        "search": path.parent.name,
        "model": ", ".join(sorted({lab["model"] for lab in labs})),
        "dataset": ", ".join(sorted({lab["dataset"] for lab in labs})),
        "source": "pooled",
        "labs": "; ".join(f"{lab['model']} / {lab['dataset']}" for lab in labs),
        "n": len(labs),
    }
    return [
        dict(where, criterion=r["predictor"], verdict=r.get("verdict") or None)
        | {"diff": r.get("diff"), "diff_low": r.get("low"), "diff_high": r.get("high")}
        for r in pooled.get("predictors", [])
    ]


def _longest_budget(table: pd.DataFrame) -> pd.DataFrame:
    """Keep the rows of the longest step budget, where the subsets end."""
    if "budget" not in table or table["budget"].isna().all():
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
            "verdict": verdict if isinstance(verdict, str) and verdict else None,
        }
        for r, verdict in zip(ok.itertuples(), verdicts)
    ]


def choose_criterion(evidence: pd.DataFrame, model: str | None = None, dataset: str | None = None) -> tuple[str, str]:
    """Choose the criterion a pooled lab verdict backs, else the parameter count, and say why."""
    pooled = evidence[evidence["source"] == "pooled"]
    if pooled.empty:
        labs = evidence.loc[evidence["source"] == "lab", "search"].nunique()
        seen = f"; {labs} criteria lab(s) recorded, each on one task" if labs else ""
        return BASELINE, (
            "no pooled criteria-lab verdict backs another criterion yet (vitplast lab pooled), so the ranking is by the "
            f"parameter count, the baseline every criterion must beat{seen}"
        )
    name = pooled.groupby("search")["n"].max().sort_values(kind="stable").index[-1]  # it pooled the most labs
    rows = pooled[pooled["search"] == name]
    first = rows.iloc[0]
    here = model in str(first["model"]).split(", ") and dataset in str(first["dataset"]).split(", ")
    source = f"the pooled verdict {name} over {int(first['n'])} labs ({first['labs']}); " + (
        "this model and dataset are among them" if here else "this model or dataset is not among them"
    )
    better = rows[rows["verdict"] == "better"].sort_values("diff", ascending=False)
    if len(better):
        b = better.iloc[0]
        return b["criterion"], (
            f"it ranks the subsets better than log(#trainable params) in {source}: mean Spearman difference "
            f"{b['diff']:+.2f} [{b['diff_low']:+.2f}, {b['diff_high']:+.2f}] (at the family's corrected level)"
        )
    return BASELINE, f"no criterion was shown to rank the subsets better than the parameter count in {source}"


def rank(scores: pd.DataFrame, criterion: str, budget: int | None = None) -> pd.DataFrame:
    """Rank the subsets within ``budget`` by ``criterion``, higher first, and break ties by fewer parameters."""
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
    """Measure the predictors of the model on the dataset and rank every subset.

    Args:
        settings: The finetuning settings. They name the model and dataset and say how subsets train.
        storage: The storage folder whose records give the evidence.
        budget: The most trainable parameters a ranked subset may have, or None for no limit.
        reference: The reference dataset for the plasticity.
        plasticity_pairs: How many image pairs the plasticity uses, or None for the default.
        num_batches: How many batches the gradient criteria average over.

    Returns:
        The ranked subsets with the criterion and the evidence.
    """
    started, s = time.perf_counter(), settings
    measured = report.search_report(s, reference=reference, max_pairs=plasticity_pairs)
    gradients = report.gradient_report(s, num_batches=num_batches)
    in_network = report.in_network_scores(s, all_subsets(), reference=reference, plasticity_pairs=plasticity_pairs)
    scores = subset_scores(report.Predictors(measured, gradients), s, in_network)
    evidence = read_evidence(storage)
    criterion, _ = choose_criterion(evidence, s.model, s.dataset)
    ranked = rank(scores, criterion, budget)
    return Recommendation(s.model, s.dataset, ranked, criterion, evidence, budget, time.perf_counter() - started, s)


def describe(rec: Recommendation, top: int = 10) -> str:
    """Describe the ranked subsets, the criterion and the evidence as text.

    Args:
        rec: The recommendation.
        top: How many ranked subsets to show.

    Returns:
        The text.
    """
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
        "Evidence recorded so far (pooled: each criterion's mean Spearman difference to the parameter count over the "
        "labs, Holm-adjusted; lab: Spearman with test accuracy per subset at its best lr, on one task; trials: with "
        "final validation accuracy per trial):",
    ]
    if rec.evidence.empty:
        lines.append("  no evidence yet: run the criteria lab on several tasks and pool it (vitplast lab)")
    for r in rec.evidence.sort_values(["source", "criterion", "search"], kind="stable").itertuples():
        lines.append("  " + _evidence_line(r))
    return "\n".join(lines)


def as_plain(rec: Recommendation, top: int = 10) -> dict[str, Any]:
    """Return the numbers of ``describe`` as ``recommend --json`` prints them."""
    _, why = choose_criterion(rec.evidence, rec.model, rec.dataset)
    return {
        "model": rec.model,
        "dataset": rec.dataset,
        "budget": rec.budget,
        "seconds": rec.seconds,
        "criterion": rec.criterion,
        "why": why,
        "ranked": rec.ranked.head(top),
        "evidence": rec.evidence,
    }


def _evidence_line(r) -> str:
    if r.source == "pooled":
        return (
            f"{r.criterion:<22} diff {r.diff:+.2f} [{r.diff_low:+.2f}, {r.diff_high:+.2f}] {r.verdict or '':<20} "
            f"pooled {r.search} over {r.n} labs ({r.labs})"
        )
    verdict = f" {r.verdict}" if isinstance(r.verdict, str) else ""
    return (
        f"{r.criterion:<22} {r.spearman:+.2f} [{r.spearman_low:+.2f}, {r.spearman_high:+.2f}] n={r.n:<3} "
        f"{r.source} {r.search} ({r.model} / {r.dataset}){verdict}"
    )


def warm_start_subsets(
    predictors: report.Predictors, settings: FinetuneConfig, storage: str | Path, budget: int | None = None
) -> list[str]:
    """Rank the subsets within ``budget`` for TPE to try first when a space sets ``warm_start``."""
    scores = subset_scores(predictors, settings)
    ranked = rank(scores, choose_criterion(read_evidence(Path(storage)))[0], budget)
    return list(ranked["components"])
