#!/usr/bin/env python
"""``vitplast search`` as a script (same as the ``vitplast-search`` command)."""

from vitplast_tune.cli.search import entry

if __name__ == "__main__":
    entry()
