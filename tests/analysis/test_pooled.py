"""The verdict pooled across labs (analysis/pooled.py): the exact law of the pooled agreement against an enumeration
of every joint ordering, the stratified bootstrap, one Holm family, and its files."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.analysis._tables import lab_trials
from vitplast_tune.analysis import lab, pooled
from vitplast_tune.analysis.correlation import spearman

COLUMNS = ("good", "copy", "noise", "plasticity_mean", "log_trainable_params")


def lab_data(name: str, seed: int, model: str = "m0", columns=COLUMNS, **changes) -> pooled.LabData:
    trials = lab_trials(seed=seed).assign(**changes)
    table = lab.subset_table(trials, columns=columns)
    return pooled.LabData(name, model, f"task{seed}", f"data{seed}", table, trials)


def test_the_pooled_agreement_law_is_every_joint_ordering_enumerated():
    """Two labs of 4 and 5 components: the exact p of the mean Spearman by enumerating all 4! x 5! joint orderings."""
    rng = np.random.default_rng(0)
    pairs = [(np.array([1.0, 1.0, 2.0, 3.0]), rng.normal(size=4)), (rng.normal(size=5), rng.normal(size=5))]  # a tie
    observed = np.mean([spearman(x, y) for x, y in pairs])
    joint = [
        (spearman(pairs[0][0], pairs[0][1][list(a)]) + spearman(pairs[1][0], pairs[1][1][list(b)])) / 2
        for a in itertools.permutations(range(4))
        for b in itertools.permutations(range(5))
    ]
    by_hand = np.mean(np.abs(joint) >= abs(observed) - 1e-9)
    values, probs = pooled.sum_law([pooled.permutation_values(x, y) for x, y in pairs])
    assert probs.sum() == pytest.approx(1.0)
    assert probs[np.abs(values / 2) >= abs(observed) - 1e-9].sum() == pytest.approx(by_hand)


def test_pooling_labs_judges_the_mean_difference_under_holm():
    from statsmodels.stats.multitest import multipletests

    labs = [lab_data("lab.m0.a", 0), lab_data("lab.m0.b", 1), lab_data("lab.m1.a", 2, model="m1")]
    result = pooled.pool(labs, n_boot=1000, columns=COLUMNS)
    rows = result.pooled.set_index("predictor")
    assert rows.loc["good", "verdict"] == "better" and rows.loc["good", "low"] > 0 and rows.loc["good", "labs"] == 3
    assert rows.loc["copy", "verdict"] == "no clear difference"
    per = result.per_lab.set_index(["lab", "predictor"])
    assert rows.loc["good", "diff"] == pytest.approx(per.xs("good", level="predictor")["diff_vs_baseline"].mean())
    p = [*rows["p"], result.agreement["p"]]
    assert result.family == 5
    np.testing.assert_allclose([*rows["p_holm"], result.agreement["p_holm"]], multipletests(p, method="holm")[1])
    assert np.isfinite(rows.loc["good", "re"]) and rows.loc["good", "re_low"] < rows.loc["good", "re"]
    single = pooled.pool(labs[:1], n_boot=1000, columns=COLUMNS).pooled.set_index("predictor")
    width = lambda r: r["high"] - r["low"]
    assert width(rows.loc["good"]) < width(single.loc["good"])  # three labs' mean: narrower than one lab's
    twice = pooled.pool([labs[0], labs[0]], n_boot=1000, columns=COLUMNS).pooled.set_index("predictor")
    p_twice = pooled.pool([labs[0]], n_boot=1000, columns=COLUMNS, alpha=0.05).pooled.set_index("predictor")
    assert twice.loc["good", "diff"] == pytest.approx(p_twice.loc["good", "diff"])
    spread = lambda r: r["high"] - r["low"]  # the same lab twice, resampled independently: the mean's spread shrinks
    assert spread(twice.loc["noise"]) < 0.85 * spread(p_twice.loc["noise"])
    sentences = pooled.conclusions(result)
    assert sentences[0].startswith("good ranks the subsets better") and "3 labs (2 model(s): m0, m1" in sentences[0]


def test_a_predictor_undefined_on_some_resamples_is_pooled_over_the_others():
    """contains_mha_or_fc is 0 on three subsets only and constant, its Spearman undefined, on each resample that misses
    them all: each lab's standard error, the pooled difference and the random effects come from the resamples where
    it is defined, as its intervals do (an undefined resample made them all NaN, and the labs 0)."""
    columns, binary = (*COLUMNS, "contains_mha_or_fc"), "contains_mha_or_fc"
    labs = [lab_data(f"lab.m0.{k}", k, columns=columns) for k in range(3)]
    _, samples = pooled.per_lab_statistics(labs, 2000, 0, columns)
    undefined = [np.isnan(s).mean() for s in samples[binary]]
    assert all(0.01 < u < 0.1 for u in undefined), undefined  # about (28/31)**31 of the resamples miss all three
    result = pooled.pool(labs, n_boot=2000, columns=columns)
    per = result.per_lab[result.per_lab["predictor"] == binary]
    assert [float(x) for x in per["se"]] == pytest.approx([np.nanstd(s) for s in samples[binary]])
    row = result.pooled.set_index("predictor").loc[binary]
    assert row["labs"] == 3 and row["diff"] == pytest.approx(per["diff_vs_baseline"].mean())
    assert np.isfinite(row["re"]) and row["low"] < row["diff"] < row["high"]


def test_the_pooled_files_say_which_labs(tmp_path):
    flat = dict(good=lambda t: t["noise"], plasticity_mean=lambda t: t["noise"])
    labs = [lab_data("lab.m0.a", 0, **flat), lab_data("lab.m0.b", 1, **flat)]
    result = pooled.pool(labs, n_boot=500, columns=COLUMNS)
    files = pooled.write_pooled(result, tmp_path)
    payload = __import__("json").loads(files[0].read_text())
    assert [lab["lab"] for lab in payload["labs"]] == ["lab.m0.a", "lab.m0.b"] and payload["family"] == 5
    assert payload["conclusions"][0].startswith("No predictor ranks the subsets better")
    assert {r["predictor"] for r in payload["predictors"]} == {"good", "copy", "noise", "plasticity_mean"}
    assert "Per lab:" in pooled.describe_pooled(result) and "random effects" in pooled.describe_pooled(result)
    assert isinstance(pd.read_csv(files[2]), pd.DataFrame)


def test_labs_are_read_from_their_folders_and_the_unqualified_left_out(tmp_path):
    """Lab folders as ``vitplast-lab`` leaves them (its record, the analysis's subsets table, every stage's trials):
    pooled from disk, a lab whose task did not qualify named as left out."""
    import json

    for name, seed, qualifies in (("lab.m0.a", 0, True), ("lab.m0.b", 1, True), ("lab.m0.c", 2, False)):
        trials = lab_trials(seed=seed)
        results = lab.criteria_lab({None: trials}, n_boot=200, columns=COLUMNS)
        lab.write_lab(results, tmp_path / name / "analysis")
        trials.to_csv(tmp_path / name / "analysis" / "lab_trials.csv", index=False)
        record = {"model": "m0", "task": f"t{seed}", "dataset": f"d{seed}", "qualification": {"qualifies": qualifies}}
        record["stages"] = {"full": {"seconds": 60.0 * (seed + 1)}, "single": {"seconds": 30.0}}
        (tmp_path / name / "lab.json").write_text(json.dumps(record))
    dirs = [tmp_path / n for n in ("lab.m0.a", "lab.m0.b", "lab.m0.c")]
    data = pooled.read_lab(dirs[0])
    assert data.table["in_verdict"].dtype == bool and len(data.trials) == 31 * 9 and data.qualifies
    text = pooled.pool_labs(dirs, tmp_path / "pooled", n_boot=300)
    payload = json.loads((tmp_path / "pooled" / "pooled.json").read_text())
    assert [lab_["lab"] for lab_ in payload["labs"]] == ["lab.m0.a", "lab.m0.b"] and payload["excluded"] == ["lab.m0.c"]
    assert "Left out, their task did not qualify: lab.m0.c." in text
    # each lab's time: its stages' recorded seconds summed (60 + 30 s, 120 + 30 s), in the sentences and the file
    assert "Each lab's searches took (wall time as recorded): lab.m0.a 1.5 min (2 searches); lab.m0.b 2.5 min" in text
    assert [lab_["minutes"] for lab_ in payload["labs"]] == [1.5, 2.5]
    with pytest.raises(pooled.UserError, match="is not analyzed"):
        pooled.read_lab(tmp_path / "lab.m0.missing")


RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
EVIDENCE = RESULTS / "data" / "lab-2026-12-02"  # each finished lab's three files that pooling reads, kept with its page


def test_the_results_page_quotes_what_its_committed_labs_pool_to(tmp_path):
    """The labs kept beside the dated results page, pooled again here, print the closing sentences the page quotes
    for them, word for word: the page's words are the numbers' and anyone can check them without rerunning a trial."""
    labs = sorted(EVIDENCE.glob("lab.*"))
    assert labs and all((d / "lab.json").is_file() for d in labs)
    text = pooled.pool_labs(labs, tmp_path / "pooled")
    said = text.split("What it says (generated from the figures above):\n")[1].split("\nfiles:")[0].splitlines()
    page = (RESULTS / "lab-2026-12-01.md").read_text()
    assert len(said) >= 3 and all(line.strip() in page for line in said), "requote the page from the command's output"
