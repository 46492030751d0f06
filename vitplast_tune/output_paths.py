"""Check where a command will write before it works, each problem a UserError naming the flag."""

from __future__ import annotations

import os
from pathlib import Path

from vitplast_tune.errors import UserError


def output_file(path: str | Path, flag: str, *, suffix: str | None = None, overwrite: bool = False) -> Path:
    """Check that the file ``path`` can be written: not a folder, under a writable folder, with ``suffix``, and new.

    ``flag`` names how the user gave it, for the message; ``overwrite`` lets an existing file be written over. Returns
    the path, ``~`` expanded.
    """
    out = Path(path).expanduser()
    if out.is_dir():
        raise UserError(f"{flag} {out} is a folder; name a file in it, e.g. {out / ('model' + (suffix or ''))}")
    if suffix is not None and out.suffix != suffix:
        raise UserError(f"{flag} {out} must end in {suffix}")
    _check_parent(out.parent, flag, out)
    if out.exists() and not overwrite:
        raise UserError(f"{flag} {out} exists; pass --overwrite to write over it, or name another file")
    return out


def output_dir(path: str | Path, flag: str) -> Path:
    """Check that files can be written into the folder ``path``, made if missing; return it, ``~`` expanded."""
    out = _not_a_file(path, flag, "name a folder (it is made if missing)")
    _check_parent(out, flag, out)
    return out


def existing_dir(path: str | Path, flag: str) -> Path:
    """Check that the folder ``path`` is not a file (a missing one is allowed); return it, ``~`` expanded."""
    return _not_a_file(path, flag, "name the folder that holds the searches")


def _not_a_file(path: str | Path, flag: str, hint: str) -> Path:
    """Expand ``~`` in ``path``, and refuse a file with a message naming ``flag``."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"{flag} {out} is a file; {hint}")
    return out


def _check_parent(folder: Path, flag: str, out: Path) -> None:
    """Check that the nearest existing folder at or above ``folder`` is a writable folder."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {out} lies under {existing}, which is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {out}: the folder {existing} is not writable")
