"""What the scripts share: turning a UserError into one line on stderr and exit code 2."""

from __future__ import annotations

import sys
from typing import Callable

from vitplast_tune.errors import SearchInterrupted, UserError


def run_main(main: Callable[[], int | None]) -> None:
    """Call ``main()`` and exit with its code; a UserError prints ``error: <message>`` and exits 2."""
    try:
        code = main()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except SearchInterrupted as exc:
        print(f"interrupted: {exc}", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
