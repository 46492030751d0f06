#!/usr/bin/env python
"""``vitplast ui`` as a script (same as the ``vitplast-ui`` command)."""

from vitplast_tune.cli.ui import entry

if __name__ == "__main__":
    entry()
