"""recommend: evidence read from stored searches, the criterion chosen from it, the ranking within a budget;
verify: the verdict."""

import json

import pandas as pd

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


def test_no_evidence_ranks_by_the_papers_criterion(tmp_path):
    evidence = ranking.read_evidence(tmp_path)
    assert evidence.empty
    criterion, why = ranking.choose_criterion(evidence, "m", "d")
    assert criterion == "plasticity_mean" and "no evidence yet" in why


def test_lab_evidence_on_the_same_model_wins_over_per_trial_correlations(tmp_path):
    _search(
        tmp_path,
        "lab",
        criteria=[_row("auto_rgn", 0.6), _row("plasticity_mean", 0.1), _row("log_trainable_params", 0.3)],
    )
    _search(
        tmp_path,
        "tpe",
        correlations=[_row("plasticity_max", 0.9, "val_acc"), _row("plasticity_mean", 0.95, "val_acc_common")],
    )
    _search(tmp_path, "other-lab", model="big", criteria=[_row("grad_norm", 0.99)])
    evidence = ranking.read_evidence(tmp_path)
    assert set(evidence["source"]) == {"lab", "trials"}
    assert len(evidence[evidence["search"] == "tpe"]) == 1  # only final validation accuracy of per-trial tables
    criterion, why = ranking.choose_criterion(evidence, "m", "d")
    assert criterion == "auto_rgn" and "+0.60" in why and "criteria labs on m / d" in why
    criterion, _ = ranking.choose_criterion(evidence, "m", "other")  # no lab here: any lab beats per-trial evidence
    assert criterion == "grad_norm"


def test_a_lab_at_several_budgets_is_read_at_its_longest(tmp_path):
    short = [dict(_row("grad_norm", 0.9), budget=150), dict(_row("plasticity_max", 0.2), budget=150)]
    long = [dict(_row("grad_norm", 0.1), budget=600), dict(_row("plasticity_max", 0.5), budget=600)]
    _search(tmp_path, "lab", criteria=short + long)
    evidence = ranking.read_evidence(tmp_path)
    assert len(evidence) == 2 and set(evidence["spearman"]) == {0.1, 0.5}
    criterion, why = ranking.choose_criterion(evidence, "m", "d")
    assert criterion == "plasticity_max" and "+0.50" in why


def test_negative_evidence_is_said(tmp_path):
    _search(tmp_path, "lab", criteria=[_row("auto_rgn", -0.3), _row("plasticity_mean", -0.1)])
    criterion, why = ranking.choose_criterion(ranking.read_evidence(tmp_path), "m", "d")
    assert criterion == "plasticity_mean" and "treat the ranking as a guess" in why


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


def test_subset_scores_count_methods_and_depth_as_a_run_trains_them(tmp_path):
    from vitplast_tune import components
    from vitplast_tune.config import trial_config
    from vitplast_tune.predictors import report, scores
    from vitplast_tune.vit import models
    from vitplast_tune.vit.families.registry import layout_of
    from vitplast_tune.vit.methods import trainable_parameters

    model = models.create_model("vit_testbed_patch8_32", 0, pretrained=False)  # as measured: no head
    counts = components.count_parameters(model, layout=layout_of(model))
    rows = [{"component": "emb", "layer": 0, "plasticity": 0.5}]
    rows += [
        {"component": c, "layer": i, "plasticity": (i + 1) * (10 if c == "fc1" else 1)}
        for c in components.BLOCK_COMPONENTS
        for i in range(4)
    ]
    table = pd.DataFrame(rows)
    meta = {
        "component_params": counts,
        "parameter_summary": components.parameter_summary(model, layout=layout_of(model)),
    }
    measured = report.PlasticityReport(table, scores.aggregate_plasticity(table), tmp_path, meta=meta)
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


def test_a_lab_verdict_decides_over_a_higher_spearman_within_the_noise(tmp_path):
    """A lab that found no predictor clearly better than the parameter count ranks by the parameter count, even
    where another predictor's point estimate is a little higher (as in the shipped lab at 600 steps)."""
    tied = [
        dict(_row("contains_mha_or_fc", 0.51), verdict="no clear difference"),
        dict(_row("auto_rgn", 0.0), verdict="worse"),
        dict(_row("log_trainable_params", 0.49), verdict=None),
    ]
    _search(tmp_path, "lab", criteria=tied)
    criterion, why = ranking.choose_criterion(ranking.read_evidence(tmp_path), "m", "d")
    assert criterion == "log_trainable_params" and "no criterion ranked the subsets clearly better" in why
    assert "+0.49" in why
    better = [dict(_row("plasticity_max", 0.7), verdict="better"), *tied]
    _search(tmp_path, "lab2", criteria=better)
    criterion, _ = ranking.choose_criterion(ranking.read_evidence(tmp_path), "m", "d")
    assert criterion == "log_trainable_params"  # better in one lab only: not in every lab that judged it
    (tmp_path / "lab" / "analysis" / "criteria.csv").unlink()
    criterion, why = ranking.choose_criterion(ranking.read_evidence(tmp_path), "m", "d")
    assert criterion == "plasticity_max" and "clearly better than log(#trainable params)" in why and "+0.70" in why
