"""The samplers a space file names (``sampler:``), from one registry: each one searches a small space through the
search's own searcher, those that cannot search a space refuse it in one line, and adding one is one entry."""

from __future__ import annotations

import logging
import pickle

import optuna
import pytest

from vitplast_tune.components import parse_subset
from vitplast_tune.errors import UserError
from vitplast_tune.run import OptunaSearcher, search_algorithm
from vitplast_tune.space import OptunaSpace, load_space, samplers
from vitplast_tune.space.objectives import with_objective

SPACE = """
metric: {metric}
mode: {mode}
algorithm: {algorithm}
sampler: {sampler}
num_samples: 12
baselines: {{rates: 0}}
parameters:
  components: {components}
  lr: {lr}
"""
BUILT = {
    "tpe": optuna.samplers.TPESampler,
    "tpe-multivariate": optuna.samplers.TPESampler,
    "gp": optuna.samplers.GPSampler,
    "cmaes": optuna.samplers.CmaEsSampler,
    "random": optuna.samplers.RandomSampler,
    "qmc": optuna.samplers.QMCSampler,
    "grid": optuna.samplers.GridSampler,
}


def space(tmp_path, sampler, components="{subsets: any}", lr="{loguniform: [0.001, 1.0]}", **keys):
    path = tmp_path / "space.yaml"
    keys = {"metric": "val_acc", "mode": "max", "algorithm": "optuna", **keys}
    path.write_text(SPACE.format(sampler=sampler, components=components, lr=lr, **keys))
    return load_space(path)


def search(spec, trials: int) -> tuple[OptunaSearcher, list[dict]]:
    """Suggest and complete ``trials`` trials, each scored by its rate; the searcher and the configs."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    searcher, configs = search_algorithm(spec, seed=0), []
    for i in range(trials):
        configs.append(searcher.suggest(f"t{i}"))
        searcher.on_trial_complete(f"t{i}", {"val_acc": -abs(configs[-1]["lr"] - 0.1)})
    return searcher, configs


@pytest.mark.parametrize("name", list(BUILT))
def test_each_registered_sampler_searches_a_small_space(tmp_path, name, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("ray"), "handlers", [caplog.handler])  # Ray's own logger does not propagate
    components = {"cmaes": "mha", "grid": "{choice: [mha, fc1]}"}.get(name, "{subsets: any}")  # cmaes: numbers only
    lr = "{choice: [0.01, 0.1, 1.0]}" if name == "grid" else "{loguniform: [0.001, 1.0]}"
    spec = space(tmp_path, name, components, lr)
    searcher, configs = search(spec, 12)  # past TPE's and GP's 10 random startup trials: their models fit
    sampler = searcher._ot_study.sampler
    assert type(sampler) is BUILT[name] or isinstance(sampler, BUILT[name])
    assert all(0.001 <= c["lr"] <= 1.0 and parse_subset(c["components"]) for c in configs)
    assert len({(c["components"], c["lr"]) for c in configs}) > 1
    pickle.loads(pickle.dumps(sampler))  # Tune saves the searcher with its sampler
    if name == "grid":  # every point of the 6 once, then again (Optuna's grid would stop the study: Ray asks and tells)
        assert not [r for r in caplog.records if "Study.stop" in r.getMessage()]
        assert len({(c["components"], c["lr"]) for c in configs[:6]}) == 6 and {c["lr"] for c in configs} <= {
            0.01,
            0.1,
            1,
        }


def test_the_default_sampler_is_todays_seeded_tpe(tmp_path):
    spec = space(tmp_path, "tpe")
    assert space(tmp_path, "tpe").sampler == samplers.DEFAULT == "tpe"
    _, configs = search(spec, 12)
    today = OptunaSearcher(
        space=OptunaSpace(spec.parameters), metric="val_acc", mode="max", sampler=optuna.samplers.TPESampler(seed=0)
    )
    for i, config in enumerate(configs):
        assert today.suggest(f"t{i}") == config
        today.on_trial_complete(f"t{i}", {"val_acc": -abs(config["lr"] - 0.1)})


def test_a_sampler_that_cannot_search_the_space_refuses_it_in_one_line(tmp_path):
    with pytest.raises(UserError, match='unknown sampler "tpee" \\(did you mean "tpe"\\?\\); use one of tpe, tpe-mul'):
        space(tmp_path, "tpee")
    with pytest.raises(UserError, match="sampler cmaes needs numbers, and components is a category"):
        space(tmp_path, "cmaes")
    with pytest.raises(UserError, match="sampler cmaes optimises one objective"):
        space(tmp_path, "cmaes", "mha", metric="[val_acc, trainable_params]", mode="[max, min]")
    with pytest.raises(UserError, match="sampler cmaes optimises one objective"):
        with_objective(space(tmp_path, "cmaes", "mha"), "pareto")
    with pytest.raises(UserError, match="sampler grid needs discrete parameters, and lr is a range"):
        space(tmp_path, "grid")
    with pytest.raises(UserError, match="sampler gp needs algorithm: optuna, not random"):
        space(tmp_path, "gp", algorithm="random")
    assert space(tmp_path, "gp", metric="[val_acc, trainable_params]", mode="[max, min]").multi_objective


def test_a_new_sampler_is_one_entry(tmp_path, monkeypatch):
    monkeypatch.setattr(samplers, "SAMPLERS", dict(samplers.SAMPLERS))  # the entry leaves with the test
    samplers.register("nsga2", samplers.Sampler(lambda seed, parameters: optuna.samplers.NSGAIISampler(seed=seed)))
    spec = space(tmp_path, "nsga2")
    searcher, configs = search(spec, 3)
    assert isinstance(searcher._ot_study.sampler, optuna.samplers.NSGAIISampler) and len(configs) == 3
