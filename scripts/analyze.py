#!/usr/bin/env python
"""Analyse finished searches again: correlations, the paper-protocol table, the criteria lab, several datasets together.

One --name: every analysis the search supports (logged to its MLflow parent run): plasticity vs accuracy, the
paper-protocol table when its trials have seeds, the criteria lab when its space says so (or with --criteria).
Several --name (one search per dataset): the cross-dataset table (mean relative gain per configuration, rank
agreement with plasticity per dataset and pooled).
"""

from __future__ import annotations

import argparse

from vitplast_tune.cli import run_main


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--name", action="append", required=True, help="a search's name; repeat for several datasets")
    p.add_argument("--storage", help="where the searches' results lie; default ~/vitplast_tune_results")
    p.add_argument("--tracking-uri", help="MLflow tracking URI; default: the one the search used")
    p.add_argument("--criteria", action="store_true", help="also the criteria lab: compare pre-training predictors per subset")
    p.add_argument("--out", help="where the cross-dataset files go; default <storage>/cross-<names>")
    args = p.parse_args()
    from vitplast_tune import results, search

    if len(args.name) == 1:
        print(results.summary(search.reanalyse(args.name[0], args.storage, args.tracking_uri, criteria=args.criteria)))
    else:
        print(search.compare_datasets(args.name, args.storage, args.out))
    return 0


if __name__ == "__main__":
    run_main(main)
