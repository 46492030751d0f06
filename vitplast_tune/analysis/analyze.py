"""Every analysis a search's trials support, in the order a person reads them: plasticity against accuracy per
trial (``trials``), the paper's protocol for a grid with seeds (``protocol``) and the criteria lab (``lab``).

pandas, scipy and matplotlib only: nothing here needs torch, Ray or MLflow (the lab's in-network plasticity is
read from its cached report, or measured in this process when missing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from vitplast_tune.analysis import lab
from vitplast_tune.analysis.depth import DepthAnalysis, analyze_depth, describe_depth, varies_depth
from vitplast_tune.analysis.protocol import PaperResults, describe_paper, paper_results
from vitplast_tune.analysis.trials import TrialAnalysis, analyze_trials, describe_correlations
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.predictors.report import in_network_scores, search_report
from vitplast_tune.predictors.scores import layer_table


@dataclass
class SearchAnalysis:
    """Every analysis a search's trials support, and the files written."""

    trials: TrialAnalysis | None = None  # plasticity vs accuracy per trial (when plasticity was measured)
    paper: PaperResults | None = None  # the paper's protocol (a grid with seeds)
    criteria: pd.DataFrame | None = None  # the criteria lab (a space with ``criteria: true``)
    depth: DepthAnalysis | None = None  # where to finetune (trials at several depths)
    files: list[Path] = field(default_factory=list)

    def describe(self) -> str:
        """The analyzes as plain text, in the order a person reads them."""
        parts = []
        if self.trials is not None:
            parts.append(
                "Does the plasticity of the trained subset predict accuracy? Spearman with a bootstrap 95% "
                "interval, beside the naive baseline log(trainable parameters):\n"
                + describe_correlations(self.trials.correlations)
            )
        if self.paper is not None:
            parts.append(describe_paper(self.paper))
        if self.criteria is not None:
            parts.append(lab.describe_criteria(self.criteria))
        if self.depth is not None:
            parts.append(describe_depth(self.depth))
        return "\n\n".join(parts)


def analyze_search(
    trials: pd.DataFrame,
    spec,
    settings: FinetuneConfig,
    out_dir: str | Path,
    *,
    reference: str = "fractals",
    plasticity_pairs: int | None = None,
    variant: str = "paper",
) -> SearchAnalysis:
    """The analyzes a search supports: per-trial correlations (when its trials carry plasticity scores), the
    paper's protocol (a grid with seeds), the criteria lab (``criteria: true``) and the depth analysis (trials at
    several depths, with the plasticity per layer of ``variant``); files go to ``out_dir``."""
    out = Path(out_dir).expanduser()
    found = SearchAnalysis()
    if "plasticity_mean" in trials:
        found.trials = analyze_trials(trials, out)
        found.files += found.trials.files
    whole = trials[trials["depth"].fillna("all") == "all"].drop(columns="depth") if "depth" in trials else trials
    if spec.algorithm == "grid" and spec.has_seeds and len(whole):  # the paper's protocol trains every block
        found.paper = paper_results(whole, out)
        found.files += found.paper.files
    if spec.criteria:
        subsets = lab.subset_table(trials)
        extra = in_network_scores(
            settings, subsets["components"], reference=reference, plasticity_pairs=plasticity_pairs
        )
        table = lab.subset_table(trials, extra)
        found.criteria = lab.criteria_comparison(table)
        found.files += [out / "criteria_subsets.csv", out / "criteria.csv"]
        table.to_csv(found.files[-2], index=False)
        found.criteria.to_csv(found.files[-1], index=False)
    if varies_depth(trials):
        layers = None
        if "plasticity_mean" in trials:
            measured = search_report(settings, reference=reference, variant=variant, max_pairs=plasticity_pairs)
            layers = layer_table(measured.table)
        found.depth = analyze_depth(trials, out, layers=layers)
        found.files += found.depth.files
    return found
