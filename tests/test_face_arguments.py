"""The Python face checks its arguments as the command line does: a value of the wrong type or form given to a public
function is one ``OptionsError`` naming the function, the argument and what it takes, before any work (one checker,
``type_checks.checked``, on every public function; ``SearchOptions`` checks its fields by their annotations)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import vitplast_tune as vt
from vitplast_tune.errors import OptionsError

MODEL = "vit_testbed_patch8_32"
CASES = [
    ("load_search", (5,), {}, "load_search() takes name as a string, got 5 (an integer)"),
    ("load_search", ("s",), {"storage": 3}, "load_search() takes storage as a string or a Path or null, got 3"),
    (
        "load_search",
        ("s",),
        {"trackinguri": "x"},
        "unexpected keyword argument 'trackinguri' (did you mean \"tracking_uri\"",
    ),
    ("list_searches", (["a"],), {}, "list_searches() takes storage as a string or a Path or null, got ['a'] (a list)"),
    ("load_space", ({"parameters"},), {}, "load_space() takes name_or_path as a string or a Path, got {'parameters'}"),
    ("load_best_model", ("s",), {"device": 0}, "load_best_model() takes device as a string, got 0 (an integer)"),
    ("create_model", (MODEL, "10"), {}, "create_model() takes num_classes as an integer, got '10' (a string)"),
    ("create_model", (MODEL, -3), {}, "create_model() takes num_classes as an integer of at least 0, got -3"),
    ("create_model", (MODEL, 10), {"drop_path_rate": "0.1"}, "takes drop_path_rate as a finite number, got '0.1'"),
    ("finetune", ({"lr": 0.1},), {}, "finetune() takes cfg as a FinetuneConfig, got {'lr': 0.1} (a mapping)"),
    ("compute_plasticity", ("m", [], []), {}, "compute_plasticity() takes model as a Module, got 'm' (a string)"),
    ("plasticity_report", (3,), {}, "plasticity_report() takes model_name as a string, got 3 (an integer)"),
    ("plasticity_report", (MODEL,), {"max_pairs": 0}, "takes max_pairs as an integer of at least 1, got 0"),
    ("run_search", (), {"max_steps": "20"}, "max_steps must be an integer or null, got '20' (a string)"),
    ("run_search", (), {"budgets": [100, "x"]}, "budgets must be a list of integers or null, got [100, 'x']"),
    ("run_search", (), {"settings": 3}, "settings must be a mapping of settings, got 3"),
    ("run_search", ("quickstart",), {}, "run_search() takes options as a SearchOptions or null, got 'quickstart'"),
    ("SearchOptions", (), {"resources_per_trial": {"x": "1"}}, "resources_per_trial must be a mapping"),
]


@pytest.mark.parametrize("name, args, kwargs, message", CASES, ids=[f"{c[0]}: {c[3][:50]}" for c in CASES])
def test_a_wrong_argument_is_one_options_error_naming_it(name, args, kwargs, message):
    """A traceback from deep inside before (a TypeError from pathlib, an AttributeError from timm), or accepted."""
    with pytest.raises(OptionsError, match=re.escape(message)) as refused:
        getattr(vt, name)(*args, **kwargs)
    assert "\n" not in str(refused.value)


def test_every_public_function_is_checked_by_the_one_checker():
    stub = (Path(vt.__file__).parent / "__init__.pyi").read_text()
    public = [n for n in re.findall(r"import (\w+) as \1", stub) if inspect.isfunction(getattr(vt, n))]
    assert {"load_search", "run_search", "create_model", "finetune"} <= set(public)
    unchecked = [n for n in public if getattr(getattr(vt, n), "__wrapped__", None) is None]
    assert unchecked == []
    assert inspect.signature(vt.load_search).parameters["storage"].default is None  # the signature shown is the same
