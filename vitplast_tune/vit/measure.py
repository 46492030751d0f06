"""The measurements a search runs before training, as Ray tasks run them: build the model and the image sets of a
run, then measure plasticity (``vit.plasticity``) or the gradient criteria (``vit.gradients``).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pandas as pd

from vitplast_tune import components
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.data import datasets
from vitplast_tune.data.batches import eval_batches, train_batches
from vitplast_tune.data.decoded import InMemory
from vitplast_tune.vit import gradients, models
from vitplast_tune.vit.plasticity import compute_plasticity
from vitplast_tune.vit.training import build_run


def measure_plasticity(
    model_name: str,
    *,
    weights,
    pretrained: bool,
    dataset: str,
    reference: str,
    reference_split: str,
    data_dir,
    download: bool,
    variant: str,
    batch_size: int,
    max_pairs: int | None,
    device=None,
) -> tuple[pd.DataFrame, dict[str, Any], dict[str, Any]]:
    """Build the model and both image sets and measure: (table, its parameters per component (``component_params``)
    and per component and block (``parameter_summary``), where and how long)."""
    datasets.check_dataset_name(dataset)  # here, where data loads: a search's plan checked them without torch
    datasets.check_dataset_name(reference)
    model = models.create_model(
        model_name, 0, pretrained=pretrained, weights=weights
    )  # no head: any head in the weights fits
    config = models.data_config(model)
    downstream_set = datasets.load_dataset(dataset, config, data_dir=data_dir, download=download).test
    reference_set = getattr(
        datasets.load_dataset(reference, config, data_dir=data_dir, download=download), reference_split
    )
    start = time.perf_counter()
    table = compute_plasticity(
        model,
        eval_batches(reference_set, batch_size),
        eval_batches(downstream_set, batch_size),
        variant=variant,
        batch_size=batch_size,
        device=device,
        max_pairs=max_pairs,
    )
    where = {"seconds": round(time.perf_counter() - start, 3), "measured_on": task_context()}
    counts = components.count_parameters(model)
    parameters = {"component_params": {c: counts[c] for c in components.COMPONENTS}}
    return table, dict(parameters, parameter_summary=components.parameter_summary(model)), where


def task_context() -> dict[str, Any]:
    """The node and resources of the Ray task running this (empty outside Ray), for the report's metadata."""
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


def measure_gradients(
    cfg: FinetuneConfig, *, num_batches: int = 4, decoded: InMemory | None = None, device=None
) -> pd.DataFrame:
    """The gradient criteria (``gradients.gradient_table``) of a run's pretrained model on its first training batches.

    ``cfg`` is a ``FinetuneConfig`` (model, weights, dataset, batch size, seed); the new head is
    initialised with ``cfg.seed`` as a trial's would be. ``decoded`` is the dataset already decoded.
    """
    model, splits = build_run(cfg, decoded)
    stream = train_batches(splits.train, cfg.batch_size, seed=cfg.seed)
    table = gradients.gradient_table(model, [next(stream) for _ in range(num_batches)], device=device or "cpu")
    table.attrs.update(model=cfg.model, dataset=cfg.dataset, num_batches=num_batches, batch_size=cfg.batch_size)
    return table
