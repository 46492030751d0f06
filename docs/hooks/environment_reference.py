"""MkDocs hook: the environment variables' reference, generated from the package's registry
(``vitplast_tune.environment``), through which the package reads every one of them.

A page holding the marker ``<!-- vitplast-environment -->`` gets, in its place, one table of the variables the package
reads and one of those the SLURM script reads.
"""

from __future__ import annotations

MARKER = "<!-- vitplast-environment -->"
KINDS = {
    "setting": "yours to set",
    "honoured": "another project's, followed",
    "internal": "set by a search while it runs (a value you set is kept)",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(variables, with_kind: bool = True) -> list[str]:
    """Markdown rows: each variable's name, what it does, what happens unset (and its kind), who reads it."""
    head = ["Variable", "What it does", "When unset"] + (["Kind"] if with_kind else []) + ["Read by"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for v in variables.values():
        cells = [f"`{v.name}`", _cell(v.what), _cell(v.unset)] + ([KINDS[v.kind]] if with_kind else [])
        rows.append("| " + " | ".join(cells + [f"`{v.read_by}`"]) + " |")
    return rows


def reference() -> str:
    """Markdown: the package's variables, then the SLURM script's."""
    from vitplast_tune.environment import SCRIPT_VARIABLES, VARIABLES

    parts = table(VARIABLES)
    parts += [
        "",
        "## The SLURM script's",
        "",
        "Read by `scripts/cluster/slurm.sbatch` (see [On a cluster](../cluster.md)), not by the package:",
        "",
    ]
    parts += table(SCRIPT_VARIABLES, with_kind=False)
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Put the generated reference where a page asks for it."""
    return markdown.replace(MARKER, reference()) if MARKER in markdown else markdown
