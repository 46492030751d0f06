#!/usr/bin/env python
"""Analyze a finished search again (same as vitplast-analyze)."""

from vitplast_tune.cli import analyze

if __name__ == "__main__":
    analyze()
