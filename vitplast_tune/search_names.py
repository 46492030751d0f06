"""Check a search's name, make its default, and key its saved MLflow view."""

from __future__ import annotations

import contextlib
import os
import re
from datetime import datetime

from vitplast_tune._compat.mlflow import MAX_KEY, VIEW_TAG_PREFIX
from vitplast_tune.errors import UserError

VIEW_KEY_PREFIX = "vitplast-"
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,+=@-]*")
# The saved view's experiment tag (VIEW_TAG_PREFIX + view_key(name)) is the longest MLflow key that holds the name.
MAX_NAME = MAX_KEY - len(VIEW_TAG_PREFIX + VIEW_KEY_PREFIX)


def view_key(search: str) -> str:
    """Make the key of a search's saved MLflow view: its name, prefixed, characters a URL or tag refuses as "-"."""
    return VIEW_KEY_PREFIX + "".join(c if c.isalnum() or c in "-_" else "-" for c in search)


def default_name(space: str) -> str:
    """Make a search's default name from its space's: ``<space>-<date>-<time>``, characters refused as "-"."""
    stem = re.sub(r"[^A-Za-z0-9_.,+=@-]", "-", space).lstrip(".,+=@-")[:64] or "search"
    return f"{stem}-{datetime.now():%Y%m%d-%H%M%S}"


def check_name(name: str, storage: str) -> str:
    """Check that a name can name a search's folder (on the storage root's file system) and its MLflow records."""
    if not NAME_PATTERN.fullmatch(name):
        raise UserError(
            f'--name "{name}" must be a plain name: letters, digits and . _ , + = @ - (not first: . , + = @ -)'
        )
    limit = MAX_NAME
    if "://" not in storage:
        with contextlib.suppress(OSError, ValueError):  # a storage folder that cannot tell
            limit = min(limit, os.pathconf(storage, "PC_NAME_MAX"))
    if len(name) > limit:
        raise UserError(
            f"--name is {len(name)} characters long; at most {limit} fit (MLflow keys take {MAX_KEY} characters, "
            f"{len(VIEW_TAG_PREFIX + VIEW_KEY_PREFIX)} of them for the search's saved view, and a folder name 255 bytes)"
        )
    return name
