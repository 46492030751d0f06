"""The options of a search are defined once (``SearchOptions``' fields): the ``vitplast search`` flags, their help,
the keywords of ``run_search`` and the resume command all come from them; a space may be a mapping."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

import vitplast_tune as vt
from vitplast_tune.cli import search as cli
from vitplast_tune.plan.options import SearchOptions, resumed_with


def test_every_option_is_a_flag_and_every_flag_an_option():
    parser = cli.parser()
    by_dest = {}
    for action in parser._actions:  # the option's own flag first; --verbose, a second flag of verbose, after it
        if action.dest not in ("help", "dry_run"):
            by_dest.setdefault(action.dest, action)
    assert set(by_dest) == {f.name for f in dataclasses.fields(SearchOptions)}
    for f in dataclasses.fields(SearchOptions):
        assert by_dest[f.name].help.startswith(f.metadata["help"])  # the field's help, its default said after it
    assert by_dest["settings"].option_strings == ["--set"] and by_dest["verbose"].option_strings == ["--quiet"]
    assert [a.option_strings for a in parser._actions if a.dest == "verbose"] == [["--quiet"], ["--verbose"]]
    assert cli.options_of(parser.parse_args(["--verbose"])).verbose == 2
    assert by_dest["max_trainable_params"].option_strings == ["--max-trainable-params"]  # no flag before


def test_flags_not_given_keep_the_options_defaults_and_given_ones_reach_the_same_fields():
    assert cli.options_of(cli.parser().parse_args([])) == SearchOptions()
    args = ["--max-steps", "8", "--dataset", "digits", "--set", "lr=0.1", "--quiet", "--no-plasticity"]
    options = cli.options_of(cli.parser().parse_args(args + ["--budgets", "4", "8"]))
    keywords = SearchOptions.of(max_steps=8, dataset="digits", settings={"lr": 0.1}, verbose=0, plasticity=False)
    assert options == dataclasses.replace(keywords, budgets=(4, 8))
    assert options.settings == {"max_steps": 8, "dataset": "digits", "lr": 0.1}


def test_a_python_mistake_names_the_keyword_not_the_flag():
    with pytest.raises(vt.OptionsError, match=r'unknown option "max_step" \(did you mean "max_steps"\?\)'):
        SearchOptions.of(max_step=8)
    with pytest.raises(vt.OptionsError, match=r"settings\['max_steps'\]=9 contradicts max_steps=8"):
        SearchOptions(max_steps=8, settings={"max_steps": 9})
    with pytest.raises(vt.OptionsError, match="a space is a shipped name, a path"):
        SearchOptions(space=42)


def test_a_space_mapping_becomes_one_file_named_by_its_content():
    space = {"parameters": {"components": "mha", "lr": 0.1}, "defaults": {"max_steps": 4}}
    first, again = SearchOptions(space=space), SearchOptions(space=dict(space))
    assert first.space == again.space and yaml.safe_load(Path(first.space).read_text()) == space
    assert vt.load_space(first.space).parameters["lr"].value == 0.1
    spec = vt.load_space("component_subsets")
    assert SearchOptions(space=spec).space == str(spec.path)


def test_the_resume_command_repeats_the_options_the_record_lacks():
    names = resumed_with(SearchOptions())
    assert {"address", "cpus_per_trial", "plasticity", "resources_per_trial"} <= set(names)
    assert "max_steps" not in names and "seed" not in names  # the record holds those
    words = SearchOptions(cpus_per_trial=2, connect_timeout_s=5.0).words(names)
    assert words == ["--connect-timeout", "5", "--cpus-per-trial", "2"]
