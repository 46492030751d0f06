"""recommend: evidence read from stored searches, the criterion chosen from it, the ranking within a budget;
verify: the verdict."""

import json
import math

import pandas as pd
import pytest

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.recommend import ranking, verify
from vitplast_tune.storage import SEARCH_FILE


def _search(root, name, model="m", dataset="d", criteria=None, correlations=None):
    directory = root / name
    (directory / "analysis").mkdir(parents=True)
    (directory / SEARCH_FILE).write_text(json.dumps({"settings": {"model": model, "dataset": dataset}}))
    if criteria is not None:
        pd.DataFrame(criteria).to_csv(directory / "analysis" / "criteria.csv", index=False)
    if correlations is not None:
        pd.DataFrame(correlations).to_csv(directory / "analysis" / "correlations.csv", index=False)


def _row(predictor, spearman, target=None):
    row = {
        "predictor": predictor,
        "spearman": spearman,
        "spearman_low": spearman - 0.2,
        "spearman_high": spearman + 0.2,
        "n": 31,
    }
    return row if target is None else {"target": target, **row}


def _pooled(root, name, rows, labs=(("s0", "digits_c:contrast"), ("s0", "fractals_novel"), ("s1", "fractals_novel"))):
    directory = root / name
    directory.mkdir(parents=True)
    payload = {
        "labs": [{"lab": f"lab.{m}.{d}", "model": m, "dataset": d, "task": d} for m, d in labs],
        "predictors": [
            {"predictor": p, "diff": diff, "low": diff - 0.1, "high": diff + 0.1, "verdict": verdict}
            for p, diff, verdict in rows
        ],
    }
    (directory / "pooled.json").write_text(json.dumps(payload))


def test_without_a_pooled_verdict_the_parameter_count_ranks(tmp_path):
    evidence = ranking.read_evidence(tmp_path)
    assert evidence.empty
    criterion, why = ranking.choose_criterion(evidence, "m", "d")
    assert criterion == "log_trainable_params" and "no pooled criteria-lab verdict" in why
    _search(
        tmp_path, "lab", criteria=[dict(_row("auto_rgn", 0.9), verdict="better"), _row("log_trainable_params", 0.3)]
    )
    _search(tmp_path, "tpe", correlations=[_row("plasticity_max", 0.9, "val_acc"), _row("plasticity_mean", 0.95, "x")])
    lab_dir = tmp_path / "lab.s0.digits"
    (lab_dir / "analysis").mkdir(parents=True)
    (lab_dir / "lab.json").write_text(json.dumps({"model": "m", "dataset": "d"}))
    pd.DataFrame([dict(_row("grad_norm", 0.8), verdict="better")]).to_csv(lab_dir / "analysis" / "criteria.csv")
    evidence = ranking.read_evidence(tmp_path)
    assert set(evidence["source"]) == {"lab", "trials"} and set(evidence["search"]) == {"lab", "tpe", "lab.s0.digits"}
    assert len(evidence[evidence["search"] == "tpe"]) == 1  # only final validation accuracy of per-trial tables
    criterion, why = ranking.choose_criterion(evidence, "m", "d")  # one task's "better" backs nothing on its own
    assert criterion == "log_trainable_params" and "2 criteria lab(s) recorded, each on one task" in why


def test_a_pooled_verdict_backs_the_criterion_it_found_better_and_says_where_it_came_from(tmp_path):
    _pooled(tmp_path, "pooled-small", [("grad_norm", 0.2, "better")], labs=(("s0", "digits_c:contrast"),))
    _pooled(tmp_path, "pooled", [("grad_norm", 0.05, "no clear difference"), ("auto_rgn", 0.12, "better")])
    evidence = ranking.read_evidence(tmp_path)
    pooled = evidence[evidence["search"] == "pooled"]
    assert set(pooled["criterion"]) == {"grad_norm", "auto_rgn"} and set(pooled["n"]) == {3}
    criterion, why = ranking.choose_criterion(evidence, "s1", "fractals_novel")  # the verdict over the most labs
    assert criterion == "auto_rgn" and "+0.12 [+0.02, +0.22] (at the family's corrected level)" in why
    assert "over 3 labs (s0 / digits_c:contrast; s0 / fractals_novel; s1 / fractals_novel)" in why
    assert "this model and dataset are among them" in why
    _, why = ranking.choose_criterion(evidence, "vit_base_patch16_224", "cifar100")
    assert "this model or dataset is not among them" in why
    columns = [
        "components",
        "trainable_params",
        "auto_rgn",
        "plasticity_mean",
        "in_network_mean",
        "log_trainable_params",
    ]
    ranked = pd.DataFrame([["fc1", 100, 0.1, 1.0, 1.0, 4.6]], columns=columns).assign(rank=1)
    rec = ranking.Recommendation("s1", "fractals_novel", ranked, criterion, evidence)
    text = ranking.describe(rec)
    assert "auto_rgn               diff +0.12 [+0.02, +0.22] better" in text and "pooled pooled over 3 labs" in text


def test_a_pooled_verdict_without_a_better_criterion_ranks_by_the_parameter_count(tmp_path):
    _pooled(tmp_path, "pooled", [("plasticity_max", 0.03, "no clear difference"), ("auto_rgn", -0.4, "worse")])
    criterion, why = ranking.choose_criterion(ranking.read_evidence(tmp_path), "s0", "fractals_novel")
    assert criterion == "log_trainable_params"
    assert why.startswith(
        "no criterion was shown to rank the subsets better than the parameter count in the pooled verdict"
    )


def test_a_lab_at_several_budgets_is_read_at_its_longest(tmp_path):
    short = [dict(_row("grad_norm", 0.9), budget=150), dict(_row("plasticity_max", 0.2), budget=150)]
    long = [dict(_row("grad_norm", 0.1), budget=600), dict(_row("plasticity_max", 0.5), budget=600)]
    _search(tmp_path, "lab", criteria=short + long)
    evidence = ranking.read_evidence(tmp_path)
    assert len(evidence) == 2 and set(evidence["spearman"]) == {0.1, 0.5}


def test_rank_within_a_budget_breaks_ties_by_fewer_parameters():
    scores = pd.DataFrame(
        {
            "components": ["fc1", "mha", "all", "ln1", "emb"],
            "trainable_params": [150, 150, 900, 10, 5],
            "plasticity_mean": [2.0, 1.5, 1.5, 0.5, float("nan")],
        }
    )
    ranked = ranking.rank(scores, "plasticity_mean")
    assert list(ranked["components"]) == ["fc1", "mha", "all", "ln1"] and list(ranked["rank"]) == [1, 2, 3, 4]
    assert list(ranking.rank(scores, "plasticity_mean", budget=200)["components"]) == ["fc1", "mha", "ln1"]


def _rec(order):
    ranked = pd.DataFrame({"components": order})
    return ranking.Recommendation("m", "d", ranked, "plasticity_mean", pd.DataFrame())


def test_verification_takes_the_best_validation_lr_and_judges_the_top_subset():
    trials = pd.DataFrame(
        {
            "components": ["fc1", "fc1", "mha", "mha", "ln1", "ln1", "all", "head"],
            "lr": [0.1, 0.3, 0.1, 0.3, 0.1, 0.3, 0.1, 0.3],
            "best_val_acc": [0.95, 0.97, 0.96, 0.90, 0.80, 0.85, 0.99, 0.70],
            "test_acc": [0.94, 0.96, 0.95, 0.91, 0.81, 0.84, 0.98, 0.72],
            "trainable_params": [150, 150, 150, 150, 10, 10, 900, 5],
        }
    )
    table = verify.verification(_rec(["fc1", "mha", "ln1"]), trials, 3)
    fc1 = table.set_index("components").loc["fc1"]
    assert fc1["lr"] == 0.3 and fc1["test_acc"] == 0.96 and fc1["predicted_rank"] == 1 and fc1["actual_rank"] == 2
    text = verify.verdict(table)
    assert "the recommendation held" in text and "Spearman +1.00" in text and "vs all: -2.00 points" in text
    worse = verify.verdict(verify.verification(_rec(["ln1", "mha", "fc1"]), trials, 3))
    assert "did NOT hold" in worse and "Spearman -1.00" in worse
    assert "the best configuration was all (98.00%), predicted rank -" in text


def test_verify_space_is_a_grid_of_the_top_subsets_all_and_head(tmp_path):
    from vitplast_tune.space import load_space

    rec = _rec(["fc1", "mha+fc1", "emb", "mha"])
    rec.settings = FinetuneConfig(model="vit_testbed_patch8_32.fractal", dataset="digits", batch_size=64, max_steps=400)
    spec = load_space(verify.verify_space(rec, 3, tmp_path, max_steps=100))
    assert spec.algorithm == "grid" and spec.defaults["max_steps"] == 100
    assert [c["components"] for c in spec.grid[::3]] == ["fc1", "mha+fc1", "emb", "all", "head"]


def measured_testbed(folder):
    """The plasticity report of the testbed ViT (no head, as measured), its fc1 ten times as plastic."""
    from vitplast_tune import components, freezing
    from vitplast_tune.predictors import report, scores
    from vitplast_tune.vit import models
    from vitplast_tune.vit.families.registry import layout_of

    model = models.create_model("vit_testbed_patch8_32", 0, pretrained=False)  # as measured: no head
    counts = freezing.count_parameters(model, layout=layout_of(model))
    rows = [{"component": "emb", "layer": 0, "plasticity": 0.5}]
    rows += [
        {"component": c, "layer": i, "plasticity": (i + 1) * (10 if c == "fc1" else 1)}
        for c in components.BLOCK_COMPONENTS
        for i in range(4)
    ]
    table = pd.DataFrame(rows)
    meta = {
        "component_params": counts,
        "parameter_summary": freezing.parameter_summary(model, layout=layout_of(model)),
    }
    return report.PlasticityReport(table, scores.aggregate_plasticity(table), folder, meta=meta)


def test_subset_scores_count_methods_and_depth_as_a_run_trains_them(tmp_path):
    from vitplast_tune import components
    from vitplast_tune.config import trial_config
    from vitplast_tune.predictors import report
    from vitplast_tune.vit.methods import trainable_parameters

    measured = measured_testbed(tmp_path)
    settings = FinetuneConfig(model="vit_testbed_patch8_32", pretrained=False, depth="last", lora_rank=4)
    subsets = ["mha:lora", "mha", "fc1:bitfit+emb", "all"]
    scored = ranking.subset_scores(report.Predictors(measured), settings, subsets=subsets).set_index("components")
    for subset in subsets:
        real = trainable_parameters(trial_config({"components": subset}, settings))  # a real model, LoRA injected
        assert scored.loc[components.subset_name(subset), "trainable_params"] == real, subset
    assert scored.loc["mha:lora", "plasticity_mean"] == 4.0  # the last block's layer only
    assert scored.loc["emb+fc1:bitfit", "plasticity_max"] == 40.0
    everywhere = ranking.subset_scores(report.Predictors(measured), FinetuneConfig(), subsets=["mha"])
    assert everywhere["plasticity_mean"].iloc[0] == 2.5  # the mean over the four layers


def test_recommend_the_search_table_and_its_analysis_show_one_log10_of_a_parameter_count(tmp_path):
    """The baseline recommend ranks by, the trial table's log10_trainable_params and the analysis' baseline of the
    same count are one number, its base-10 log."""
    from types import SimpleNamespace

    from vitplast_tune.analysis.prediction import analyze_trials
    from vitplast_tune.predictors import report
    from vitplast_tune.predictors.scores import BASELINE
    from vitplast_tune.records.table import trial_table

    settings = FinetuneConfig(model="vit_testbed_patch8_32", pretrained=False)
    scored = ranking.subset_scores(report.Predictors(measured_testbed(tmp_path)), settings, subsets=["mha"]).iloc[0]
    count = int(scored["trainable_params"])
    assert scored[BASELINE] == pytest.approx(math.log10(count))
    metrics = {"trial_id": "t1", "trainable_params": count, "best_val_acc": 0.9, "val_acc": 0.9, "step": 10}
    grid = [SimpleNamespace(config={"components": "mha", "lr": 0.1, "max_steps": 10}, metrics=metrics, error=None,
                            metrics_dataframe=None)]  # fmt: skip
    trials = trial_table(grid, settings)
    assert trials.loc[0, "log10_trainable_params"] == scored[BASELINE]
    analyze_trials(trials, tmp_path / "analysis", n_boot=10)
    analyzed = pd.read_csv(tmp_path / "analysis" / "finished_trials.csv")
    assert analyzed.loc[0, BASELINE] == pytest.approx(scored[BASELINE], rel=1e-15)
