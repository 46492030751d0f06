#!/usr/bin/env python
"""``vitplast analyze`` as a script (same as the ``vitplast-analyze`` command)."""

from vitplast_tune.cli.analyze import entry

if __name__ == "__main__":
    entry()
