"""The benchmarks' flags checked as they are parsed, before any work (``benchmarks.common.Parser`` and its types): an
impossible count, an unknown name, an output whose folder cannot be written or an input folder that is not there is
one line and exit code 2; the defaults still parse, as they were."""

from __future__ import annotations

import importlib

import pytest

from benchmarks import common

# (benchmark, its flags ({tmp}: the test's folder, where a-file is a file), what the one line says)
CASES = [
    ("search_replay", ["--seeds", "0"], "argument --seeds: must be a whole number of at least 1, got 0"),
    ("search_replay", ["--samplers", "TPE,tpe"], 'unknown "tpe" (did you mean "TPE"?); known: TPE, TPE multivariate'),
    ("search_replay", ["--schedulers", "ASHA,PBT"], 'argument --schedulers: unknown "PBT"'),
    ("search_replay", ["--budget", "-1"], "argument --budget: must be a number above 0, got -1"),
    ("search_replay", ["--plot", "{tmp}/a-file/plot.png"], "{tmp}/a-file/plot.png: {tmp}/a-file is a file, not a"),
    ("search_replay", ["--tables", "{tmp}/none"], "argument --tables: {tmp}/none is not a folder"),
    ("search_replay", ["--workers", "two"], "argument --workers: 'two' is not a whole number"),
    ("replay_finalists", ["--tops", "1,-2"], "argument --tops: must be a whole number of at least 0, got -2"),
    ("replay_finalists", ["--trials", "20,,40"], "argument --trials: '20,,40' has an empty value"),
    ("replay_finalists", ["--page", "{tmp}"], "argument --page: {tmp} is a folder; name a file in it"),
    ("replay_finalists", ["--cache", "{tmp}/a-file"], "argument --cache: {tmp}/a-file: {tmp}/a-file is a file"),
    ("answer_agreement", ["--names", "qs-seed0"], 'argument --names: no search "qs-seed0" in the results folder'),
    ("answer_agreement", ["--names", "x", "--json", "{tmp}/a-file/x.json"], "argument --json: {tmp}/a-file/x.json"),
    ("scale", ["--stacks", "vitplast,handmade"], 'argument --stacks: unknown "handmade"'),
    ("scale", ["--trials", "100,0"], "argument --trials: must be a whole number of at least 1, got 0"),
    ("checkpoint", ["--storages", "local,gcs"], 'argument --storages: unknown "gcs"'),
    ("training", ["--subsets", "mha,mlp"], 'argument --subsets: unknown component "mlp"'),
    ("coverage", ["--ns", "1", "4"], "argument --ns: must be a whole number of at least 2, got 1"),
    ("gpu_check", ["--steps-only", "nope"], 'argument --steps-only: unknown "nope"'),
    ("trial", ["--lr", "0"], "argument --lr: must be a number above 0, got 0"),
    ("budget", ["--budgets", "150", "0"], "argument --budgets: must be a whole number of at least 1, got 0"),
    ("data", ["--seconds", "nan"], "argument --seconds: must be a number above 0, got nan"),
    ("memory", ["--plasticity", "-5"], "argument --plasticity: must be a whole number of at least 0, got -5"),
    ("plasticity", ["--pairs", "0"], "argument --pairs: must be a whole number of at least 1, got 0"),
    ("search", ["--reduction-factor", "1"], "argument --reduction-factor: must be a whole number of at least 2"),
    ("augment", ["--workers", "0"], "argument --workers: must be a whole number of at least 1, got 0"),
    ("optimizer", ["--seeds", "0"], "argument --seeds: must be a whole number of at least 1, got 0"),
    ("parallel", ["--rounds", "0"], "argument --rounds: must be a whole number of at least 1, got 0"),
    ("quickstart", ["--every", "0"], "argument --every: must be a number above 0, got 0"),
]
PARSED = ["search_replay", "replay_finalists", "scale", "checkpoint", "training", "coverage", "gpu_check", "trial"]


@pytest.mark.parametrize("name, argv, message", CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_an_impossible_flag_is_one_line_and_exit_2_before_any_work(name, argv, message, tmp_path, capsys):
    """Before: accepted (a replay of zero seeds, an unknown sampler skipped), a traceback, or a plot path found
    unwritable after the replays."""
    (tmp_path / "a-file").write_text("not a folder")
    module = importlib.import_module(f"benchmarks.{name}")
    run = getattr(module, "parse_args", module.main)  # those that parse inside main exit there, before any work
    with pytest.raises(SystemExit) as exited:
        run([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert message.replace("{tmp}", str(tmp_path)) in err[0]


@pytest.mark.parametrize("name", PARSED)
def test_the_defaults_parse_as_they_were(name):
    """The flags' types take the defaults (text kept as text: the figures' JSON records them as given)."""
    args = importlib.import_module(f"benchmarks.{name}").parse_args([])
    assert all(not callable(value) for value in vars(args).values())
    if name == "search_replay":
        assert args.samplers == "TPE,TPE multivariate+group,GP,random,grid order" and args.seeds == 50


def test_the_types_read_numbers_names_and_paths(tmp_path):
    assert common.at_least(0)("0") == 0 and common.above(0)("inf") == float("inf")
    assert common.listed(common.known(["a", "b"]))("a,b") == "a,b"
    assert common.output(str(tmp_path / "new" / "x.json")) == str(tmp_path / "new" / "x.json")  # a folder to make
    assert not (tmp_path / "new").exists()
