#!/usr/bin/env python
"""``vitplast lab`` as a script (same as the ``vitplast-lab`` command)."""

from vitplast_tune.cli.lab import entry

if __name__ == "__main__":
    entry()
