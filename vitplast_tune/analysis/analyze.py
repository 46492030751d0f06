"""Run every analysis that a search's trials support, in the order a person reads them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from vitplast_tune.analysis import subsets as lab
from vitplast_tune.analysis import subsets_report
from vitplast_tune.analysis.depth import DepthAnalysis, analyze_depth, describe_depth, varies_depth
from vitplast_tune.analysis.importance import Importance, describe_importance, parameter_importance
from vitplast_tune.analysis.plots import _plot_importance
from vitplast_tune.analysis.prediction import TrialAnalysis, analyze_trials, describe_correlations
from vitplast_tune.analysis.protocol import PaperResults, describe_paper, paper_results
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import SpaceError
from vitplast_tune.predictors.report import in_network_depth_scores, in_network_scores, search_report
from vitplast_tune.predictors.scores import layer_table, num_blocks

if TYPE_CHECKING:
    from vitplast_tune.space.files import SearchSpec


@dataclass
class SearchAnalysis:
    """Hold every analysis that a search's trials support, and the files written.

    Attributes:
        trials: Plasticity against accuracy per trial, when plasticity was measured.
        paper: The paper's protocol, for a grid with seeds.
        criteria: The criteria lab's comparison at every budget.
        lab: The criteria lab, one result per budget.
        importance: Which searched parameters matter.
        depth: Where to finetune, for trials at several depths.
        files: The files written.
        budget: The step budget of these trials, when the search has several.
        budgets: One analysis per budget, when the search has several.
    """

    trials: TrialAnalysis | None = None
    paper: PaperResults | None = None
    criteria: pd.DataFrame | None = None
    lab: list[lab.LabResult] = field(default_factory=list)
    importance: Importance | None = None
    depth: DepthAnalysis | None = None
    files: list[Path] = field(default_factory=list)
    budget: int | None = None
    budgets: list[SearchAnalysis] = field(default_factory=list)

    def describe(self) -> str:
        """Describe the analyses as text, budget by budget.

        Returns:
            The text, empty when there is nothing to say.
        """
        if self.budgets:
            parts = [f"=== Budget {part.budget} steps ===\n{part.describe()}" for part in self.budgets]
            if self.lab:
                parts.append(
                    "=== The criteria lab, every budget in one family of verdicts ===\n"
                    + subsets_report.describe_lab(self.lab)
                )
            return "\n\n".join(parts)
        parts = [describe_importance(self.importance)] if self.importance is not None else []
        if self.trials is not None:
            parts.append(
                "Does the plasticity of the trained subset predict accuracy? Spearman with a bootstrap 95% "
                "interval, beside the naive baseline log(trainable parameters):\n"
                + describe_correlations(self.trials.correlations)
            )
        if self.paper is not None:
            parts.append(describe_paper(self.paper))
        if self.lab:
            parts.append(subsets_report.describe_lab(self.lab))
        if self.depth is not None:
            parts.append(describe_depth(self.depth))
        return "\n\n".join(parts)


def analyze_search(
    trials: pd.DataFrame,
    spec: SearchSpec,
    settings: FinetuneConfig,
    out_dir: str | Path,
    *,
    reference: str = "fractals",
    plasticity_pairs: int | None = None,
    parameters: tuple[pd.DataFrame, dict] | None = None,
    variant: str = "paper",
    measuring: dict | None = None,
) -> SearchAnalysis:
    """Run every analysis that a search's trials support and write the files into ``out_dir``.

    Args:
        trials: The trial table. Each step budget is analyzed apart, into ``out_dir/steps-N``.
        spec: The search's space.
        settings: The settings every trial shares.
        out_dir: Where the files go.
        reference: The reference dataset for the plasticity.
        plasticity_pairs: The most image pairs for plasticity, or None for all.
        parameters: Each trial's searched parameters and their Optuna distributions.
        variant: The plasticity variant of the depth analysis.
        measuring: Where the measurements run, as ``predictors.report`` takes it, or None for here.

    Returns:
        The analysis. The criteria lab judges the verdicts of every budget in one family.
    """
    out = Path(out_dir).expanduser()
    steps = sorted(pd.to_numeric(trials["max_steps"], errors="coerce").dropna().unique()) if len(trials) else []
    options = dict(reference=reference, plasticity_pairs=plasticity_pairs, parameters=parameters, variant=variant)
    options["measuring"] = measuring or {}
    if len(steps) < 2:
        found = _analyze_one(trials, spec, settings, out, **options)
        parts = {None: trials}
    else:
        found, parts = SearchAnalysis(), {}
        for budget in steps:
            parts[int(budget)] = trials[trials["max_steps"] == budget]
            part = _analyze_one(parts[int(budget)], spec, settings, out / f"steps-{int(budget)}", **options)
            part.budget = int(budget)
            found.budgets.append(part)
            found.files += part.files
    if spec.criteria and len(trials):
        grid_lrs = _grid_rates(spec)
        extra = in_network_scores(
            settings,
            trials["components"].unique(),
            reference=reference,
            plasticity_pairs=plasticity_pairs,
            **(measuring or {}),
        )
        found.lab = lab.criteria_lab(parts, extra, grid_lrs=grid_lrs)
        found.criteria = pd.concat([r.comparison for r in found.lab], ignore_index=True)
        found.files += lab.write_lab(found.lab, out)
    return found


def _grid_rates(spec) -> list[float] | None:
    """Return the learning rates that a space lists, or None for a range."""
    lr = spec.parameters.get("lr")
    try:
        return list(lr.grid_values()) if lr is not None else None
    except SpaceError:  # a range has no list of values
        return None


def _analyze_one(
    trials: pd.DataFrame,
    spec,
    settings: FinetuneConfig,
    out: Path,
    *,
    reference: str,
    plasticity_pairs: int | None,
    parameters: tuple[pd.DataFrame, dict] | None,
    variant: str,
    measuring: dict,
) -> SearchAnalysis:
    """Analyze the trials of one step budget."""
    found = SearchAnalysis()
    if parameters is not None and parameters[1]:
        found.importance = _importance_of(trials, parameters[0].loc[trials.index], parameters[1])
        found.files += _write_importance(found.importance, out)
    if "plasticity_mean" in trials:
        found.trials = analyze_trials(trials, out)
        found.files += found.trials.files
    whole = trials[trials["depth"].fillna("all") == "all"].drop(columns="depth") if "depth" in trials else trials
    if spec.algorithm == "grid" and spec.has_seeds and len(whole):  # the paper's protocol trains every block
        found.paper = paper_results(whole, out)
        found.files += found.paper.files
    if varies_depth(trials):
        found.depth = _depth(
            trials, settings, out, reference=reference, plasticity_pairs=plasticity_pairs, measuring=measuring
        )
        found.files += found.depth.files
    return found


def _depth(
    trials: pd.DataFrame, settings: FinetuneConfig, out: Path, *, reference: str, plasticity_pairs, measuring: dict
) -> DepthAnalysis:
    """Analyze depth, with in-network plasticity per layer when the trials carry plasticity scores."""
    if "plasticity_mean" not in trials:
        return analyze_depth(trials, out, num_blocks=0)
    measured = search_report(
        settings, reference=reference, variant="in_network", max_pairs=plasticity_pairs, **measuring
    )
    configs = list(dict.fromkeys(zip(trials["components"], trials["depth"].fillna("all").astype(str))))
    scores = in_network_depth_scores(measured, settings, configs)
    blocks = num_blocks(measured.table)
    return analyze_depth(trials, out, num_blocks=blocks, layers=layer_table(measured.table), predictors=scores)


def _importance_of(trials: pd.DataFrame, params: pd.DataFrame, distributions: dict) -> Importance:
    """Rate the searched parameters by the accuracy at the last step every trial reached, else the final one."""
    if "val_acc_common" in trials and trials["val_acc_common"].notna().any():
        step = trials["common_step"].dropna()
        at = f"step {int(step.iloc[0])}, " if len(step) else ""
        label = f"validation accuracy at {at}the last step every trial reached"
        return parameter_importance(params, distributions, trials["val_acc_common"], label=label)
    return parameter_importance(params, distributions, trials["val_acc"], label="final validation accuracy")


def _write_importance(found: Importance, out: Path) -> list[Path]:
    """Write the importance table and its bar chart into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    fitted = found.n if found.fitted is None else found.fitted
    found.table.assign(target=found.target, n=found.n, fitted=fitted).to_csv(out / "importance.csv", index=False)
    if found.table.empty:
        return [out / "importance.csv"]
    title = f"fANOVA importance of {found.target} ({found.trials})"
    return [out / "importance.csv", _plot_importance(found.table, title, out / "importance.png")]
