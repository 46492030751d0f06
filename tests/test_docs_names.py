"""Docs that cannot drift: every name of the package the README and docs/ cite resolves, by import and getattr.

A name is cited four ways: imported in a code example (``from vitplast_tune.vit.plasticity import ...``), in full (``vitplast_tune.records.table.read_trials``), through the README's alias
(``vt.run_search``), and in backticks relative to the package (```records.table.read_trials```, whose first part is
one of the package's modules or subpackages). A file name that looks like one (```config.yaml```) is not a name: its
last part is a file suffix, nor is a lab search's name (```lab.s0.fractals_novel```).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import vitplast_tune

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
FULL = re.compile(rf"\bvitplast_tune((?:\.{IDENT})+)")
ALIAS = re.compile(rf"`vt((?:\.{IDENT})+)")
RELATIVE = re.compile(rf"`({IDENT}(?:\.{IDENT})+)(?=[`(\[])")  # the whole code span, or a call or index of it
IMPORTED = re.compile(rf"^\s*from vitplast_tune((?:\.{IDENT})*) import ([\w, ]+)$", re.M)
FILE_SUFFIXES = {"yaml", "yml", "json", "csv", "md", "py", "png", "txt", "db", "safetensors", "pt", "log", "toml"}
LAB_SEARCH = re.compile(r"^lab\.s\d+\.")  # the name of one of the lab's searches (lab.s0.fractals_novel)
TOP = {m.name for m in pkgutil.iter_modules(vitplast_tune.__path__)} - {"__main__"}


def cited() -> dict[str, set[str]]:
    """{dotted name under vitplast_tune: the pages citing it}."""
    names: dict[str, set[str]] = {}
    for page in PAGES:
        text, where = page.read_text(), str(page.relative_to(ROOT))
        found = {m.group(1).strip(".") for m in FULL.finditer(text)}
        found |= {m.group(1).strip(".") for m in ALIAS.finditer(text)}
        for match in IMPORTED.finditer(text):  # the code examples' imports: each imported name
            found |= {
                f"{match.group(1)}.{name.strip()}".strip(".") for name in match.group(2).split(",") if name.strip()
            }
        for match in RELATIVE.finditer(text):
            parts = match.group(1).split(".")
            if parts[0] in TOP and parts[-1] not in FILE_SUFFIXES and not LAB_SEARCH.match(match.group(1)):
                found.add(match.group(1))
        for name in found:
            names.setdefault(name, set()).add(where)
    return names


def resolves(dotted: str) -> bool:
    """Whether ``vitplast_tune.<dotted>`` is a module or an attribute reached from one."""
    parts = dotted.split(".")
    for cut in range(len(parts), -1, -1):
        try:
            obj = importlib.import_module(".".join(["vitplast_tune", *parts[:cut]]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


CITED = cited()


def test_the_docs_cite_names_of_the_package():
    assert len(CITED) >= 30  # the patterns still find the docs' names
    assert {"records.table.read_trials", "run_search", "plan.options.SearchOptions"} <= set(CITED)


@pytest.mark.parametrize("name", sorted(CITED))
def test_a_name_the_docs_cite_resolves(name):
    assert resolves(name), f"vitplast_tune.{name}, cited in {', '.join(sorted(CITED[name]))}, does not resolve"
