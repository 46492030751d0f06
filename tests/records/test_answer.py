"""The answer a search's summary opens with: the instruction, the cheaper close trial, the baselines and the
plasticity verdict, each from the numbers."""

import numpy as np
import pandas as pd
import pytest

from vitplast_tune.analysis.analyze import SearchAnalysis
from vitplast_tune.analysis.prediction import (
    TrialAnalysis,
    analyze_trials,
    describe_correlations,
    plasticity_verdict,
    read_correlations,
)
from vitplast_tune.records.answer import answer_lines, answer_of, ratio


def trial(components, lr, best, params, step=100, depth="all", test=None):
    return {
        "components": components,
        "lr": lr,
        "depth": depth,
        "best_val_acc": best,
        "val_acc": best,
        "test_acc": best - 0.01 if test is None else test,
        "trainable_params": params,
        "step": step,
        "max_steps": 100,
        "diverged": False,
        "error": None,
    }


def table(*rows):
    return pd.DataFrame(list(rows))


def test_the_answer_names_the_best_trial_the_cheap_close_one_and_both_baselines():
    trials = table(
        trial("all", 0.03, 0.990, 400_000, test=0.975),
        trial("mha+fc1", 0.05, 0.985, 200_000),  # within one point, half the parameters
        trial("fc1", 0.1, 0.970, 100_000),  # 2 points below: not close
        trial("ln1", 0.3, 0.995, 50_000, step=30),  # early-stopped: the best, but not a full-budget trial
        trial("head", 0.3, 0.930, 1_000),
    )
    lines = answer_lines(trials)
    assert lines[0] == (
        "Answer: finetune ln1 at lr 0.3 (99.50% best validation accuracy, test 98.50%, 50,000 trainable parameters), "
        "the best of 5 trials."
    )
    assert len(lines) == 3  # no cheaper close full-budget trial than the best's 50,000
    assert lines[1] == (
        "  Against the baselines (validation accuracy): +6.50 points over the linear probe's best trial of 30 steps or "
        "more (93.00%); +0.50 points over full finetuning's best trial of 30 steps or more (99.00%)."
    )
    assert lines[2].startswith("  Plasticity: not measured")
    trials = trials[trials["components"] != "ln1"]
    lines = answer_lines(trials)
    assert lines[0].startswith("Answer: finetune all at lr 0.03 (99.00% best validation accuracy, test 97.50%, 400,000")
    assert lines[1] == (
        "  Within 1 point of it, fewest parameters: mha+fc1 at lr 0.05 (98.50%, 200,000 trainable, 0.5x the best's)."
    )
    assert "it is full finetuning" in lines[2] and "+6.00 points over the linear probe" in lines[2]


def test_an_answer_printed_is_its_line_and_keeps_its_numbers():
    trials = table(trial("all", 0.03, 0.990, 400_000, test=0.975), trial("head", 0.3, 0.930, 1_000))
    found = answer_of(trials)
    assert str(found) == (
        "Answer: finetune all at lr 0.03 (99.00% best validation accuracy, test 97.50%, 400,000 trainable parameters), "
        "the best of 2 trials."
    )
    assert found.line == str(found) == answer_lines(trials)[0]
    assert found.best["components"] == "all" and found.n_trials == 2 and found.baselines[0].kind == "compared"


def test_a_baseline_stopped_before_the_bests_budget_is_not_compared_with_it():
    trials = table(
        trial("mha", 0.05, 0.99, 100_000, step=200) | {"max_steps": 200},
        trial("all", 0.03, 0.79, 400_000, step=50) | {"max_steps": 200},  # ASHA stopped both at step 50
        trial("all", 0.01, 0.7882, 400_000, step=50) | {"max_steps": 200},
        trial("head", 0.3, 0.90, 1_000, step=200) | {"max_steps": 200},
    )
    found = answer_of(trials)
    probe, full = found.baselines
    assert (probe.kind, probe.gap, probe.step) == ("compared", pytest.approx(9.0), 200)
    assert (full.kind, full.accuracy, full.step) == ("stopped", 0.79, 50)
    line = answer_lines(trials)[1]
    assert "+9.00 points over the linear probe's best trial of 200 steps or more (90.00%)" in line
    assert (
        "full finetuning's trials were all stopped before the best's step budget (its best 79.00% at step 50)" in line
    )
    assert "points over full finetuning" not in line


def test_a_ratio_keeps_three_digits_so_it_is_never_rounded_to_one():
    trials = table(trial("all", 0.03, 0.990, 1_000_000), trial("mha+fc1", 0.05, 0.985, 997_000))
    assert answer_of(trials).cheaper_share == pytest.approx(0.997)
    assert "(98.50%, 997,000 trainable, 0.997x the best's)" in answer_lines(trials)[1]
    assert ratio(0.5) == "0.5x" and ratio(0.6372) == "0.637x"


def test_a_search_without_baselines_or_trials_says_so():
    lines = answer_lines(table(trial("mha", 0.1, 0.9, 10, depth="last"), trial("fc1", 0.1, 0.8, 20)))
    assert lines[0].startswith("Answer: finetune mha in the last blocks at lr 0.1 (90.00%")
    assert "no linear probe trial in this search; no full finetuning trial in this search." in lines[1]
    assert answer_lines(table(trial("mha", 0.1, np.nan, 10))) == [
        "Answer: none yet (no trial reported a validation accuracy)."
    ]


def ranked_by_plasticity(n=40):
    """``n`` trials whose plasticity ranks them by accuracy and whose parameter count does not."""
    rng = np.random.default_rng(0)
    acc = np.linspace(0.5, 0.95, n)
    trials = pd.DataFrame([trial("mha", 0.1, a, int(p)) for a, p in zip(acc, rng.permutation(np.arange(1, n + 1)))])
    return trials.assign(plasticity_mean=acc + 0.001 * rng.normal(size=n))


def test_the_plasticity_line_is_the_analysis_verdict(tmp_path):
    trials = ranked_by_plasticity()
    analysis = SearchAnalysis(trials=analyze_trials(trials, tmp_path, n_boot=300))
    line = answer_lines(trials, analysis)[-1]
    assert line.startswith(
        "  Did plasticity predict it? On final validation accuracy, finished trials, n=40: plasticity_mean: better "
        "than log(trainable parameters) at ranking the trials (Spearman difference +"
    )
    few = trials.head(8)
    line = answer_lines(few, SearchAnalysis(trials=analyze_trials(few, tmp_path, n_boot=300)))[-1]
    assert "too few trials to judge" in line and "better than" not in line and "n=8" in line


def test_the_verdict_comes_from_the_target_with_the_most_trials():
    """Ten finished trials give no verdict; the sixty at the common step do, and the answer quotes those."""
    row = dict(note="", spearman=0.3, diff_low=-0.2, diff_high=0.3, p_holm=float("nan"), level=float("nan"))
    table = pd.DataFrame(
        [
            dict(
                row,
                target="val_acc",
                predictor="plasticity_max",
                n=10,
                verdict="no verdict (n < 12)",
                diff_vs_baseline=-0.5,
            ),
            dict(
                row,
                target="val_acc_common",
                predictor="plasticity_max",
                n=60,
                verdict="no clear difference",
                diff_vs_baseline=0.06,
                p_holm=0.62,
                level=0.975,
            ),
        ]
    )
    assert plasticity_verdict(table) == (
        "on validation accuracy at the last step every trial reached, all trials: plasticity_max is not clearly "
        "different from log(trainable parameters): Spearman difference +0.06 [-0.20, +0.30] (97.5%, Holm p=0.62), n=60."
    )
    assert plasticity_verdict(table[table["target"] == "val_acc"]).endswith("too few trials to judge.")


def test_scores_of_one_verdict_are_said_once_with_their_figures():
    row = dict(note="", target="val_acc_common", n=60, verdict="no clear difference", diff_low=-0.3, diff_high=0.3)
    table = pd.DataFrame(
        [
            dict(row, predictor="plasticity_mean", diff_vs_baseline=-0.16, p_holm=0.56),
            dict(row, predictor="plasticity_max", diff_vs_baseline=0.06, p_holm=1.0),
            dict(row, predictor="plasticity_weighted", diff_vs_baseline=0.4, p_holm=0.01, verdict="better"),
            dict(row, predictor="log_trainable_params", diff_vs_baseline=float("nan"), p_holm=float("nan"), verdict=""),
        ]
    )
    analysis = SearchAnalysis(trials=TrialAnalysis(table, pd.DataFrame(), [], 60))
    assert answer_lines(table_of_one(), analysis)[-1] == (
        "  Did plasticity predict it? On validation accuracy at the last step every trial reached, all trials, n=60: "
        "plasticity_mean, plasticity_max: not clearly different from log(trainable parameters) at ranking the trials "
        "(Spearman differences -0.16, +0.06; Holm p 0.56, 1); plasticity_weighted: better than log(trainable "
        "parameters) at ranking the trials (Spearman difference +0.40; Holm p 0.01)."
    )


def table_of_one():
    return table(trial("mha", 0.1, 0.9, 10))


def test_a_correlations_table_read_back_says_what_it_said_before_it_was_written(tmp_path):
    """An empty note written to correlations.csv comes back as NaN from a plain read, which is true: read back as a
    search reads its records, and even read plainly, the table gives the plasticity line and the text it gave."""
    trials = ranked_by_plasticity()
    written = analyze_trials(trials, tmp_path, n_boot=300)
    assert (written.correlations["note"] == "").all()
    before = answer_lines(trials, SearchAnalysis(trials=written))[-1]
    assert "plasticity_mean: better than log(trainable parameters)" in before
    path = tmp_path / "correlations.csv"
    for table in (read_correlations(path), pd.read_csv(path)):
        again = TrialAnalysis(table, written.single_components, [], written.n_finished)
        assert answer_lines(trials, SearchAnalysis(trials=again))[-1] == before
        assert describe_correlations(table) == describe_correlations(written.correlations)
    assert (read_correlations(path)["note"] == "").all()
