#!/usr/bin/env python
"""Open a search's runs in the MLflow UI (same as vitplast-ui)."""

from vitplast_tune.cli import ui

if __name__ == "__main__":
    ui()
