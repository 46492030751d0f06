"""The user's mistakes: a kind of UserError for each, the hint that names a real setting, and options named as the
user gave them (a keyword from Python, a flag from the command line)."""

from __future__ import annotations

import pytest

import vitplast_tune as vt
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import did_you_mean, flags_spoken, option


def test_every_kind_of_mistake_is_a_user_error_and_exported():
    kinds = (vt.SpaceError, vt.OptionsError, vt.DataError, vt.ResumeError, vt.ServicesError, vt.SearchNotFound)
    assert all(issubclass(kind, vt.UserError) for kind in kinds)
    assert issubclass(vt.SearchNotFound, LookupError)


def test_a_misspelt_setting_is_pointed_at_the_real_one():
    assert did_you_mean("mixup_alpha", FinetuneConfig.__dataclass_fields__) == ' (did you mean "mixup"?)'
    assert did_you_mean("cutmix_alpha", FinetuneConfig.__dataclass_fields__) == ' (did you mean "cutmix"?)'
    assert did_you_mean("weight_decy", FinetuneConfig.__dataclass_fields__) == ' (did you mean "weight_decay"?)'
    assert did_you_mean("zzz", FinetuneConfig.__dataclass_fields__) == ""
    with pytest.raises(vt.UserError, match='unknown setting "mixup_alpha" \\(did you mean "mixup"\\?\\)'):
        FinetuneConfig.from_dict({"mixup_alpha": 0.8})


def test_an_option_is_a_keyword_from_python_and_a_flag_from_the_command_line():
    assert option("max_steps", 20) == "max_steps=20" and option("resume") == "resume"

    with flags_spoken():
        assert (option("max_steps", 20), option("resume")) == ("--max-steps 20", "--resume")
    assert option("max_steps", 20) == "max_steps=20"  # after the command, Python's wording again


def test_a_command_run_in_process_leaves_the_python_wording(capsys):
    from vitplast_tune.cli.base import run_main

    def command():
        assert option("max_steps", 20) == "--max-steps 20"
        raise vt.OptionsError(option("max_steps", 0) + " is not positive")

    with pytest.raises(SystemExit) as exit_:
        run_main(command)
    assert exit_.value.code == 2 and "error: --max-steps 0 is not positive" in capsys.readouterr().err
    assert option("max_steps", 20) == "max_steps=20"


def test_mistakes_from_python_are_of_their_kind_and_name_keywords(tmp_path, tiny_space):
    from vitplast_tune.plan.planner import prepare
    from vitplast_tune.storage import write_record

    space, storage = tiny_space(), tmp_path / "results"
    write_record(storage / "taken", {"name": "taken"})  # a recorded search of that name
    with pytest.raises(vt.ResumeError, match=r"pass resume=True to continue it, or another name$"):
        prepare(vt.SearchOptions(space=str(space), name="taken", storage=str(storage)))
    with pytest.raises(vt.SpaceError, match="not found"):
        prepare(vt.SearchOptions(space="no_such_space", storage=str(storage)))
