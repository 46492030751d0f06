"""``python -m vitplast_tune COMMAND [flags]``: the ``vitplast`` command without its script."""

from vitplast_tune.cli import main

if __name__ == "__main__":
    main()
