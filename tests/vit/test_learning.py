"""Finetuning learns: the shipped testbed ViT on digits beats stated accuracies after a few hundred steps, and its
training loss falls. The expectations are numbers stated here (chance is 10%), not outputs of the code under test:
a flipped update, a frozen head or a broken schedule fails them."""

import pytest

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.vit.training import finetune

CHANCE = 0.1


def train(components: str, steps: int, lr: float = 0.3) -> tuple[dict, list[dict]]:
    reports: list[dict] = []
    cfg = FinetuneConfig(components=components, lr=lr, max_steps=steps, eval_every=steps // 4, warmup_steps=10)
    _, final = finetune(cfg, report=lambda metrics, state: reports.append(metrics))
    return final, reports


@pytest.mark.parametrize(
    "components, steps, least_val_acc",
    [
        ("head", 100, 0.85),  # the linear probe on the pretrained features: 90% here after 100 steps
        ("fc2", 120, 0.6),  # one feed-forward layer (and the head) from the pretrained weights
    ],
)
def test_finetuning_the_testbed_on_digits_learns(components, steps, least_val_acc):
    final, reports = train(components, steps)
    losses = [r["train_loss"] for r in reports]
    assert losses[-1] < 0.8 * losses[0], losses  # the training loss falls
    assert final["best_val_acc"] >= least_val_acc, final["best_val_acc"]
    assert final["test_acc"] >= least_val_acc - 0.1 > CHANCE  # the best weights generalise to the test split
