#!/usr/bin/env python
"""Analyse finished searches again: correlations, the paper-protocol table, the criteria lab, several datasets together.

One --name: the search's plasticity-vs-accuracy analysis (logged to its MLflow parent run), plus the paper-protocol
table when its trials have seeds, plus the criteria lab with --criteria. Several --name (one search per dataset):
the cross-dataset table (mean relative gain per component, rank agreement with plasticity per dataset and pooled).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitplast_tune.cli import run_main


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--name", action="append", required=True, help="a search's name; repeat for several datasets")
    p.add_argument("--storage", help="where the searches' results lie; default ~/vitplast_tune_results")
    p.add_argument("--tracking-uri", help="MLflow tracking URI; default: the one the search used")
    p.add_argument("--criteria", action="store_true", help="criteria lab: compare pre-training predictors per subset")
    p.add_argument("--criteria-batches", type=int, default=4, help="training batches for the gradient criteria")
    p.add_argument("--out", help="where the cross-dataset files go; default <storage>/cross-<names>")
    args = p.parse_args()
    import pandas as pd

    from vitplast_tune import analysis, plan, results, search

    storage = Path(args.storage or plan.default_storage()).expanduser()
    if len(args.name) == 1:
        result = search.reanalyse(args.name[0], args.storage, args.tracking_uri)
        print(results.summary(result))
    tables, plasticity = {}, {}
    for name in args.name:
        trials = _trials(storage, name)
        out = storage / name / "analysis"
        if "seed" in trials:
            paper = analysis.paper_results(trials, out)
            tables[name], plasticity[name] = paper.table, analysis.component_plasticity(trials)
            print(f"\n[{name}] " + analysis.describe_paper(paper) + f"\n  files: {out}")
        if args.criteria:
            _criteria(storage, name, trials, out, args.criteria_batches)
    if len(args.name) > 1:
        gains, agreement = analysis.cross_dataset(tables, plasticity)
        out = Path(args.out or storage / f"cross-{'-'.join(args.name)}").expanduser()
        out.mkdir(parents=True, exist_ok=True)
        gains.to_csv(out / "cross_dataset_gains.csv", index=False)
        agreement.to_csv(out / "cross_dataset_agreement.csv", index=False)
        with pd.option_context("display.width", 160):
            print("\nRelative gain over the linear probe per configuration and dataset (test accuracy, best lr):")
            print(gains.to_string(index=False, float_format=lambda v: f"{100 * v:+.2f}%"))
            print("\nRank agreement of the gain with plasticity:")
            shown = agreement[["dataset", "n", "by_value", "by_plasticity", "spearman", "kendall"]]
            print(shown.to_string(index=False))
        print(f"files: {out}")
    return 0


def _trials(storage: Path, name: str):
    import pandas as pd

    from vitplast_tune.errors import UserError

    path = storage / name / "trials.csv"
    if not path.is_file():
        raise UserError(f'no finished search "{name}" in {storage}; check --name and --storage')
    return pd.read_csv(path, dtype={"trial_id": str})


def _criteria(storage: Path, name: str, trials, out: Path, num_batches: int) -> None:
    from vitplast_tune import analysis, criteria, plan

    settings = plan.read_record(storage / name)["settings"]
    subsets = analysis.subset_table(trials)
    predictors = criteria.lab_predictors(settings, subsets["components"], num_batches=num_batches)
    subsets = analysis.subset_table(trials, predictors)
    comparison = analysis.criteria_comparison(subsets)
    subsets.to_csv(out / "criteria_subsets.csv", index=False)
    comparison.to_csv(out / "criteria.csv", index=False)
    print(f"\n[{name}] {analysis.describe_criteria(comparison)}\n  files: {out}")


if __name__ == "__main__":
    run_main(main)
