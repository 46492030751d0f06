import re
from pathlib import Path

import optuna
import pytest

from vitplast_tune.components import (
    COMPONENTS,
    component_flag,
    component_flags,
    component_methods,
    method_flag,
    parse_subset,
)
from vitplast_tune.errors import UserError
from vitplast_tune.records.table import trial_subset
from vitplast_tune.run.variants import grid_points, tune_param_space
from vitplast_tune.space import LogUniform, Methods, OptunaSpace, RandInt, Subsets, load_space

VALID = """
metric: val_acc
mode: max
algorithm: {algorithm}
num_samples: 3
scheduler: {{name: asha, grace_period: 20, reduction_factor: 2}}
parameters:
{parameters}
defaults: {{max_steps: 40}}
"""


def write_space(
    tmp_path,
    parameters="  components: {subsets: any}\n  lr: {loguniform: [1.0e-3, 1.0]}",
    algorithm="optuna",
    text=None,
):
    path = tmp_path / "space.yaml"
    path.write_text(text if text is not None else VALID.format(parameters=parameters, algorithm=algorithm))
    return path


SHIPPED = [
    "component_subsets",
    "paper_grid",
    "single_component",
    "criteria_lab",
    "where_and_how",
    "where_and_how_grid",
    "lora_vs_full",
]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_spaces_load(name):
    spec = load_space(name)
    assert spec.metric == "val_acc" and spec.mode == "max"
    assert spec.parameters and spec.total_trials >= 1


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_spaces_leave_defaults_to_the_training_config(name):
    from vitplast_tune.vit.training import FinetuneConfig

    base = FinetuneConfig().to_dict()
    spec = load_space(name)
    repeated = {k: v for k, v in spec.defaults.items() if base.get(k) == v}
    assert not repeated, f"{name} repeats FinetuneConfig defaults {repeated}: one source of defaults"


def test_paper_grid_is_the_papers_protocol():
    spec = load_space("paper_grid")
    assert spec.algorithm == "grid"
    assert set(spec.parameters["components"].values) == {"all", "mha", "fc1", "fc2", "ln2", "ln1", "head"}
    assert spec.parameters["lr"].values == (1e-3, 3e-3, 1e-2, 3e-2)
    assert spec.parameters["seed"].values == (0, 42, 3407)
    assert spec.total_trials == 7 * 4 * 3
    assert len({tuple(c.items()) for c in spec.grid}) == 84


def test_component_subsets_space_is_optuna_with_asha():
    spec = load_space("component_subsets")
    assert spec.algorithm == "optuna" and spec.scheduler.name == "asha"
    assert isinstance(spec.parameters["components"], Subsets)
    lr = spec.parameters["lr"]
    assert isinstance(lr, LogUniform) and lr.low <= 1e-3 and lr.high >= 1.0


def test_distributions_know_their_corners_and_forms(tmp_path):
    path = write_space(
        tmp_path,
        "  components: {choice: [mha, all]}\n  lr: {loguniform: [0.01, 1.0]}\n  batch_size: {randint: [8, 16]}\n"
        "  optimizer: adamw",
        "random",
    )
    spec = load_space(path)
    params = spec.parameters
    assert isinstance(params["batch_size"], RandInt) and params["batch_size"].corners() == [8, 16]
    assert params["lr"].corners() == [0.01, 1.0] and params["optimizer"].corners() == ["adamw"]
    assert spec.example() == {"components": "mha", "lr": 0.01, "batch_size": 8, "optimizer": "adamw"}
    corners = spec.corner_configs()
    assert {c["components"] for c in corners} == {"mha", "all"} and {c["lr"] for c in corners} == {0.01, 1.0}
    assert {c["batch_size"] for c in corners} == {8, 16}
    domain = tune_param_space(spec)["batch_size"]
    assert domain.lower == 8 and domain.upper == 17  # Tune's randint excludes its upper bound
    with pytest.raises(UserError, match="range"):
        params["lr"].grid_values()


def test_optuna_space_samples_booleans_and_never_an_empty_subset():
    spec = load_space("component_subsets")
    space = OptunaSpace(spec.parameters)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(200):
        trial = study.ask()
        constants = space(trial)
        subset = constants["components"]
        assert parse_subset(subset), "empty subset sampled"
        flags = {c: trial.params.get(component_flag(c), constants.get(component_flag(c))) for c in COMPONENTS}
        assert all(isinstance(v, bool) for v in flags.values())
        assert set(parse_subset(subset)) == {c for c, on in flags.items() if on}
        assert 1e-3 <= trial.params["lr"] <= 1.0
        seen.add(subset)
        study.tell(trial, 0.5)
    assert len(seen) > 40  # the sampler reaches most of the 63 subsets


def test_grid_expands_subsets_and_choices(tmp_path):
    path = write_space(
        tmp_path, "  components: {choice: [[mha], fc1+ln1, all, head]}\n  lr: {choice: [0.1, 0.3]}", "grid"
    )
    spec = load_space(path)
    assert spec.parameters["components"].values == ("mha", "ln1+fc1", "all", "head")
    assert spec.total_trials == 4 * 2 * 3
    assert tune_param_space(spec)["lr"] == {"grid_search": [0.1, 0.3]}


def test_random_space_uses_tune_domains(tmp_path):
    from ray import tune

    spec = load_space(write_space(tmp_path, algorithm="random"))
    space = tune_param_space(spec)
    assert isinstance(space["lr"], tune.search.sample.Float)
    assert len(space["components"].categories) == 63


@pytest.mark.parametrize(
    "parameters, algorithm, message",
    [
        ("  components: {subsets: any}\n  lr: {loguniform: [0, 1.0]}", "optuna", "loguniform range must be positive"),
        ("  components: {subsets: any}\n  lr: {uniform: [0.5, 0.1]}", "optuna", "empty or inverted"),
        ("  components: [mha, mlp]\n  lr: 0.1", "optuna", 'unknown component "mlp"'),
        ("  components: []\n  lr: 0.1", "optuna", "empty or malformed component subset"),
        ("  components: {choice: [mha, []]}\n  lr: 0.1", "optuna", "empty or malformed component subset"),
        ("  components: {subsets: any}\n  lr: {loguniform: [1.0e-3, 1.0]}", "grid", "a grid needs discrete parameters"),
        ("  components: {subsets: any}\n  lr: {logunifrom: [1.0e-3, 1.0]}", "optuna", 'did you mean "loguniform"'),
        ("  components: {subsets: any}\n  lr: {loguniform: [1.0e-3, 1.0]}", "optunaa", 'unknown algorithm "optunaa"'),
        ("  lr: [0.1, 0.2]", "optuna", r"write \{choice: \[\.\.\.\]\}"),
        ("  components: {methods: {ln1: [full, lora]}}", "optuna", 'component ln1 cannot train by "lora"'),
        ("  components: {methods: {mlp: lora}}", "optuna", 'unknown component "mlp"'),
        ("  components: {methods: {all: lora}}", "optuna", 'names each component, not "all"'),
        ("  components: {methods: [mha, lora]}", "optuna", "needs a mapping of component to method"),
        ("  lr: {methods: {mha: lora}}", "optuna", 'only applies to "components"'),
        ("  depth: {choice: [first, lats]}", "grid", 'unknown depth "lats"'),
        ("  depth: {contiguous: 0}", "grid", "number of blocks N"),
        ("  blocks: {contiguous: 4}", "grid", 'only applies to "depth"'),
    ],
)
def test_bad_spaces_raise_clear_errors(tmp_path, parameters, algorithm, message):
    with pytest.raises(UserError, match=message):
        load_space(write_space(tmp_path, parameters, algorithm))


def test_unknown_top_level_key_suggests(tmp_path):
    text = VALID.format(parameters="  lr: 0.1", algorithm="optuna").replace("num_samples", "num_sample")
    with pytest.raises(UserError, match='unknown key "num_sample" \\(did you mean "num_samples"\\?\\)'):
        load_space(write_space(tmp_path, text=text))


def test_malformed_yaml_names_the_line(tmp_path):
    with pytest.raises(UserError, match=r"malformed YAML at line \d"):
        load_space(write_space(tmp_path, text="metric: val_acc\nmode: [max\nparameters: {}\n"))


SPACE = VALID.format(parameters="  lr: 0.1", algorithm="optuna")
# The "billion laughs" in a description, at 10^5 leaves (10^9 with 9 levels): the text it became was 1 MB.
LAUGHS = "description: [&l0 lol, " + ", ".join(f"&l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 6)) + "]\n"


@pytest.mark.parametrize(
    "content, message",
    [
        (SPACE.replace("mode: max", "mode: max  # caf\xe9").encode("latin-1"), r"byte 33 \(0xe9\) is not UTF-8"),
        ((SPACE + LAUGHS).encode(), r"at line 10: an alias \(\*l0\), which this file"),
        (SPACE.encode() + b"#" * 2**20, r"over 1,048,576 bytes, more than a space file holds"),
        (b"parameters: " + b"[" * 5000 + b"]" * 5000, "nested too deeply to be a space file"),
    ],
    ids=["not UTF-8", "aliases", "too large", "too deep"],
)
def test_a_space_file_is_read_within_bounds_in_one_line_naming_where(tmp_path, content, message):
    """A traceback before (UnicodeDecodeError, RecursionError), or the aliases expanded, the whole file read."""
    path = tmp_path / "space.yaml"
    path.write_bytes(content)
    with pytest.raises(UserError, match=f"^{re.escape(str(path))}: .*{message}") as refused:
        load_space(path)
    assert "\n" not in str(refused.value)


def test_unknown_scheduler_and_missing_space(tmp_path):
    text = VALID.format(parameters="  lr: 0.1", algorithm="optuna").replace("name: asha", "name: hyperband")
    with pytest.raises(UserError, match='unknown scheduler "hyperband"'):
        load_space(write_space(tmp_path, text=text))
    with pytest.raises(
        UserError, match='search space "component_subset" not found \\(did you mean "component_subsets"'
    ):
        load_space("component_subset")


def test_fingerprint_follows_the_file(tmp_path):
    path = write_space(tmp_path)
    first = load_space(path).fingerprint
    path.write_text(path.read_text().replace("num_samples: 3", "num_samples: 4"))
    assert load_space(path).fingerprint != first


def test_component_flags_and_config_components():
    assert component_flags("mha+fc1") == {
        "train_emb": False,
        "train_ln1": False,
        "train_mha": True,
        "train_ln2": False,
        "train_fc1": True,
        "train_fc2": False,
    }
    assert trial_subset({"components": "fc1+mha"}) == "mha+fc1"
    assert trial_subset({}) == "all"


def test_the_guides_complete_example_is_a_valid_space(tmp_path):
    readme = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "spaces.md").read_text()
    block = readme.split("A complete example, every key explained:", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.yaml"
    path.write_text(block)
    spec = load_space(path)
    assert spec.algorithm == "optuna" and spec.scheduler.name == "asha" and spec.criteria is False
    assert isinstance(spec.parameters["components"], Subsets) and spec.has_seeds
    assert spec.defaults == {"max_steps": 200, "warmup_fraction": 0.1}


BUDGETS = """
metric: val_acc
mode: max
algorithm: grid
scheduler: fifo
budgets: {budgets}
parameters:
  components: {{choice: [mha, fc1, ln1+ln2]}}
  lr: {{choice: [0.03, 0.1]}}
  seed: {{choice: [0, 1, 2]}}
"""


def test_budgets_run_each_budgets_grid_in_turn_narrowed_where_asked(tmp_path):
    path = write_space(tmp_path, text=BUDGETS.format(budgets="[20, {steps: 60, lr: [0.1], seed: [0, 1]}]"))
    spec = load_space(path)
    assert spec.budget_steps == (20, 60) and spec.total_trials == 3 * 2 * 3 + 3 * 1 * 2
    short, long = spec.grid[:18], spec.grid[18:]
    assert {g["max_steps"] for g in short} == {20} and {g["max_steps"] for g in long} == {60}
    assert {(g["lr"], g["seed"]) for g in long} == {(0.1, 0), (0.1, 1)}
    assert {g["components"] for g in long} == {"mha", "fc1", "ln1+ln2"}
    assert {c["max_steps"] for c in spec.corner_configs()} == {20, 60}
    assert grid_points(spec) == spec.grid
    points = grid_points(spec.with_overrides(num_samples=2))
    assert len(points) == 48 and points[:24] == points[24:]
    again = spec.with_overrides(budgets=[30, 90, 200])  # steps replaced, narrowing kept, a third on the whole grid
    assert again.budget_steps == (30, 90, 200) and again.total_trials == 18 + 6 + 18
    assert grid_points(load_space("component_subsets")) is None


@pytest.mark.parametrize(
    "budgets, message",
    [
        ("150", "budgets must be a list of step counts"),
        ("[150, 150]", "repeat a step count"),
        ("[0]", "a budget's steps must be an integer >= 1"),
        ("[{lr: [0.1]}]", "has no steps"),
        ("[{steps: 60, lrr: [0.1]}]", 'narrows "lrr", which is not a parameter \\(did you mean "lr"'),
        ("[{steps: 60, lr: [0.3]}]", 'gives "lr" \\[0.3\\], not among its choices'),
    ],
)
def test_bad_budgets_raise_clear_errors(tmp_path, budgets, message):
    with pytest.raises(UserError, match=message):
        load_space(write_space(tmp_path, text=BUDGETS.format(budgets=budgets)))


def test_budgets_need_a_grid_without_early_stopping(tmp_path):
    text = BUDGETS.format(budgets="[20, 60]").replace("algorithm: grid", "algorithm: random")
    with pytest.raises(UserError, match="budgets need algorithm: grid and scheduler: fifo"):
        load_space(write_space(tmp_path, text=text))
    with pytest.raises(UserError, match="budgets need algorithm: grid"):
        load_space("component_subsets").with_overrides(budgets=[100, 400])
    text = BUDGETS.format(budgets="[20, 60]") + "  max_steps: {choice: [10, 20]}\n"
    with pytest.raises(UserError, match="remove max_steps from parameters"):
        load_space(write_space(tmp_path, text=text))


def test_methods_per_component_for_optuna_never_all_frozen():
    spec = load_space("where_and_how")
    space = OptunaSpace(spec.parameters)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    seen, methods_seen = set(), set()
    for _ in range(300):
        trial = study.ask()
        constants = space(trial)
        subset = constants["components"]
        assert parse_subset(subset), "every component frozen"
        flags = {c: trial.params.get(method_flag(c), constants.get(method_flag(c))) for c in COMPONENTS}
        assert component_methods(subset) == {method_flag(c): m for c, m in flags.items()}
        assert trial.params["depth"] in ("first", "middle", "last", "all") and trial.params["lora_rank"] in (4, 8, 16)
        seen.add(subset)
        methods_seen.update(flags.values())
        study.tell(trial, 0.5)
    assert methods_seen == {"frozen", "full", "lora", "bitfit"} and len(seen) > 150


def test_methods_grid_and_a_constant_method_map(tmp_path):
    text = "  components: {methods: {fc1: [lora, frozen], mha: [full, lora], ln1: bitfit}}\n  lr: 0.1"
    spec = load_space(write_space(tmp_path, text, "grid"))
    assert spec.parameters["components"].grid_values() == [
        "ln1:bitfit+mha+fc1:lora",
        "ln1:bitfit+mha",
        "ln1:bitfit+mha:lora+fc1:lora",
        "ln1:bitfit+mha:lora",
    ]
    constant = load_space(write_space(tmp_path, "  components: {methods: {mha: lora, fc1: full}}", "grid"))
    assert constant.grid == [{"components": "mha:lora+fc1"}]
    probe = load_space(write_space(tmp_path, "  components: {methods: {mha: [frozen]}}", "grid"))
    assert probe.grid == [{"components": "head"}]  # nothing listed trains: the linear probe, as written


def test_depth_as_a_searched_choice_or_every_contiguous_range(tmp_path):
    spec = load_space(write_space(tmp_path, "  depth: {contiguous: 3}\n  lr: 0.1", "grid"))
    assert [c["depth"] for c in spec.grid] == ["0", "1", "2", "0-1", "1-2", "0-2"]
    spec = load_space(write_space(tmp_path, "  components: mha:lora\n  depth: {choice: [first, last, 1-2]}"))
    space = OptunaSpace(spec.parameters)
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1)).ask()
    assert space(trial) == {"components": "mha:lora"} and trial.params["depth"] in ("first", "last", "1-2")


def test_a_constant_trained_component_lets_every_searched_one_be_frozen():
    listed = (("mha", ("frozen", "lora")), ("fc1", ("frozen", "full")))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for choices, expected in ((listed, {"fc1", "mha:lora", "mha:lora+fc1"}), (listed + (("fc2", ("full",)),), None)):
        seen = set()
        for _ in range(60):
            trial = study.ask()
            seen.add(Methods("components", choices).suggest(trial)["components"])
            study.tell(trial, 0.0)
        assert seen == (expected or {"fc2", "fc1+fc2", "mha:lora+fc2", "mha:lora+fc1+fc2"})
