"""``python -m vitplast_tune COMMAND [flags]``: the installed commands (``vitplast-search`` ...) without their scripts."""

from vitplast_tune.cli import main

if __name__ == "__main__":
    main()
