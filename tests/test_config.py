"""Settings typed by their annotations: every field of FinetuneConfig and PretrainConfig refuses a value of the wrong
type with the field's name, whatever the field (a new one is typed by declaring it)."""

import dataclasses
from pathlib import Path

import pytest

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import UserError
from vitplast_tune.pretrain_config import PretrainConfig
from vitplast_tune.type_checks import check_types, describe_type, field_types, fits


@pytest.mark.parametrize("cls", [FinetuneConfig, PretrainConfig])
def test_every_field_refuses_a_value_of_another_type(cls):
    for f in dataclasses.fields(cls):
        with pytest.raises(UserError, match=rf"^{f.name} must be .*, got \{{'x': 1\}} \(a mapping\)"):
            check_types(cls(**{f.name: {"x": 1}}))
    check_types(cls())  # the defaults fit


@pytest.mark.parametrize(
    "value, hint, ok",
    [
        (3, int, True),
        (3.0, int, False),
        (True, int, False),
        (1, float, True),
        (True, float, False),
        (float("inf"), float, False),
        ("0.1", float, False),
        (None, float | None, True),
        ([0, 2], list[int] | None, True),
        ([0, "2"], list[int] | None, False),
        (Path("/data"), str | None, True),
        (1, bool, False),
    ],
)
def test_fits(value, hint, ok):
    assert fits(value, hint) is ok


def test_messages_name_the_type_in_words():
    hints = field_types(FinetuneConfig)
    assert describe_type(hints["blocks"]) == "a list of integers or null"
    assert describe_type(hints["warmup_fraction"]) == "a finite number or null"
    with pytest.raises(UserError, match=r"^seed must be an integer, got 'forty-two' \(a string\)$"):
        FinetuneConfig(seed="forty-two").validate()
    with pytest.raises(UserError, match=r"^lr must be a finite number, got True \(a boolean\)$"):
        FinetuneConfig(lr=True).validate()


def test_the_paper_scale_commands_name_the_papers_checkpoint():
    """Every ViT-B/16 that the docs, the space files and the help name is the paper's checkpoint (orig_in21k)."""
    import re

    from vitplast_tune import cli
    from vitplast_tune.config import PAPER_MODEL

    root = Path(__file__).resolve().parents[1]
    files = [
        root / "README.md",
        *sorted((root / "docs").rglob("*.md")),
        *sorted((root / "search_spaces").glob("*.yaml")),
    ]
    named = {m for f in files for m in re.findall(r"vit_base_patch16_224\.[a-z0-9_]+", f.read_text())}
    assert named == {PAPER_MODEL}
    assert PAPER_MODEL in cli.search.parser().format_help().replace("\n", " ").replace("  ", "")
