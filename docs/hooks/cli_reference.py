"""MkDocs hook: the command-line reference, generated from the commands' own parsers.

A page holding the marker ``<!-- vitplast-cli -->`` gets, in its place, every ``vitplast`` subcommand's ``--help`` as
the command prints it; the build fails when an argument has no help text, so a flag cannot be added undocumented.
"""

from __future__ import annotations

import argparse

MARKER = "<!-- vitplast-cli -->"


def undocumented(parser: argparse.ArgumentParser) -> list[str]:
    """The arguments of ``parser`` with no help text (the automatic ``--help`` aside)."""
    return [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()
    ]


def reference() -> str:
    """Markdown: one section per subcommand, its one sentence and its ``--help``."""
    from vitplast_tune import cli

    parts = ["`vitplast --help`:", "", "```text", cli.parser().format_help().rstrip(), "```"]
    for name, module in cli._MODULES.items():
        parser = module.parser()
        missing = undocumented(parser)
        if missing:
            raise ValueError(f"vitplast {name}: arguments without help text: {', '.join(missing)}")
        parts += ["", f"## vitplast {name}", "", module.HELP, "", "```text", parser.format_help().rstrip(), "```"]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Put the generated reference where a page asks for it."""
    return markdown.replace(MARKER, reference()) if MARKER in markdown else markdown
