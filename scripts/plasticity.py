#!/usr/bin/env python
"""``vitplast plasticity`` as a script (same as the ``vitplast-plasticity`` command)."""

from vitplast_tune.cli.plasticity import entry

if __name__ == "__main__":
    entry()
