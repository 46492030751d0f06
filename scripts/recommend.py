#!/usr/bin/env python
"""Which component subsets to finetune, in minutes and with no search (same as vitplast-recommend)."""

from vitplast_tune.cli import recommend

if __name__ == "__main__":
    recommend()
