#!/usr/bin/env python
"""The criteria lab on offline tasks (same as vitplast-lab)."""

from vitplast_tune.cli import lab

if __name__ == "__main__":
    lab()
