#!/usr/bin/env python
"""Analyse a finished search again: plasticity vs accuracy correlations and plots, logged to its MLflow parent run."""

from __future__ import annotations

import argparse

from vitplast_tune.cli import run_main


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--name", required=True, help="the search's name (as given to scripts/search.py --name)")
    p.add_argument("--storage", help="where the search's results lie; default ~/vitplast_tune_results")
    p.add_argument("--tracking-uri", help="MLflow tracking URI; default: the one the search used")
    args = p.parse_args()
    from vitplast_tune import results, search

    result = search.reanalyse(args.name, args.storage, args.tracking_uri)
    print(results.summary(result))
    return 0


if __name__ == "__main__":
    run_main(main)
