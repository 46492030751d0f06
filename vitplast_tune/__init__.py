"""vitplast_tune: which components of a pretrained ViT to finetune, searched with Ray Tune and
judged against their plasticity (Odonnat et al., ICML 2026).

The public API, one verb each::

    import vitplast_tune as vt
    result = vt.run_search(vt.SearchOptions(space="component_subsets"))   # the whole search
    spec = vt.load_space("paper_grid")                                      # a validated space file
    model, metrics = vt.finetune(vt.FinetuneConfig(components="mha+fc1", lr=0.1))  # one finetuning run
    best = vt.load_best_model("quickstart")                                  # a search's best model
    model = vt.create_model("vit_testbed_patch8_32.fractal", num_classes=10)
    table = vt.compute_plasticity(model, reference_images, downstream_images)

Every mistake a user can fix raises ``vt.UserError``. Importing the package starts nothing and
imports nothing heavy: each name loads its module on first use.

Modules, one concept each, in the order data flows: ``components`` (the six names, freezing),
``models`` (timm ViTs, the testbed, timm internals), ``data`` (datasets, splits), ``fractals`` and
``pretraining`` (the offline testbed), ``plasticity`` (pure measurement), ``report`` (plasticity
report: cache, plots), ``spaces`` (space files, typed distributions), ``plan`` (validation into a
plan, defaults), ``training`` / ``trial`` (one finetuning run, and as a Tune trainable),
``searchers`` (search algorithm, scheduler, Tuner), ``cluster`` (joining Ray clusters),
``tracking`` (MLflow), ``progress`` (console lines), ``search`` (the orchestration), ``results``
(trial table, summary), ``analysis`` (statistics, plots).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {
    "run_search": ("vitplast_tune.search.driver", "run"),
    "SearchOptions": ("vitplast_tune.search.plan", "SearchOptions"),
    "load_space": ("vitplast_tune.search.spaces", "load_space"),
    "finetune": ("vitplast_tune.vit.training", "finetune"),
    "load_best_model": ("vitplast_tune.vit.best_model", "load_best_model"),
    "FinetuneConfig": ("vitplast_tune.config", "FinetuneConfig"),
    "create_model": ("vitplast_tune.vit.models", "create_model"),
    "compute_plasticity": ("vitplast_tune.vit.plasticity", "compute_plasticity"),
    "plasticity_report": ("vitplast_tune.predictors.report", "plasticity_report"),
    "UserError": ("vitplast_tune.errors", "UserError"),
}
__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use (PEP 562), so that ``import vitplast_tune`` stays light."""
    if name not in _API:
        raise AttributeError(f"module 'vitplast_tune' has no attribute {name!r}")
    module, attr = _API[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
