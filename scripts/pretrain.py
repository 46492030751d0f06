#!/usr/bin/env python
"""``vitplast pretrain`` as a script (same as the ``vitplast-pretrain`` command)."""

from vitplast_tune.cli.pretrain import entry

if __name__ == "__main__":
    entry()
