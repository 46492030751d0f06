"""What a search measures about a model and a dataset before any training: the plasticity report
(measured once, cached on disk, plotted) and the gradient criteria, and each subset's scores.

``plasticity_report`` builds the model and the two image sets, calls the pure measurement
(``plasticity.compute_plasticity``) and writes the table (CSV, JSON) and a plot into a cache folder
keyed by everything that changes the result; ``gradient_report`` does the same for ``criteria``;
``Predictors.scores`` turns both into a trial's scores.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from vitplast_tune.analysis.plots import plot_plasticity
from vitplast_tune.components import COMPONENTS
from vitplast_tune.config import cache_dir, default_data_dir
from vitplast_tune.errors import UserError, did_you_mean
from vitplast_tune.predictors import scores
from vitplast_tune.predictors.scores import VARIANTS, aggregate_plasticity

if TYPE_CHECKING:  # the measurements (torch, timm) load where they run: a Ray task, not the search's driver
    import torch

    from vitplast_tune.data.decoded import InMemory

Runner = Callable[..., Any]  # runner(fn, **kwargs) -> fn(**kwargs), here or elsewhere (a Ray task)


@dataclass
class PlasticityReport:
    """What ``plasticity_report`` measured and wrote."""

    table: pd.DataFrame
    ranking: pd.DataFrame
    out_dir: Path
    files: dict[str, Path] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def plasticity_report(
    model_name: str,
    *,
    weights: str | Path | None = None,
    pretrained: bool = True,
    dataset: str = "digits",
    reference: str = "fractals",
    reference_split: str = "test",
    data_dir: str | Path | None = None,
    download: bool = False,
    variant: str = "paper",
    batch_size: int = 64,
    max_pairs: int | None = None,
    out_dir: str | Path | None = None,
    device: str | torch.device | None = None,
    reuse: bool = False,
    runner: Runner | None = None,
) -> PlasticityReport:
    """Measure the plasticity of a model between a reference distribution and a downstream test split; write files.

    Writes ``plasticity.csv`` (the per-layer table), ``plasticity.json`` (settings, table, ranking
    and parameter counts per component) and ``plasticity.png`` into ``out_dir`` (default: a cache
    folder keyed by model, weights, data and variant). With ``reuse``, a report already written
    there for the same settings is loaded instead of measured again. ``runner`` runs the measurement
    elsewhere (``runner(fn, **kwargs)`` returns ``fn(**kwargs)``, e.g. as a Ray task on a GPU node); the files
    are written here.
    """
    if reference_split not in ("test", "train"):
        raise UserError(f'reference split must be "test" or "train", not "{reference_split}"')
    if variant not in VARIANTS:
        raise UserError(
            f'unknown plasticity variant "{variant}"{did_you_mean(variant, VARIANTS)}; use one of {", ".join(VARIANTS)}'
        )
    key = cache_key(
        model_name,
        weights=weights,
        pretrained=pretrained,
        dataset=dataset,
        reference=reference,
        reference_split=reference_split,
        data_dir=data_dir,
        variant=variant,
        max_pairs=max_pairs,
    )
    out = (
        Path(out_dir).expanduser()
        if out_dir is not None
        else default_out_dir(model_name, dataset, reference, variant, key)
    )
    files = {"csv": out / "plasticity.csv", "json": out / "plasticity.json", "png": out / "plasticity.png"}
    if reuse and all(f.is_file() for f in files.values()):
        meta = json.loads(files["json"].read_text())
        if {k: meta.get(k) for k in key} == key:
            table = pd.read_csv(files["csv"])
            table.attrs["variant"] = variant
            meta = {k: v for k, v in meta.items() if k not in ("table", "ranking")}
            return PlasticityReport(table, aggregate_plasticity(table), out, files, dict(meta, reused=True))

    table, counts, where = (runner or _here)(
        measure_plasticity,
        model_name=model_name,
        weights=weights,
        pretrained=pretrained,
        dataset=dataset,
        reference=reference,
        reference_split=reference_split,
        data_dir=data_dir,
        download=download,
        variant=variant,
        batch_size=batch_size,
        max_pairs=max_pairs,
        device=device,
    )
    ranking = aggregate_plasticity(table)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(
        key,
        batch_size=batch_size,
        n_pairs=int(table["n_pairs"].max()),
        **where,
        component_params={c: counts[c] for c in COMPONENTS},
    )
    table.to_csv(files["csv"], index=False)
    payload = dict(meta, table=_records(table), ranking=_records(ranking))
    files["json"].write_text(json.dumps(payload, indent=2) + "\n")
    title = f"{model_name}: {dataset} vs {reference} ({variant})"
    plot_plasticity(table, files["png"], title=title)
    return PlasticityReport(table, ranking, out, files, meta)


def search_report(settings: dict[str, Any], *, reference: str, **options: Any) -> PlasticityReport:
    """``plasticity_report`` of a search's model and dataset (``settings``: a FinetuneConfig as a dict), cached
    (``reuse``); ``options``: its variant, max_pairs, runner."""
    s = settings
    return plasticity_report(
        s["model"],
        weights=s["weights"],
        pretrained=s["pretrained"],
        dataset=s["dataset"],
        reference=reference,
        data_dir=s["data_dir"],
        download=s["download"],
        reuse=True,
        **options,
    )


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
) -> tuple[pd.DataFrame, dict[str, int], dict[str, Any]]:
    """Build the model and both image sets and measure: (table, parameters per component, where and how long)."""
    from vitplast_tune import components
    from vitplast_tune.data import datasets
    from vitplast_tune.vit import models
    from vitplast_tune.vit.plasticity import compute_plasticity

    datasets.check_dataset_name(dataset)  # here, where data loads: a search's plan checked them without torch
    datasets.check_dataset_name(reference)
    model = models.build_model(
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
        datasets.eval_batches(reference_set, batch_size),
        datasets.eval_batches(downstream_set, batch_size),
        variant=variant,
        batch_size=batch_size,
        device=device,
        max_pairs=max_pairs,
    )
    where = {"seconds": round(time.perf_counter() - start, 3), "measured_on": task_context()}
    return table, components.count_parameters(model), where


def task_context() -> dict[str, Any]:
    """The node and resources of the Ray task running this (empty outside Ray), for the report's metadata."""
    import sys

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


def _here(fn: Callable[..., Any], **kwargs: Any) -> Any:
    return fn(**kwargs)


def cache_key(
    model_name: str,
    *,
    weights: str | Path | None,
    pretrained: bool,
    dataset: str,
    reference: str,
    reference_split: str,
    data_dir: str | Path | None,
    variant: str,
    max_pairs: int | None,
) -> dict[str, Any]:
    """Everything that changes a plasticity report: model and weights, both image sets, settings and the code's version."""
    return dict(
        model=model_name,
        weights=_file_identity(weights),
        pretrained=pretrained or weights is not None,
        dataset=dataset,
        reference=reference,
        reference_split=reference_split,
        variant=variant,
        max_pairs=max_pairs,
        data_dir=str(_data_root(data_dir)),
        images=_images_identity({dataset, reference}, data_dir),
        code=code_version(),
    )


def code_version() -> str:
    """The package version and a hash of the modules that compute a report (measurement, models, data)."""
    from vitplast_tune import __version__

    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    for module in (
        "vit/plasticity",
        "vit/models",
        "data/datasets",
        "data/transforms",
        "data/fractals",
    ):  # read, not imported (no torch)
        digest.update((package / f"{module}.py").read_bytes())
    return f"{__version__}+{digest.hexdigest()[:12]}"


def _images_identity(datasets: set[str], data_dir: str | Path | None) -> str | None:
    """A hash of the image files of the on-disk folders among ``datasets`` (paths, sizes, modification times)."""
    if "imagefolder" not in datasets:
        return None  # the other datasets are fixed files (torchvision, CIFAR-10-C) or generated by the code
    root, digest = _data_root(data_dir), hashlib.sha256()
    for path in sorted(p for split in ("train", "test") for p in (root / split).rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _data_root(data_dir: str | Path | None) -> Path:
    return Path(data_dir).expanduser().resolve() if data_dir is not None else default_data_dir()


def default_out_dir(model_name: str, dataset: str, reference: str, variant: str, key: dict | None = None) -> Path:
    """``~/.cache/vitplast_tune/plasticity/<model>__<dataset>__vs__<reference>__<variant>[__<hash of key>]``."""
    name = "__".join([model_name, dataset, "vs", reference, variant])
    if key is not None:
        name += "__" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return cache_dir() / "plasticity" / re.sub(r"[^A-Za-z0-9._-]", "-", name)


def _file_identity(path: str | Path | None) -> str | None:
    """A weights file named by its path, size and modification time (for cache keys)."""
    if path is None:
        return None
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        return str(p)
    stat = p.stat()
    return f"{p}:{stat.st_size}:{int(stat.st_mtime)}"


@dataclass
class Predictors:
    """What a search measures before any training: the plasticity report and the gradient gradients."""

    plasticity: PlasticityReport | None = None
    gradients: pd.DataFrame | None = None  # gradients.gradient_table

    def scores(self, subset: str) -> dict[str, float]:
        """A subset's predictors: plasticity mean, max and parameter-weighted mean; gradient norm and Auto-RGN."""
        out: dict[str, float] = {}
        if self.plasticity is not None:
            meta = self.plasticity.meta
            out.update(scores.subset_scores(self.plasticity.table, subset, meta["component_params"]))
        if self.gradients is not None:
            out.update(scores.subset_criteria(self.gradients, subset))
        return out


def measure_search(plan) -> Predictors:
    """The predictors a search (``plan.SearchPlan``) measures before training (plasticity, gradient criteria), each
    as a Ray task with one trial's resources; plasticity measured before is read from its cache instead."""
    if not plan.options.plasticity:
        return Predictors()
    from vitplast_tune.search.cluster import task_runner
    from vitplast_tune.search.trial import trial_config

    s, o = plan.settings, plan.options
    say = print if o.verbose else lambda *a, **k: None
    run = task_runner(o.trial_resources, say)
    say(
        f"Plasticity of {s['model']} ({o.plasticity_variant} variant): {s['dataset']} test split vs {o.plasticity_reference} ...",
        flush=True,
    )
    measured = search_report(
        s, reference=o.plasticity_reference, variant=o.plasticity_variant, max_pairs=o.plasticity_pairs, runner=run
    )
    ranking = measured.ranking.dropna(subset=["rank"]).sort_values("rank")
    order = " > ".join(f"{r.component} {r.plasticity:.3g}" for r in ranking.itertuples())
    say(
        f"  ranking: {order}  ({'cached' if measured.meta.get('reused') else 'measured'}, {measured.out_dir})",
        flush=True,
    )
    gradients = run(gradient_report, cfg=trial_config({}, s), decoded=plan.decoded)
    return Predictors(measured, gradients)


def gradient_report(cfg, *, num_batches: int = 4, decoded: InMemory | None = None, device=None) -> pd.DataFrame:
    """The gradient criteria (``gradients.gradient_table``) of a run's pretrained model on its first training batches.

    ``cfg`` is a ``training.FinetuneConfig`` (model, weights, dataset, batch size, seed); the new head is
    initialised with ``cfg.seed`` as a trial's would be. ``decoded`` is the dataset already decoded.
    """
    if num_batches < 1:
        raise UserError(f"num_batches must be a positive integer, not {num_batches}")
    from vitplast_tune.data import datasets
    from vitplast_tune.vit import gradients
    from vitplast_tune.vit.training import build_run

    model, splits = build_run(cfg, decoded)
    stream = datasets.train_batches(splits.train, cfg.batch_size, seed=cfg.seed)
    table = gradients.gradient_table(model, [next(stream) for _ in range(num_batches)], device=device or "cpu")
    table.attrs.update(model=cfg.model, dataset=cfg.dataset, num_batches=num_batches, batch_size=cfg.batch_size)
    return table


def in_network_scores(
    settings: dict[str, Any],
    subsets: Iterable[str],
    *,
    reference: str = "fractals",
    plasticity_pairs: int | None = None,
) -> pd.DataFrame:
    """Per subset (index): the mean in-network plasticity of its components (``in_network_mean``), for the criteria lab.

    ``settings`` are a search's (a FinetuneConfig as a dict); the report is measured once and cached.
    """
    found = search_report(settings, reference=reference, variant="in_network", max_pairs=plasticity_pairs)
    counts = found.meta["component_params"]
    rows = {subset: scores.subset_scores(found.table, subset, counts)["plasticity_mean"] for subset in subsets}
    return pd.DataFrame({"in_network_mean": pd.Series(rows, dtype=float)})


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON-safe records: NaN and <NA> become null."""
    return json.loads(frame.to_json(orient="records"))
