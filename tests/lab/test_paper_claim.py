"""What the labs say about the paper's claim, outside the pre-registered family (lab/ordering.py, and the verdict
page's sections in lab/verdict_page.py): the single components' gap and what orders them, held to the kept records;
the words that follow the figures; the predictors read as worse; the power lines; the deviations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.lab._synthetic import design_file, write_lab
from vitplast_tune.analysis.protocol import best_lr_table
from vitplast_tune.lab import analysis, ordering, pooled, verdict_page
from vitplast_tune.lab.design import read_design
from vitplast_tune.lab.records import read_kept

DATA = Path(__file__).resolve().parents[2] / verdict_page.KEPT


def test_the_kept_labs_reproduce_the_independent_recompute():
    """Issue 58 recomputed from the raw records without the package: the gap positive in 8 of 8 labs, +7.66 points on
    the labs' mean, positive in all 27 non-saturated checks; fc2 less plastic than ln2 in 7 of 8 labs, yet more
    accurate in 7 of 8."""
    labs = [ordering.gap_of(read_kept(f), n_boot=200) for f in sorted(DATA.glob("lab.*"))]
    checks = [read_kept(f) for f in sorted((DATA / "checks").glob("lab.*"))]
    found = ordering.ordering(labs, *ordering.checks_gaps(checks))
    assert len(checks) == 46 and found.open_checks == 27 and len(found.checks) == 27
    assert found.positive == 8 and all(g.gap > 0 for g in found.checks)
    assert found.gap == pytest.approx(0.0766, abs=5e-5) and found.low < found.gap < found.high
    assert ordering.contradiction(found) == "fc2 is less plastic than ln2 in 7 of 8 labs yet more accurate in 7 of 8"
    first = labs[0]  # the gap is the components' test means at the rate validation chose, as the labs table's
    table = best_lr_table(read_kept(DATA / first.lab).trials, "test_acc", select_by="val_acc")
    means = table.set_index("components")["mean"]
    assert first.accuracy["mha"] == pytest.approx(means["mha"]) and first.accuracy["all"] == pytest.approx(means["all"])
    assert first.gap == pytest.approx(means[["mha", "fc1", "fc2"]].mean() - means[["ln1", "ln2"]].mean())


def _gap(name: str, accuracy: dict, plasticity: dict, gap_samples: float) -> ordering.Gap:
    params = {"mha": 150.0, "fc1": 150.0, "fc2": 149.0, "ln1": 2.0, "ln2": 2.0}
    found = ordering.Gap(name, "m", name, accuracy, plasticity, params, 0.0)
    found.gap = np.mean([accuracy[k] for k in ordering.AHEAD]) - np.mean([accuracy[k] for k in ordering.BEHIND])
    found.samples = found.gap + np.random.default_rng(0).normal(0, gap_samples, 500)
    return found


def test_the_words_follow_the_figures():
    """Accuracy that follows plasticity, not size: plasticity orders the components better; a gap below 0: the
    ordering is not shown."""
    plastic = {"mha": 5.0, "fc1": 4.0, "fc2": 0.1, "ln1": 0.2, "ln2": 3.0}
    by_plasticity = {k: 0.5 + v / 10 for k, v in plastic.items()}
    labs = [_gap(f"lab{k}", by_plasticity, plastic, 0.001) for k in range(3)]
    said = ordering.finding(ordering.ordering(labs, [], 0))
    assert "mha, fc1 and fc2 beat ln1 and ln2" in said and "plasticity orders them better than parameter" in said
    assert "positive in 3 of 3 labs and in 0 of 0 non-saturated checks" in said
    found = ordering.ordering(labs, [], 0)
    assert found.agree("plasticity") == 18 and found.agree("params") == 12
    assert ordering.contradiction(found) == ""  # plasticity never ranks an mha/fc component below an ln it loses to
    behind = {"mha": 0.5, "fc1": 0.5, "fc2": 0.5, "ln1": 0.6, "ln2": 0.6}
    said = ordering.finding(ordering.ordering([_gap("a", behind, plastic, 0.001)], [], 0))
    assert "are not shown to beat ln1 and ln2" in said and "-10.00 points" in said
    assert "plasticity orders them better" in said  # plasticity orders 2 of 6 pairs as accuracy does, size none
    lines = ordering.describe(ordering.ordering(labs, [], 0))
    assert lines[0] == ordering.finding(ordering.ordering(labs, [], 0))
    assert any(line.startswith("| lab0 | 100.00 (5.00) | 90.00 (4.00) | 51.00 (0.10) |") for line in lines)


def test_a_saturated_check_counts_out_and_one_without_single_components_has_no_gap(tmp_path):
    folder = write_lab(tmp_path, 0)
    records = read_kept(folder)
    records.record["qualification"] = {"full": {"mean": 0.97}, "max_full_val_acc": 0.95}
    assert ordering.checks_gaps([records]) == ([], 0)
    records.record["qualification"] = {"full": {"mean": 0.90}, "max_full_val_acc": 0.95}
    gaps, n = ordering.checks_gaps([records])
    assert n == 1 and len(gaps) == 1 and gaps[0].samples is None
    records.trials = records.trials[records.trials["components"] != "ln2"]
    assert ordering.gap_of(records) is None and ordering.checks_gaps([records]) == ([], 1)


@pytest.fixture(scope="module")
def pooled_both(tmp_path_factory):
    root = tmp_path_factory.mktemp("labs")
    folders = [write_lab(root, k) for k in range(3)] + [write_lab(root, 3, model="model1")]
    design = read_design(design_file(root))
    records = [read_kept(f) for f in folders]
    labs = [analysis.analyze_lab(r, design, n_boot=400) for r in records]
    fixed = [analysis.analyze_lab(r, design, n_boot=400, draw_subsets=False) for r in records]
    return pooled.pool(labs, design), pooled.pool(fixed, design)


def test_worse_is_read_outside_the_family_and_the_power_says_what_could_not_succeed(pooled_both):
    """``noise`` ranks the subsets at random against a baseline that follows their size: read the other way it is
    worse, though the family can only call it "not shown better"; equivalence within ±0.1 had no power here."""
    result, _ = pooled_both
    worse = verdict_page.worse_table(result).set_index("predictor")
    assert worse.loc["noise", "high"] < 0 and worse.loc["noise", "below"] == 4 and worse.loc["noise", "share"] == 0
    assert worse.loc["good", "low"] > 0 and worse.loc["noise", "decision"] == "not established"
    lines = verdict_page._unsaid_section(result)
    text = "\n".join(lines)
    level = verdict_page._level(verdict_page.worse_table(result))[0]  # "the family's 98.9%" unless one is rejected
    assert (
        f"at {level} level, the pooled interval lies below 0 (worse than the baseline) for noise; above 0 for good, "
        "plasticity_mean; it holds 0 for copy." in text
    )
    power = result.power.set_index(["predictor", "what"])
    good = power.loc[("good", analysis.SUBSETS)]
    assert f"| good | {good['superiority']:.2f} | {good['equivalence']:.2f} | - |" in lines
    none = [
        p for p in ("good", "noise", "plasticity_mean") if power.loc[(p, "subsets"), "equivalence"] < 0.005
    ]  # copy: SE 0
    assert f"could not have established** (power below 0.005): {', '.join(f'equivalent {p}' for p in none)}." in text


def test_the_deviations_say_the_subsets_resampling_with_its_sensitivity_row_and_the_tasks(pooled_both):
    """Kept fixed, the subsets no longer widen the intervals; the labs cover 4 tasks, one on each lab."""
    result, fixed = pooled_both
    drawn_w, fixed_w = verdict_page.worse_table(result), verdict_page.worse_table(fixed)
    ratio = ((fixed_w["high"] - fixed_w["low"]) / (drawn_w["high"] - drawn_w["low"])).to_numpy()
    copy = list(drawn_w["predictor"]).index("copy")  # the baseline itself: no width either way
    assert np.isnan(ratio[copy]) and (np.delete(ratio, copy) < 1).all()
    text = "\n".join(verdict_page._deviations_section(result, fixed))
    assert f"{np.nanmin(ratio):.2f} to {np.nanmax(ratio):.2f} times as wide" in text and "`draw_subsets=True`" in text
    assert "**4 labs on 4 distinct tasks**: each lab its own task." in text
    row = next(line for line in text.splitlines() if line.startswith("| noise |"))
    assert row.endswith("| yes / yes |")


def test_the_labs_table_picks_its_best_subset_on_validation(pooled_both):
    """The best subset is the one with the highest mean validation accuracy at its rate; the test's pick is labelled."""
    result, _ = pooled_both
    table = verdict_page.labs_table(result.labs)
    for a, cell in zip(result.labs, table["best subset (by validation)"]):
        val = best_lr_table(a.records.trials, "val_acc", select_by="val_acc").set_index("components")["mean"]
        assert cell.split(" at ")[0] == val.reindex(a.table.loc[a.table["in_verdict"], "components"]).idxmax()
    assert "highest test mean (chosen by test)" in table
