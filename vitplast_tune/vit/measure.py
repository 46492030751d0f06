"""Run the measurements a search makes before training, in its measuring Ray worker: plasticity and gradients."""

from __future__ import annotations

import sys
import time
from typing import Any

import pandas as pd
import torch
from torch.utils.data import Dataset, Subset

from vitplast_tune import components, freezing
from vitplast_tune.config import FinetuneConfig, PlasticityInputs
from vitplast_tune.data import datasets
from vitplast_tune.data.batches import eval_batches, train_batches
from vitplast_tune.data.decoded import InMemory
from vitplast_tune.data.splits import SmallImages
from vitplast_tune.errors import UserError
from vitplast_tune.vit import gradients, models
from vitplast_tune.vit.building import build_run
from vitplast_tune.vit.devices import run_device
from vitplast_tune.vit.families.registry import layout_of
from vitplast_tune.vit.plasticity import compute_plasticity


def measure_plasticity(
    inputs: PlasticityInputs,
    *,
    download: bool,
    batch_size: int,
    device: str | torch.device | None = None,
    decoded: InMemory | None = None,
) -> tuple[pd.DataFrame, dict[str, Any], dict[str, Any]]:
    """Build a run's model and both image sets, and measure the model's plasticity between them.

    Returns the per-layer table, the model's parameters per component and per block, and where and how long it took.
    """
    i = inputs
    datasets.check_dataset_name(i.dataset)  # the plan checked them without torch
    datasets.check_dataset_name(i.reference)
    model = models.create_model(
        i.model_name, 0, pretrained=i.pretrained, weights=i.weights
    )  # no head, so any head fits
    config = models.data_config(model)
    load = dict(data_dir=i.data_dir, download=download, decoded=decoded)
    downstream_set = datasets.load_dataset(i.dataset, config, **load).test
    reference_set = getattr(datasets.load_dataset(i.reference, config, **load), i.reference_split)
    start = time.perf_counter()
    table = compute_plasticity(
        model,
        eval_batches(reference_set, batch_size),
        eval_batches(downstream_set, batch_size),
        variant=i.variant,
        batch_size=batch_size,
        device=device if device is not None else run_device(),
        max_pairs=i.max_pairs,
    )
    where = {"seconds": round(time.perf_counter() - start, 3), "measured_on": task_context()}
    return table, _parameters(model), where


def _parameters(model: torch.nn.Module) -> dict[str, Any]:
    """Count the model's parameters per component, and per component and block."""
    layout = layout_of(model)
    counts = freezing.count_parameters(model, layout=layout)
    parameters = {"component_params": {c: counts[c] for c in components.COMPONENTS}}
    return dict(parameters, parameter_summary=freezing.parameter_summary(model, layout=layout))


def task_context() -> dict[str, Any]:
    """Return the node and resources of the Ray task running this; empty outside Ray."""
    if "ray" not in sys.modules:
        return {}
    import ray

    if not ray.is_initialized():
        return {}
    context = ray.get_runtime_context()
    try:
        return {"node_id": context.get_node_id(), "resources": context.get_assigned_resources()}
    except Exception:
        return {"node_id": context.get_node_id()}


HEAD_SEEDS = 5  # heads the criteria are measured over
NUM_BATCHES = 5  # batches per head, as Auto-RGN's authors' code takes


def measure_gradients(
    cfg: FinetuneConfig,
    *,
    num_batches: int = NUM_BATCHES,
    head_seeds: int = HEAD_SEEDS,
    decoded: InMemory | None = None,
    device: str | torch.device | None = None,
) -> pd.DataFrame:
    """Measure the gradient criteria of a run's pretrained model for ``head_seeds`` head initialisations.

    The batches are the first ``num_batches`` of the run's training stream, without augmentation. Each head starts as
    a trial with its seed would start it. Returns each head's ``gradient_table``, with a ``head_seed`` column.
    """
    model, splits = build_run(cfg, decoded)
    stream = train_batches(_unaugmented(splits.train, splits.val), cfg.batch_size, seed=cfg.seed)
    batches = [next(stream) for _ in range(num_batches)]
    num_classes = splits.num_classes
    device = device if device is not None else run_device()
    tables = []
    for head_seed in range(cfg.seed, cfg.seed + head_seeds):
        if head_seed != cfg.seed:
            torch.manual_seed(head_seed)
            model = models.create_model(cfg.model, num_classes, pretrained=cfg.pretrained, weights=cfg.weights)
        table = gradients.gradient_table(model, batches, device=device)
        tables.append(table.assign(head_seed=head_seed))
    table = pd.concat(tables, ignore_index=True)
    table.attrs.update(
        model=cfg.model, dataset=cfg.dataset, num_batches=num_batches, batch_size=cfg.batch_size, head_seeds=head_seeds
    )
    return table


def _unaugmented(train: Dataset, val: Dataset) -> Dataset:
    """Return the training images under the evaluation transform."""
    if isinstance(train, SmallImages):
        return SmallImages(train.images, train.labels, train.indices, train.data_config, False)
    if isinstance(train, Subset) and isinstance(val, Subset) and len(val.dataset) == len(train.dataset):
        return Subset(val.dataset, train.indices)
    raise UserError(f"cannot see the training images of a {type(train).__name__} without augmentation")
