"""The plasticity report of a model and a dataset: measured once, cached on disk, plotted.

``plasticity_report`` builds the model and the two image sets, calls the pure measurement
(``plasticity.compute_plasticity``) and writes the table (CSV, JSON) and a plot into a cache folder
keyed by everything that changes the result; ``subset_scores`` turns a report into a trial's scores.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from vitplast_tune import analysis, components, data, models, plasticity
from vitplast_tune.components import COMPONENTS
from vitplast_tune.errors import UserError, did_you_mean
from vitplast_tune.plasticity import VARIANTS, aggregate_plasticity, compute_plasticity


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
) -> PlasticityReport:
    """Measure the plasticity of a model between a reference distribution and a downstream test split; write files.

    Writes ``plasticity.csv`` (the per-layer table), ``plasticity.json`` (settings, table, ranking
    and parameter counts per component) and ``plasticity.png`` into ``out_dir`` (default: a cache
    folder keyed by model, weights, data and variant). With ``reuse``, a report already written
    there for the same settings is loaded instead of measured again.
    """
    if reference_split not in ("test", "train"):
        raise UserError(f'reference split must be "test" or "train", not "{reference_split}"')
    if variant not in VARIANTS:
        raise UserError(f'unknown plasticity variant "{variant}"{did_you_mean(variant, VARIANTS)}; use one of {", ".join(VARIANTS)}')
    data.check_dataset_name(dataset)
    data.check_dataset_name(reference)
    key = cache_key(model_name, weights=weights, pretrained=pretrained, dataset=dataset, reference=reference,
                    reference_split=reference_split, data_dir=data_dir, variant=variant, max_pairs=max_pairs)  # fmt: skip
    out = Path(out_dir).expanduser() if out_dir is not None else default_out_dir(model_name, dataset, reference, variant, key)
    files = {"csv": out / "plasticity.csv", "json": out / "plasticity.json", "png": out / "plasticity.png"}
    if reuse and all(f.is_file() for f in files.values()):
        meta = json.loads(files["json"].read_text())
        if {k: meta.get(k) for k in key} == key:
            table = pd.read_csv(files["csv"])
            table.attrs["variant"] = variant
            meta = {k: v for k, v in meta.items() if k not in ("table", "ranking")}
            return PlasticityReport(table, aggregate_plasticity(table), out, files, dict(meta, reused=True))

    # The head is never used: build without one, which also accepts any head in the weights.
    model = models.build_model(model_name, 0, pretrained=pretrained, weights=weights)
    config = models.data_config(model)
    downstream_set = data.load_dataset(dataset, config, data_dir=data_dir, download=download).test
    reference_splits = data.load_dataset(reference, config, data_dir=data_dir, download=download)
    reference_set = getattr(reference_splits, reference_split)

    start = time.perf_counter()
    table = compute_plasticity(
        model,
        data.eval_batches(reference_set, batch_size),
        data.eval_batches(downstream_set, batch_size),
        variant=variant,
        batch_size=batch_size,
        device=device,
        max_pairs=max_pairs,
    )
    seconds = time.perf_counter() - start
    ranking = aggregate_plasticity(table)

    out.mkdir(parents=True, exist_ok=True)
    counts = components.count_parameters(model)
    meta = dict(key, batch_size=batch_size, n_pairs=int(table["n_pairs"].max()), seconds=round(seconds, 3),
                component_params={c: counts[c] for c in COMPONENTS})  # fmt: skip
    table.to_csv(files["csv"], index=False)
    payload = dict(meta, table=_records(table), ranking=_records(ranking))
    files["json"].write_text(json.dumps(payload, indent=2) + "\n")
    title = f"{model_name}: {dataset} vs {reference} ({variant})"
    analysis.plot_plasticity(table, files["png"], title=title)
    return PlasticityReport(table, ranking, out, files, meta)


def cache_key(
    model_name: str, *, weights: str | Path | None, pretrained: bool, dataset: str, reference: str, reference_split: str,
    data_dir: str | Path | None, variant: str, max_pairs: int | None,
) -> dict[str, Any]:
    """Everything that changes a plasticity report: model and weights, both image sets, settings and the code's version."""
    return dict(
        model=model_name, weights=_file_identity(weights), pretrained=pretrained or weights is not None,
        dataset=dataset, reference=reference, reference_split=reference_split, variant=variant, max_pairs=max_pairs,
        data_dir=str(_data_root(data_dir)), images=_images_identity({dataset, reference}, data_dir), code=code_version(),
    )  # fmt: skip


def code_version() -> str:
    """The package version and a hash of the modules that compute a report (measurement, models, data)."""
    from vitplast_tune import __version__, fractals

    digest = hashlib.sha256()
    for module in (plasticity, models, data, fractals):
        digest.update(Path(module.__file__).read_bytes())
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
    return Path(data_dir).expanduser().resolve() if data_dir is not None else data.default_data_dir()


def default_out_dir(model_name: str, dataset: str, reference: str, variant: str, key: dict | None = None) -> Path:
    """``~/.cache/vitplast_tune/plasticity/<model>__<dataset>__vs__<reference>__<variant>[__<hash of key>]``."""
    name = "__".join([model_name, dataset, "vs", reference, variant])
    if key is not None:
        name += "__" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return Path.home() / ".cache" / "vitplast_tune" / "plasticity" / re.sub(r"[^A-Za-z0-9._-]", "-", name)


def _file_identity(path: str | Path | None) -> str | None:
    """A weights file named by its path, size and modification time (for cache keys)."""
    if path is None:
        return None
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        return str(p)
    stat = p.stat()
    return f"{p}:{stat.st_size}:{int(stat.st_mtime)}"


def subset_scores(report: PlasticityReport | None, subset: str) -> dict[str, float]:
    """Plasticity scores of a subset from a report (empty when there is none): mean, max, parameter-weighted."""
    if report is None:
        return {}
    return plasticity.subset_scores(report.table, subset, report.meta["component_params"])


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON-safe records: NaN and <NA> become null."""
    return json.loads(frame.to_json(orient="records"))
