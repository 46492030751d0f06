"""Name the versions whose internals this package reads, and note a newer one installed before a search starts."""

from __future__ import annotations

from importlib import metadata

READ_FROM = {"ray": "2.60", "mlflow": "3.17", "timm": "1.0"}  # major.minor each internal was read from and tested


def _major_minor(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def untested(installed: dict[str, str] | None = None) -> list[str]:
    """Note each project whose installed version is newer than the one its internals were read from.

    ``installed`` None reads the versions from the packages' metadata.
    """
    notes = []
    for project, read in READ_FROM.items():
        version = installed[project] if installed is not None else metadata.version(project)
        if _major_minor(version) > _major_minor(read):
            notes.append(
                f"{project} {version} is newer than {read}, whose internals this version of vitplast_tune reads "
                f"(_compat.versions): untested with it; pytest tests/test_compat.py checks each of them"
            )
    return notes
