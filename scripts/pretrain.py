#!/usr/bin/env python
"""Pretrain the offline testbed ViT on generated fractals (same as vitplast-pretrain)."""

from vitplast_tune.cli import pretrain

if __name__ == "__main__":
    pretrain()
