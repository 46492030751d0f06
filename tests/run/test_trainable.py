"""Checkpoints at a cadence that fits the storage: every k evaluations, whenever the best accuracy improves and at the
last step; what they hold (the state to resume, the best weights apart); the driver logging the best weights read
through the checkpoint's filesystem."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ray import tune
from safetensors.torch import load_file

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.run import train_trial
from vitplast_tune.run.checkpoints import checkpoint_due, read_checkpoint, write_checkpoint
from vitplast_tune.storage import BEST_FILE, STATE_FILE
from vitplast_tune.vit.best_model import best_weights
from vitplast_tune.vit.training import finetune

TINY = dict(components="mha", pretrained=False, batch_size=8, warmup_steps=1)


@pytest.mark.parametrize(
    "step, best_step, every, due",
    [
        (10, 5, 1, True),  # every evaluation
        (10, 5, 2, True),  # the 2nd evaluation (eval_every 5)
        (15, 5, 2, False),
        (15, 15, 2, True),  # the best improved now
        (20, 5, 3, False),
        (22, 5, 3, True),  # the last step, though not a 3rd evaluation
    ],
)
def test_when_a_report_carries_a_checkpoint(step, best_step, every, due):
    metrics = {"step": step, "best_step": best_step, "max_steps": 22}
    assert checkpoint_due(metrics, eval_every=5, every=every) is due


def states(max_steps=4):
    """The state and metrics of each report of a tiny run."""
    seen = []
    cfg = FinetuneConfig(**TINY, max_steps=max_steps, eval_every=2)
    finetune(
        cfg,
        report=lambda m, s: seen.append((m, {**s, "trainable": {k: v.clone() for k, v in s["trainable"].items()}})),
    )
    return seen


def test_a_checkpoint_holds_the_state_and_the_best_weights_apart(tmp_path):
    metrics, state = states()[-1]
    write_checkpoint(tmp_path, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == [BEST_FILE, STATE_FILE]
    best = load_file(str(tmp_path / BEST_FILE))
    assert best.keys() == state["trainable"].keys()
    assert all(torch.equal(best[k], state["best"]["trainable"][k]) for k in best)
    resumed = read_checkpoint(tune.Checkpoint.from_directory(str(tmp_path)))
    assert resumed["step"] == 4 and resumed["best"]["step"] == metrics["best_step"]
    assert resumed["best"]["val_acc"] == metrics["best_val_acc"]
    assert all(torch.equal(resumed["trainable"][k], v) for k, v in state["trainable"].items())
    assert resumed["optimizer"]["param_groups"][0]["lr"] == state["optimizer"]["param_groups"][0]["lr"]
    assert resumed["timing"] == state["timing"] and resumed["timing"]["time_in_steps_s"] == metrics["time_in_steps_s"]
    assert read_checkpoint(None) is None


@pytest.mark.parametrize("layout", ["best file", "state only"])  # the second: checkpoints written before best files
def test_the_best_model_step_reads_the_best_weights_from_the_checkpoint(tmp_path, layout):
    _, state = states()[-1]
    checkpoint_dir = tmp_path / "checkpoint_000001"
    checkpoint_dir.mkdir()
    if layout == "best file":
        write_checkpoint(checkpoint_dir, state)
        (checkpoint_dir / STATE_FILE).unlink()  # the best file alone is read
    else:
        torch.save(state, checkpoint_dir / STATE_FILE)
    out = tmp_path / "out" / "weights.safetensors"
    out.parent.mkdir()
    best_weights(tune.Checkpoint.from_directory(str(checkpoint_dir)), out)
    logged = load_file(str(out))
    assert logged.keys() == state["trainable"].keys()
    assert all(torch.equal(logged[k], state["best"]["trainable"][k]) for k in logged)


@pytest.mark.slow
def test_a_trial_checkpoints_every_k_evaluations_on_improvement_and_last(ray_local, tmp_path):
    # A learning rate so small that the accuracy never changes: the best improves at the first evaluation only.
    settings = FinetuneConfig(**{**TINY, "lr": 1e-9}, max_steps=16, eval_every=2, checkpoint_every=3, threads=1)
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(train_trial, settings=settings), {"cpu": 1}),
        run_config=tune.RunConfig(name="cadence", storage_path=str(tmp_path), verbose=0),
    )
    (result,) = tuner.fit()
    assert result.error is None, result.error
    frame = result.metrics_dataframe
    assert list(frame["step"]) == [2, 4, 6, 8, 10, 12, 14, 16]
    checkpointed = frame.loc[frame["checkpoint_dir_name"].notna(), "step"].tolist()
    assert checkpointed == [2, 6, 12, 16]  # the first best, the 3rd and 6th evaluations, the last step
    assert (Path(result.checkpoint.path) / BEST_FILE).is_file()
