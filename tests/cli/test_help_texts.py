"""What two commands say matches what they do (issue 57): ``recommend --help`` names what it ranks by when no pooled
verdict backs a criterion (the trainable parameters, as its ranking does), and ``vitplast plasticity`` says why
``emb`` has no rank instead of printing ``<NA>``."""

from __future__ import annotations

import pandas as pd

from vitplast_tune.cli import plasticity, recommend
from vitplast_tune.predictors.scores import BASELINE, aggregate_plasticity
from vitplast_tune.recommend.ranking import choose_criterion, read_evidence


def test_recommend_s_help_says_it_ranks_by_trainable_parameters_as_its_ranking_does(tmp_path):
    criterion, why = choose_criterion(read_evidence(tmp_path))  # nothing recorded: no verdict backs a criterion
    assert criterion == BASELINE == "log_trainable_params" and "parameter count" in why
    said = " ".join(recommend.parser().format_help().split())
    assert "rank every subset by its number of trainable parameters" in said and "pooled criteria-lab verdict" in said
    assert "best evidence" not in said and "trainable parameters" in recommend.HELP


def test_plasticity_prints_no_na_and_says_why_emb_has_no_rank():
    table = pd.DataFrame(
        {"component": ["emb", "mha", "mha", "fc1", "fc1"], "layer": [0, 0, 1, 0, 1], "plasticity": [9.0, 1, 2, 3, 4]}
    )
    ranking = aggregate_plasticity(table)
    assert ranking["rank"].isna().tolist() == [True, False, False]  # emb: another scale, no rank
    text = plasticity.ranking_text(ranking)
    assert "<NA>" not in text and text.splitlines()[1].split()[-1] == "-"
    assert text.splitlines()[-1].startswith("(emb has no rank: its ratio is measured from the pixels")
    assert "emb has no rank" not in plasticity.ranking_text(ranking[ranking["component"] != "emb"])
