#!/usr/bin/env python
"""Run a Ray Tune search over which ViT components to finetune (same as vitplast-search)."""

from vitplast_tune.cli import search

if __name__ == "__main__":
    search()
