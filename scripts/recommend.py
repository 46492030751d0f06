#!/usr/bin/env python
"""``vitplast recommend`` as a script (same as the ``vitplast-recommend`` command)."""

from vitplast_tune.cli.recommend import entry

if __name__ == "__main__":
    entry()
