"""The pre-registered verdict from kept folders (lab/records.py, lab/analysis.py, lab/pooled.py, lab/report.py): the
crossed bootstrap, p-values with their Monte Carlo error, equivalence, the narrower claim against the baseline, the
random-effects headline, the design refusing what it does not name, the files, forest plots and the MLflow run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.lab._synthetic import design_file, write_lab
from tests.lab.test_results_page import judged_and_said, same_to_the_printed_digit
from vitplast_tune.analysis import crossed, resampling
from vitplast_tune.analysis.verdicts import decision
from vitplast_tune.errors import UserError
from vitplast_tune.lab import analysis, pooled, report
from vitplast_tune.lab.design import read_design
from vitplast_tune.lab.records import read_kept


@pytest.fixture(scope="module")
def labs(tmp_path_factory):
    root = tmp_path_factory.mktemp("labs")
    folders = [write_lab(root, k) for k in range(3)] + [write_lab(root, 3, model="model1")]
    return root, folders, design_file(root)


def test_a_kept_folder_is_read_whole_and_its_outcomes_align_with_its_trials(labs):
    _, folders, _ = labs
    records = read_kept(folders[0])
    assert records.select == "val_acc" and records.notes == [] and records.seeds == 5
    assert records.correct.shape == (len(records.trials), 200)
    np.testing.assert_allclose(records.correct.mean(axis=1), records.trials["test_acc"])
    with pytest.raises(UserError, match="is not a kept lab"):
        read_kept(folders[0].parent / "nowhere")


def test_seeds_are_drawn_jointly_for_every_subset(labs):
    """A seed shifts every subset alike here (no interaction): drawn jointly, the subsets' differences are the same on
    every resample of the seeds (test images not resampled); drawn per subset, as before, they are not."""
    _, folders, _ = labs
    records = read_kept(folders[0])
    trials = records.trials.assign(test_acc=lambda t: t["val_acc"])  # the target: the seed-shifted accuracy itself
    keys = ["mha", "fc1", "mha+fc1"]
    grid = crossed.grid_of(trials, keys, select="val_acc")
    _, values = crossed.targets(grid, 300, crossed.stream("x", 0), draw_subsets=False)
    spread = (values - values[:, :1]).std(axis=0)
    assert values.std(axis=0).min() > 0.003 and spread.max() < 0.003  # each moves, their differences hardly do
    runs = resampling.runs_of(trials.assign(best_val_acc=trials["val_acc"]), [(k,) for k in keys])
    drawn, old = resampling.resample(runs, 300, 0)
    same = (drawn == np.arange(3)).all(axis=1)  # resamples that drew each subset once, in order
    assert (old[same] - old[same][:, :1]).std(axis=0).max() > 2 * spread.max()


def test_test_images_are_drawn_jointly_for_every_subset(labs):
    """Two runs with the same outcomes score alike on every draw of the test images; the draws move the scores."""
    _, folders, _ = labs
    records = read_kept(folders[0])
    correct = records.correct.copy()
    first, second = ((records.trials["components"] == c).to_numpy() for c in ("mha", "fc1"))
    correct[second] = correct[first]
    grid = crossed.grid_of(records.trials, ["mha", "fc1"], select="val_acc", correct=correct)
    grid.select[1] = grid.select[0]  # the same rate chosen for both on every resample
    _, values = crossed.targets(grid, 200, crossed.stream("y", 0), draw_subsets=False)
    np.testing.assert_allclose(values[:, 0], values[:, 1])
    assert values[:, 0].std() > 0.005


def test_the_family_is_judged_with_mc_errors_equivalence_and_the_narrower_claim(labs, tmp_path):
    from statsmodels.stats.multitest import multipletests

    _, folders, design = labs
    result, text = report.pool_folders(folders, tmp_path / "pooled", design=design)
    said = {(j.claim.claim, j.claim.predictor): decision(j.result) for j in result.judged}
    assert said[("better", "good")] == "established" and said[("better", "noise")] == "not established"
    assert said[("equivalent", "copy")] == "established" and said[("equivalent", "noise")] == "not established"
    assert said[("narrower", "plasticity_mean")] == "established"
    tested = [j for j in result.judged if j.result is not None]
    assert len(tested) == 9 and all(j.result.family == 9 for j in tested)
    p = np.array([j.p for j in tested])
    np.testing.assert_allclose([j.result.p_adjusted for j in tested], multipletests(p, method="holm")[1])
    good = next(j for j in tested if j.claim.key == "better:good:pooled")
    assert good.p_se == pytest.approx(1 / 2000) and good.result.low > 0  # p = 0 of 2000: its error one resample
    assert "ranks the subsets better than log(#trainable parameters) across these 4 tasks" in text
    assert "copy, noise are not shown to rank the subsets better" in text and "no better" not in text
    assert "Holm over 9 verdicts, family-wise 5%" in text and "(MC SE " in text
    head = result.headline.set_index(["predictor", "what"]).loc[("noise", "subsets")]
    assert head["labs"] == 4 and 0 <= head["i2"] <= 1 and head["tau2"] >= 0
    assert result.tasks_needed == pooled.tasks_needed(0.05, 9) == 8  # 1/2^8 < 0.05/9 <= 1/2^7


def test_alpha_and_the_correction_in_the_words_come_from_the_design(labs, tmp_path):
    _, folders, _ = labs
    design = design_file(tmp_path / "other", alpha=0.1, correction="bonferroni")
    _, text = report.pool_folders(folders, tmp_path / "pooled", design=design)
    assert "Bonferroni over 9 verdicts, family-wise 10%" in text and "Holm" not in text.split(report.SAYS)[1]


def test_the_labs_order_changes_nothing_and_the_bootstrap_seed_only_the_last_digit(labs, tmp_path):
    _, folders, design = labs
    text = report.pool_folders(folders, tmp_path / "a", design=design)[1]
    again = report.pool_folders(folders[::-1], tmp_path / "b", design=design)[1]
    assert text.split("\nfiles:")[0] == again.split("\nfiles:")[0]
    resampling = {"seeds": "joint", "test_images": "joint", "resamples": 2000, "bootstrap_seed": 1}
    moved = report.pool_folders(folders, tmp_path / "c", design=design_file(tmp_path / "seed1", resampling=resampling))[
        1
    ]
    assert judged_and_said(text) != judged_and_said(moved)  # another seed, other resamples
    assert same_to_the_printed_digit(judged_and_said(text), judged_and_said(moved))


def test_the_design_refuses_what_it_does_not_name(labs, tmp_path):
    root, folders, _ = labs
    with pytest.raises(UserError, match="no test for the claim 'worse'"):
        read_design(design_file(tmp_path / "a", family=[{"claim": "worse", "predictor": "good"}]))
    with pytest.raises(UserError, match="'grad_norm', which is not among its predictors"):
        read_design(design_file(tmp_path / "b", family=[{"claim": "better", "predictor": "grad_norm"}]))
    with pytest.raises(UserError, match="headline 'fixed_effects' is not one the analysis computes"):
        read_design(design_file(tmp_path / "h", headline="fixed_effects"))
    narrow = read_design(design_file(tmp_path / "c", candidate_tasks=["t0"]))
    with pytest.raises(UserError, match="its task t1 is not among the pre-registered tasks"):
        analysis.analyze_lab(read_kept(folders[1]), narrow)
    with pytest.raises(UserError, match="no preregistration.yaml beside the labs"):
        report.design_for([tmp_path / "x" / "lab.m0.t0"], None)
    assert report.design_for(folders, None).source == str(root / "preregistration.yaml")


def test_the_files_the_forest_plots_and_the_mlflow_run(labs, tmp_path):
    from mlflow.tracking import MlflowClient

    from tests.analysis._tables import is_png

    _, folders, design = labs
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result, text = report.pool_folders(folders, tmp_path / "pooled", design=design, tracking_uri=uri)
    payload = json.loads((tmp_path / "pooled" / "pooled.json").read_text())
    rows = {r["predictor"]: r for r in payload["predictors"]}
    assert rows["good"]["verdict"] == "better" and rows["noise"]["verdict"] == "not established"
    assert payload["family"] == 9 and [lab["lab"] for lab in payload["labs"]] == [f.name for f in folders]  # sorted
    plots = sorted((tmp_path / "pooled").glob("forest-*.png"))
    stems = ("copy", "good", "noise", "plasticity_mean", "plasticity_mean-single")
    assert [p.name for p in plots] == sorted(f"forest-{p}.png" for p in stems)
    assert all(is_png(p) for p in plots)
    run_id = text.split("MLflow run ")[1].split()[0]
    client = MlflowClient(uri)
    names = {a.path for a in client.list_artifacts(run_id, "forest")}
    assert names == {f"forest/{p.name}" for p in plots}
    assert client.get_run(run_id).data.params["margin"] == "0.1"
    per_lab = pd.read_csv(tmp_path / "pooled" / "pooled_per_lab.csv")
    assert set(per_lab["lab"]) == {f.name for f in folders}


def test_recommend_follows_the_pooled_verdict(labs, tmp_path):
    from vitplast_tune.recommend.ranking import choose_criterion, read_evidence

    _, folders, design = labs
    result, _ = report.pool_folders(folders, tmp_path / "storage" / "pooled-all", design=design)
    better = [j for j in result.judged if j.claim.claim == "better" and decision(j.result) == "established"]
    assert {j.claim.predictor for j in better} == {"good", "plasticity_mean"}  # both the true accuracy, jittered
    criterion, why = choose_criterion(read_evidence(tmp_path / "storage"))
    assert criterion == max(better, key=lambda j: j.estimate).claim.predictor
    assert "pooled verdict pooled-all over 4 labs" in why and "after Holm" not in why


def test_pooled_from_kept_folders_on_the_command_line(labs, tmp_path, capsys):
    from vitplast_tune.cli.lab import lab_main

    _, folders, design = labs
    argv = ["pooled", "--from", *map(str, folders), "--design", str(design), "--out", str(tmp_path / "out")]
    assert lab_main(argv) == 0
    out = capsys.readouterr().out
    assert "good ranks the subsets better than log(#trainable parameters) across these 4 tasks" in out
    assert json.loads((tmp_path / "out" / "pooled.json").read_text())["family"] == 9


def test_the_analysis_reads_an_amendment_as_its_preregistration_with_the_tasks_it_adds(tmp_path):
    """s0's fourth qualifying task (digits_c-fog) was added by amendment 2: the analysis reads the amendment as the
    runner does (the file it amends, the tasks it adds), judges the same family, and refuses one whose base changed."""
    data = Path(__file__).resolve().parents[2] / "docs" / "results" / "data" / "lab-v2"
    amended, base = read_design(data / "amendment-2.yaml"), read_design(data / "preregistration.yaml")
    assert amended.family == base.family and amended.alpha == base.alpha and amended.margin == base.margin
    assert amended.candidate_tasks[: len(base.candidate_tasks)] == base.candidate_tasks
    assert "digits_c-fog" in amended.candidate_tasks and "digits_c-fog" not in base.candidate_tasks
    fog = read_kept(data / "checks" / "lab.s0.digits_c-fog")
    assert len(analysis.analyze_lab(fog, amended, n_boot=1000).singles) == 8
    with pytest.raises(UserError, match="not among the pre-registered tasks"):
        analysis.analyze_lab(fog, base, n_boot=1000)
    copy = tmp_path / "preregistration.yaml"
    copy.write_bytes((data / "preregistration.yaml").read_bytes() + b"\n# changed\n")
    (tmp_path / "amendment.yaml").write_bytes((data / "amendment-2.yaml").read_bytes())
    with pytest.raises(UserError, match="is not the file it amends"):
        read_design(tmp_path / "amendment.yaml")


def test_a_lab_is_judged_only_under_the_preregistration_it_ran_under(tmp_path):
    """Each kept lab of the registered run recorded the SHA-256 of the file it ran under (amendment 2): pooled or
    analysed under that file edited since, or under another (the pre-registration it amends), it is refused in one
    line naming the lab and both hashes, before any resample."""
    data = Path(__file__).resolve().parents[2] / "docs" / "results" / "data" / "lab-v2"
    lab = data / "lab.s0.digits_c-contrast"
    ran = json.loads((lab / "lab.json").read_text())["preregistration_sha256"]
    assert ran == read_design(data / "amendment-2.yaml").sha256
    (tmp_path / "preregistration.yaml").write_bytes((data / "preregistration.yaml").read_bytes())
    edited = tmp_path / "amendment-2.yaml"
    edited.write_bytes((data / "amendment-2.yaml").read_bytes() + b"\n# edited after the labs ran\n")
    said = f"lab lab.s0.digits_c-contrast ran under the pre-registration of SHA-256 {ran[:12]}, not "
    with pytest.raises(UserError, match=f"{said}{edited}"):
        report.pool_folders([lab], tmp_path / "pooled", design=edited)
    with pytest.raises(UserError, match=f"{said}{data / 'preregistration.yaml'}"):
        report.analyze_folder(lab, data / "preregistration.yaml")
    assert not (tmp_path / "pooled").exists()


def test_subsets_whose_resampled_accuracies_are_equal_tie_exactly():
    """On 359 test images an accuracy is no binary fraction: averaged as floats, two subsets with the same number of
    correct images over the drawn seeds differed in the last bit and got distinct ranks (29 of 2,000 resamples of
    s0's digits_c-snow check). Ranked as whole numbers of correct images they tie, as scipy ranks ties."""
    from scipy import stats

    folder = Path(__file__).resolve().parents[2] / "docs/results/data/lab-v2/checks/lab.s0.digits_c-snow"
    records = read_kept(folder)
    singles = ["ln1", "mha", "ln2", "fc1", "fc2"]
    grid = crossed.grid_of(records.trials, singles, select=records.select, correct=records.correct)
    _, values = crossed.targets(grid, 2000, crossed.stream(records.name, 0), draw_subsets=False)
    hits = values * records.correct.shape[1] * records.seeds  # correct images over the five drawn seeds
    np.testing.assert_allclose(hits, np.round(hits), atol=1e-3)
    whole = np.round(hits)
    assert (whole[:, :, None] == whole[:, None, :]).sum() > 2000 * 5 + 100  # ties occur, and often
    np.testing.assert_array_equal(stats.rankdata(values, axis=1), stats.rankdata(whole, axis=1))
    y = crossed.point(grid) * records.correct.shape[1] * records.seeds
    np.testing.assert_array_equal(y, np.round(y))


def test_a_claim_whose_holm_step_rests_on_an_undecided_earlier_step_is_undecided():
    """Holm rejects the 9th smallest p only if it rejects the 1st: when the 1st is within 3 Monte Carlo errors of its
    threshold (17 x 0.002 = 0.034, 3 errors 0.0161 reach 0.05), the 9th is undecided too, though its own corrected p
    (9 x 0.00378 = 0.034, 3 errors 0.0117) is not."""
    from vitplast_tune.analysis.verdicts import TestResult, decision

    n_boot = 20000
    p = np.array([0.002] + [0.0021] * 7 + [0.00378] + [0.5] * 8)
    se = np.sqrt(p * (1 - p) / n_boot)
    adjusted, errors, _, earlier = pooled._corrected(p, se, "holm", 0.05, 3.0)
    figures = dict(claim="better", subject="x", baseline="b", what="w", estimate=0.1, low=0.0, high=0.2, level=0.99)

    def said(i: int) -> str:
        got = TestResult(
            **figures, p=p[i], p_se=se[i], p_adjusted=adjusted[i], p_adjusted_se=errors[i], alpha=0.05,
            correction="holm", family=17, earlier_undecided=bool(earlier[i]),
        )  # fmt: skip
        return decision(got)

    assert said(0) == "undecided" and abs(adjusted[8] - 0.05) > 3 * errors[8]
    assert said(8) == "undecided" and said(9) == "not established"
    own = np.abs(17 * p - 0.05) <= 3 * 17 * se  # Bonferroni: each p against its own threshold only
    np.testing.assert_array_equal(pooled._corrected(p, se, "bonferroni", 0.05, 3.0)[3], own)
    assert own[0] and not own[-1]


def test_equal_p_values_rejected_together_get_one_interval_level():
    """Predictors that rank the single components alike have the same resamples, so the same p: Holm rejects them at
    the first one's step, and each interval is drawn at that step's share of alpha, not at the rank a sort gave it."""
    p = np.array([0.0001, 0.0001, 0.0001, 0.004, 0.5])
    _, _, shares, _ = pooled._corrected(p, np.zeros(5), "holm", 0.05)
    assert list(shares[:3]) == [1 / 5] * 3 and shares[3] == 1 / 2 and shares[4] == 1 / 5


def test_the_labs_for_80_percent_power_are_those_each_claim_needs(labs):
    """Searched labs by labs: the fewest whose normal-approximation power at alpha / family reaches 80%, to show
    "better" at a true difference of the margin and equivalence at a true 0 (the latter needs more)."""
    from scipy import stats

    _, folders, design_path = labs
    design = read_design(design_path)
    result = pooled.pool([analysis.analyze_lab(read_kept(f), design, n_boot=1000) for f in folders], design)
    z = stats.norm.ppf(1 - design.alpha / 9)
    for row in result.power.itertuples():
        var = row.se_pooled**2 * row.labs
        power = {
            "better": lambda n, var=var: stats.norm.cdf(design.margin / np.sqrt(var / n) - z),
            "equivalent": lambda n, var=var: 2 * stats.norm.cdf(design.margin / np.sqrt(var / n) - z) - 1,
        }
        fewest = {k: next(n for n in range(1, 10**5) if f(n) >= 0.8) for k, f in power.items()}
        assert (row.labs_for_80, row.equivalence_labs_for_80) == (fewest["better"], fewest["equivalent"])
    assert (result.power["equivalence_labs_for_80"] > result.power["labs_for_80"]).all()


def test_the_text_names_the_resampling_the_analysis_does(labs, tmp_path):
    """Seeds are drawn jointly whatever a file says, so a file asking otherwise is refused; a file that does not
    resample the test images is told so, not told they were drawn."""
    _, folders, _ = labs
    resampling = {"seeds": "joint", "test_images": "none", "resamples": 1000, "bootstrap_seed": 0}
    _, text = report.pool_folders(folders, tmp_path / "p", design=design_file(tmp_path / "a", resampling=resampling))
    assert "(seeds jointly, test images not resampled)" in text
    with pytest.raises(UserError, match="draws seeds jointly across subsets only"):
        read_design(design_file(tmp_path / "b", resampling=resampling | {"seeds": "within"}))


def test_a_claim_no_lab_could_judge_says_why(tmp_path):
    """contains_mha_or_fc is 0 on ln1 and ln2 only: on the five single components of a check, too many resamples draw
    a constant predictor, so its difference is undetermined in every lab: measured, not judged, and said so."""
    data = Path(__file__).resolve().parents[2] / "docs" / "results" / "data" / "lab-v2"
    design = read_design(data / "amendment-2.yaml")
    folders = [data / "checks" / f"lab.{m}.digits_c-contrast" for m in ("s0", "s1")]
    result = pooled.pool([analysis.analyze_lab(read_kept(f), design, n_boot=1000) for f in folders], design)
    untested = {j.claim.key: j.why_untested for j in result.judged if j.result is None}
    assert set(untested) == {"better:contains_mha_or_fc:pooled", "equivalent:contains_mha_or_fc:pooled"}
    assert all(why.startswith("undetermined") for why in untested.values())
    said = report.conclusions(result)
    assert any(
        s.startswith("Not tested, no lab could judge them: better:contains_mha_or_fc:pooled (undetermined")
        for s in said
    )


def test_labs_short_of_the_design_are_an_interim_look_with_figures_and_no_words(labs, tmp_path):
    """The design judges its family once, on ``tasks_per_model`` labs of each model: fewer are an interim look, whose
    figures are printed and kept but whose words, verdicts and recommendation are withheld."""
    from vitplast_tune.recommend.ranking import choose_criterion, read_evidence

    _, folders, _ = labs
    design = design_file(tmp_path / "short", tasks_per_model=2)  # m0 has 3 labs here, m1 has 1
    result, text = report.pool_folders(folders, tmp_path / "storage" / "interim", design=design)
    assert (
        result.interim
        == "these 4 labs are not the 4 the pre-registration judges once (2 tasks on each of its 2 models; m0 has 3, m1 has 1)"
    )
    said = text.split(report.SAYS)[1]
    assert "Interim, figures only" in said and "ranks the subsets" not in said and "not shown" not in said
    assert "established" not in text.split(report.SAYS)[0].split("The pre-registered family")[1]
    payload = json.loads((tmp_path / "storage" / "interim" / "pooled.json").read_text())
    assert payload["complete"] is False and {r["verdict"] for r in payload["claims"]} == {"interim"}
    criterion, why = choose_criterion(read_evidence(tmp_path / "storage"))
    assert criterion == "log_trainable_params" and "no pooled criteria-lab verdict" in why
    whole = design_file(tmp_path / "whole", models={"m0": "model0"}, tasks_per_model=3)
    result, text = report.pool_folders(folders[:3], tmp_path / "whole-out", design=whole)
    assert result.interim == "" and "good ranks the subsets better" in text.split(report.SAYS)[1]
    assert "across these 3 tasks (t0, t1, t2) on 1 model (model0)" in text
