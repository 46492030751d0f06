"""The command-line reference is generated from the commands' parsers (docs/hooks/cli_reference.py, run by
``mkdocs build``): every argument of every command has help text, and a flag added without it fails the build."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from vitplast_tune import cli

HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "cli_reference.py"


def hook():
    spec = importlib.util.spec_from_file_location("cli_reference", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_argument_of_every_command_has_help():
    reference = hook()
    for name, module in cli._MODULES.items():
        assert reference.undocumented(module.parser()) == [], name


def test_the_reference_holds_each_commands_flags_and_refuses_an_undocumented_one(monkeypatch):
    reference = hook()
    text = reference.reference()
    assert "## vitplast search" in text and "--plasticity-reference" in text and "## vitplast ui" in text
    page = reference.on_page_markdown(f"# CLI\n\n{reference.MARKER}\n", None, None, None)
    assert page.startswith("# CLI") and "## vitplast recommend" in page and reference.MARKER not in page

    plain = cli.ui.parser

    def planted():
        parser = plain()
        parser.add_argument("--undocumented")  # a flag added without its help
        return parser

    monkeypatch.setattr(cli.ui, "parser", planted)
    with pytest.raises(ValueError, match="vitplast ui: arguments without help text: --undocumented"):
        reference.reference()
