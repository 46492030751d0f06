#!/usr/bin/env python
"""Measure the plasticity of every ViT component (same as vitplast-plasticity)."""

from vitplast_tune.cli import plasticity

if __name__ == "__main__":
    plasticity()
