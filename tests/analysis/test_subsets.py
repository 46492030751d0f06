"""The criteria lab (analysis/lab.py): each subset at its best rate, the edges marked, the hierarchical bootstrap, one
Holm family for every verdict, and closing sentences generated from the figures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.analysis._tables import grid_trials, lab_trials
from vitplast_tune.analysis import subsets as lab
from vitplast_tune.analysis import subsets_report

PREDICTORS = ["good", "bad", "copy", "noise"]


def run_lab(trials, budgets=None, **options):
    columns = (*PREDICTORS, "plasticity_mean", "log_trainable_params")
    return lab.criteria_lab(budgets or {None: trials}, n_boot=options.pop("n_boot", 1000), columns=columns, **options)


def test_the_table_takes_each_subset_at_its_best_rate_and_marks_the_ends():
    trials = grid_trials()  # two rates: every best rate is at an end
    extra = pd.DataFrame({"grad_norm": {"mha": 5.0, "fc1": 4.0, "ln1": 1.0, "mha+fc1": 6.0}})
    table = lab.subset_table(trials, extra, grid_lrs=[0.01]).set_index("components")
    assert table.loc["mha+fc1", "mean"] == pytest.approx(0.90) and table.loc["mha+fc1", "lr"] == 0.01
    assert table.loc["ln1", "contains_mha_or_fc"] == 0 and table.loc["fc1", "contains_mha_or_fc"] == 1
    assert table.loc["mha", "log_trainable_params"] == pytest.approx(np.log10(1000))
    assert table.loc["fc1", "grad_norm"] == 4.0
    assert table.loc["mha", "position"] == "low edge" and table.loc["ln1", "position"] == "high edge"
    assert table.loc["ln1", "added"] == [0.1] and table.loc["ln1", "lrs"] == [0.01, 0.1]
    assert not table["in_verdict"].any()  # at an end, or not a block subset (head)


def test_a_planted_edge_optimum_is_left_out_until_the_rate_beyond_it_is_tried():
    """ln1 is truly best at 3.0, beyond the grid's 0.1-1.0: at 1.0 its row is at the high edge and out of the verdict;
    with 3.0 (and 10, where it is worse again) added it is interior at 3.0, its rates added listed, and in."""
    grid = lab_trials(edge="ln1")
    first = run_lab(grid, grid_lrs=[0.1, 0.3, 1.0])[0]
    row = first.table.set_index("components").loc["ln1"]
    assert row["position"] == "high edge" and row["lr"] == 1.0 and not row["in_verdict"]
    assert first.comparison.set_index("predictor").loc["good", "n"] == 30
    assert "1 subset(s) left out of the verdict" in subsets_report.describe_subsets(first)
    wider = pd.concat([grid, lab_trials(edge="ln1", lrs=(3.0, 10.0))[lambda t: t["components"] == "ln1"]])
    second = run_lab(wider, grid_lrs=[0.1, 0.3, 1.0])[0]
    row = second.table.set_index("components").loc["ln1"]
    assert row["position"] == "interior" and row["lr"] == 3.0 and row["in_verdict"] and row["added"] == [3.0, 10.0]
    assert second.comparison.set_index("predictor").loc["good", "n"] == 31


def test_verdicts_with_a_known_answer_under_one_holm_family():
    from statsmodels.stats.multitest import multipletests

    result = run_lab(lab_trials(), n_boot=2000)[0]
    rows = result.comparison.set_index("predictor")
    assert rows.loc["good", "verdict"] == "better" and rows.loc["good", "diff_low"] > 0
    assert rows.loc["bad", "verdict"] == "worse" and rows.loc["bad", "diff_high"] < 0
    assert rows.loc["copy", "verdict"] == "no clear difference"
    assert rows.loc["copy", "diff_low"] <= 0 <= rows.loc["copy", "diff_high"] and rows.loc["copy", "p"] == 1
    tested = rows.drop("log_trainable_params")
    p = [*tested["p"], result.agreement["p"]]
    assert result.family == len(p) == 6  # five predictors and the single-component agreement
    np.testing.assert_allclose([*tested["p_holm"], result.agreement["p_holm"]], multipletests(p, method="holm")[1])
    for r in tested.itertuples():  # every verdict agrees with its adjusted interval
        assert (r.verdict == "better") == (r.diff_low > 0) and (r.verdict == "worse") == (r.diff_high < 0)
        assert r.level >= 1 - 0.05 / 6 or r.verdict in ("better", "worse")


def test_closing_sentences_say_better_only_where_the_adjusted_interval_lies_above_zero():
    result = run_lab(lab_trials(), n_boot=2000)
    sentences = subsets_report.conclusions(result)
    better = {s.split()[0] for s in sentences if "ranks the subsets better than" in s and not s.startswith("No ")}
    rows = result[0].comparison.set_index("predictor")
    assert better == {"good", "plasticity_mean"} == set(rows.index[rows["diff_low"] > 0])
    assert any(s.startswith("Worse than the parameter count") and "bad (" in s for s in sentences)
    assert not any("copy" in s or "noise ranks" in s for s in sentences)
    agreement = next(s for s in sentences if s.startswith("The paper's narrower claim"))
    assert ("holds" in agreement) == (result[0].agreement["p_holm"] < 0.05)  # ranked after the rejected ones


def test_five_components_cannot_establish_the_narrower_claim_first_in_a_family():
    """The single components in the same order by accuracy and by plasticity: exact p = 2/120, but when nothing else
    in the family is rejected Holm asks it for p < 0.05/6 = 0.0083, which no ordering of five can give."""
    flat = lab_trials()
    singles = ["ln1", "mha", "ln2", "fc1", "fc2"]
    order = flat[flat["components"].isin(singles)].groupby("components")["test_acc"].mean().rank()
    flat["trainable_params"] = flat["trainable_params"].where(
        ~flat["components"].isin(singles), 100 + flat["components"].map(order)
    )
    logs = np.log(flat["trainable_params"])
    flat = flat.assign(good=logs, bad=logs, noise=logs, copy=logs, plasticity_mean=logs)  # each ranks as the baseline
    result = run_lab(flat, n_boot=1000)
    sentences = subsets_report.conclusions(result)
    assert sentences[0].startswith("No predictor ranks the subsets better") and not sentences[1].startswith("Worse")
    a = result[0].agreement
    assert a["spearman"] == pytest.approx(1.0) and a["p"] == pytest.approx(2 / 120)
    assert a["p_holm"] == pytest.approx(6 * 2 / 120) and a["verdict"] == "not established"
    agreement = next(s for s in sentences if s.startswith("The paper's narrower claim"))
    assert "not established" in agreement and "no ordering can give an exact p below 0.0167" in agreement


def test_several_budgets_are_one_family_and_their_disagreements_are_said():
    short, long = lab_trials(seed=1), lab_trials(seed=1).assign(good=lambda t: t["noise"])
    results = run_lab(None, budgets={150: short, 600: long}, n_boot=1000)
    assert [r.budget for r in results] == [150, 600] and results[0].family == results[1].family == 12
    last = subsets_report.conclusions(results)[-1]
    assert last.startswith("The verdicts of") and "good (better at 150, " in last
    same = run_lab(None, budgets={150: short, 600: short}, n_boot=1000)
    assert subsets_report.conclusions(same)[-1] == "Every verdict is the same at every budget."


def test_the_lab_is_written_and_described(tmp_path):
    results = run_lab(lab_trials(edge="ln1"), n_boot=500, grid_lrs=[0.1, 0.3, 1.0])
    files = lab.write_lab(results, tmp_path)
    assert {f.name for f in files} == {"criteria.csv", "criteria_subsets.csv", "criteria_agreement.csv"}
    subsets = pd.read_csv(tmp_path / "criteria_subsets.csv").set_index("components")
    assert subsets.loc["ln1", "position"] == "high edge" and subsets.loc["ln1", "lrs"] == "0.1 0.3 1"
    text = subsets_report.describe_lab(results)
    assert "Hierarchical bootstrap (500 resamples" in text and "What it says" in text
    assert "Holm p=" in text and "exact permutation p=" in text
