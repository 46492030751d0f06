"""The plasticity report: measured once for a model, its data and a variant, then cached on disk (the per-layer
table as CSV and JSON, and a plot) and read back by searches, the criteria lab and ``recommend``; and
``Predictors``, everything a search measures before training, which scores each subset.

Torch-free: the measurement itself (``vit.measure``) runs where the ``runner`` sends it (the search's measuring Ray
worker with a trial's resources, or this process); the files are written here.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from vitplast_tune.components import BLOCK_COMPONENTS
from vitplast_tune.config import FinetuneConfig, cache_dir, check_variant, default_data_dir
from vitplast_tune.errors import UserError
from vitplast_tune.predictors import scores
from vitplast_tune.predictors.scores import aggregate_plasticity

if TYPE_CHECKING:
    import torch

Runner = Callable[..., Any]  # runner(fn, **kwargs) -> fn(**kwargs), here or elsewhere (a Ray worker)
FILES = {"csv": "plasticity.csv", "json": "plasticity.json", "png": "plasticity.png"}


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
    decoded=None,
    staged: Sequence = (),
) -> PlasticityReport:
    """Measure the plasticity of a model between a reference distribution and a downstream test split; write files.

    Writes ``plasticity.csv`` (the per-layer table), ``plasticity.json`` (settings, table, ranking
    and parameter counts per component) and ``plasticity.png`` into ``out_dir`` (default: a cache
    folder keyed by model, weights, data and variant). With ``reuse``, a report already written
    there for the same settings is loaded instead of measured again. ``runner`` runs the measurement
    elsewhere (``runner(fn, **kwargs)`` returns ``fn(**kwargs)``, e.g. in a Ray worker on a GPU node); the files
    are written here. ``decoded``: the downstream dataset already decoded (``data.decoded``), not read again;
    ``staged``: the driver's files sent to the runner's node (``data.staging``), used there in place of its paths.
    """
    if reference_split not in ("test", "train"):
        raise UserError(f'reference split must be "test" or "train", not "{reference_split}"')
    check_variant(variant)
    images = dict(dataset=dataset, reference=reference, reference_split=reference_split, data_dir=data_dir)
    key = cache_key(model_name, weights=weights, pretrained=pretrained, variant=variant, max_pairs=max_pairs, **images)
    out = (
        Path(out_dir).expanduser()
        if out_dir is not None
        else default_out_dir(model_name, dataset, reference, variant, key)
    )
    if reuse and (cached := _read(out, key)) is not None:
        return cached
    measured = (runner or _here)(
        _measure,
        model_name=model_name,
        weights=weights,
        pretrained=pretrained,
        download=download,
        variant=variant,
        batch_size=batch_size,
        max_pairs=max_pairs,
        device=device,
        decoded=decoded,
        staged=list(staged),
        **images,
    )
    return _write(
        out, dict(key, batch_size=batch_size), *measured, title=f"{model_name}: {dataset} vs {reference} ({variant})"
    )


def search_report(settings: FinetuneConfig, *, reference: str, **options: Any) -> PlasticityReport:
    """``plasticity_report`` of a search's model and dataset (``settings``: its FinetuneConfig), cached (``reuse``);
    ``options``: its variant, max_pairs, runner."""
    s = settings
    return plasticity_report(
        s.model,
        weights=s.weights,
        pretrained=s.pretrained,
        dataset=s.dataset,
        reference=reference,
        data_dir=s.data_dir,
        download=s.download,
        reuse=True,
        **options,
    )


def _measure(staged: Sequence = (), **kwargs: Any) -> tuple[pd.DataFrame, dict[str, int], dict[str, Any]]:
    """``vit.measure.measure_plasticity``, imported where it runs (a Ray worker): this module stays torch-free;
    the paths of ``staged`` files are this node's copies."""
    from vitplast_tune.data import staging
    from vitplast_tune.vit.measure import measure_plasticity

    return measure_plasticity(**{**kwargs, **staging.local_paths(staged)})


def gradient_report(
    cfg,
    *,
    num_batches: int = 5,
    head_seeds: int = 5,
    decoded=None,
    runner: Runner | None = None,
    staged: Sequence = (),
) -> pd.DataFrame:
    """The gradient criteria of a run's pretrained model for ``head_seeds`` head initialisations, on the first
    ``num_batches`` training batches without augmentation (``vit.measure.measure_gradients``: ``cfg`` a
    FinetuneConfig, ``decoded`` its dataset already decoded, ``staged`` the driver's files it reads), measured by
    ``runner`` (default: here)."""
    for name, value in (("num_batches", num_batches), ("head_seeds", head_seeds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{name} must be a positive integer, not {value}")
    return (runner or _here)(
        _measure_gradients,
        cfg=cfg,
        decoded=decoded,
        num_batches=num_batches,
        head_seeds=head_seeds,
        staged=list(staged),
    )


def describe_gradients(table: pd.DataFrame) -> str:
    """Per gradient criterion, one line: the components by their mean over head seeds (± std), and whether the
    ranking is the same for every head seed or which component each seed puts first."""
    summary = scores.criteria_summary(table)
    seeds = int(summary["head_seeds"].max()) if len(summary) else 0
    lines = []
    for criterion, rows in summary.groupby("criterion", sort=False):
        rows = rows.sort_values("rank")
        order = " > ".join(
            f"{r.component} {r.mean:.3g}±{0.0 if np.isnan(r.std) else r.std:.2g}" for r in rows.itertuples()
        )
        if not rows["rank_changes"].any():
            how = f"the same ranking for all {seeds} head seeds" if seeds > 1 else "one head seed"
        else:
            tops = scores.top_by_seed(table, criterion)
            how = "RANKING CHANGES WITH THE HEAD SEED; first: " + ", ".join(f"{c} {n}/{seeds}" for c, n in tops.items())
        lines.append(f"  {criterion:<16} {order}  ({how})")
    return "\n".join(lines)


def _measure_gradients(cfg: FinetuneConfig, staged: Sequence = (), **kwargs: Any) -> pd.DataFrame:
    from vitplast_tune.data import staging
    from vitplast_tune.vit.measure import measure_gradients

    return measure_gradients(staging.localize(cfg, staged), **kwargs)


def _here(fn: Callable[..., Any], **kwargs: Any) -> Any:
    return fn(**kwargs)


def _read(out: Path, key: dict[str, Any]) -> PlasticityReport | None:
    """The report written in ``out`` for the same ``key``, or None."""
    files = {kind: out / name for kind, name in FILES.items()}
    if not all(f.is_file() for f in files.values()):
        return None
    meta = json.loads(files["json"].read_text())
    if {k: meta.get(k) for k in key} != key or "parameter_summary" not in meta:  # another setting, or an older report
        return None
    table = pd.read_csv(files["csv"])
    table.attrs["variant"] = key["variant"]
    meta = {k: v for k, v in meta.items() if k not in ("table", "ranking")}
    return PlasticityReport(table, aggregate_plasticity(table), out, files, dict(meta, reused=True))


def _write(
    out: Path,
    key: dict[str, Any],
    table: pd.DataFrame,
    parameters: dict[str, Any],
    where: dict[str, Any],
    *,
    title: str,
) -> PlasticityReport:
    """Write the measured table, its JSON (settings, table, ranking, the model's parameters per component and per
    component and block) and its plot."""
    files = {kind: out / name for kind, name in FILES.items()}
    ranking = aggregate_plasticity(table)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(key, n_pairs=int(table["n_pairs"].max()), **where, **parameters)
    table.to_csv(files["csv"], index=False)
    payload = dict(meta, table=_records(table), ranking=_records(ranking))
    files["json"].write_text(json.dumps(payload, indent=2) + "\n")
    plot_plasticity(table, files["png"], title=title)
    return PlasticityReport(table, ranking, out, files, meta)


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
        weights=_file_identity(weights) or _folder_identity(model_name),
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
    modules = ["vit/plasticity", "vit/models", "data/datasets", "data/transforms", "data/fractals"]
    modules += sorted(f"vit/families/{p.stem}" for p in (package / "vit" / "families").glob("*.py"))
    for module in modules:  # read, not imported (no torch)
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


def _folder_identity(model_name: str) -> str | None:
    """A transformers model in a local folder (``hf:/path``) named by its files' names, sizes and modification times
    (for cache keys); None for any other model."""
    folder = Path(model_name.removeprefix("hf:")).expanduser()
    if not model_name.startswith("hf:") or not folder.is_dir():
        return None
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return ";".join(f"{p.relative_to(folder)}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)


@dataclass
class Predictors:
    """What a search measures before any training: the plasticity report and the gradient table."""

    plasticity: PlasticityReport | None = None
    gradients: pd.DataFrame | None = None  # vit.measure.measure_gradients: gradient tables per head seed

    def scores(self, subset: str, blocks: list[int] | None = None) -> dict[str, float]:
        """A subset's predictors: plasticity mean, max and parameter-weighted mean (over the layers of ``blocks``
        when given: a trial's depth); the gradient criteria (gradient norm, its ratio to the weight norm, Auto-RGN;
        of the whole components), each the mean over the head seeds."""
        out: dict[str, float] = {}
        if self.plasticity is not None:
            meta = self.plasticity.meta
            out.update(scores.subset_scores(self.plasticity.table, subset, meta["component_params"], blocks=blocks))
        if self.gradients is not None:
            out.update(scores.subset_criteria(self.gradients, subset))
        return out

    def trial_scores(self, cfg: FinetuneConfig) -> dict[str, float]:
        """``scores`` of a trial: its subset, over the layers of the blocks it trains in (``cfg.depth`` or ``blocks``)."""
        blocks = None
        if self.plasticity is not None and (cfg.blocks is not None or cfg.depth != "all"):
            blocks = cfg.block_indices(scores.num_blocks(self.plasticity.table))
        return self.scores(cfg.components, blocks)


def in_network_scores(
    settings: FinetuneConfig,
    subsets: Iterable[str],
    *,
    reference: str = "fractals",
    plasticity_pairs: int | None = None,
    **measuring: Any,
) -> pd.DataFrame:
    """Per subset (index): the mean in-network plasticity of its components (``in_network_mean``), for the criteria lab.

    ``settings`` are a search's; the report is measured once and cached; ``measuring``: where (``runner``,
    ``decoded``, ``staged``: see ``plasticity_report``).
    """
    found = search_report(settings, reference=reference, variant="in_network", max_pairs=plasticity_pairs, **measuring)
    counts = found.meta["component_params"]
    rows = {subset: scores.subset_scores(found.table, subset, counts)["plasticity_mean"] for subset in subsets}
    return pd.DataFrame({"in_network_mean": pd.Series(rows, dtype=float)})


def in_network_depth_scores(
    found: PlasticityReport, settings: FinetuneConfig, configs: Iterable[tuple[str, str]]
) -> pd.DataFrame:
    """Per (components, depth) (index): the mean in-network plasticity of the layers it trains (``in_network_mean``),
    from an in-network report (``search_report(..., variant="in_network")``)."""
    counts = found.meta["component_params"]
    blocks = scores.num_blocks(found.table)
    rows = {}
    for components, depth in configs:
        cfg = settings.merged({"components": components, "depth": depth})
        subset = scores.subset_scores(found.table, components, counts, blocks=cfg.block_indices(blocks))
        rows[(components, depth)] = subset["plasticity_mean"]
    index = pd.MultiIndex.from_tuples(list(rows), names=["components", "depth"])
    return pd.DataFrame({"in_network_mean": list(rows.values())}, index=index)


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON-safe records: NaN and <NA> become null."""
    return json.loads(frame.to_json(orient="records"))


def plot_plasticity(table: pd.DataFrame, path: str | Path, *, title: str | None = None) -> Path:
    """Write a PNG: plasticity per layer (one line per block component) and per-component means with their spread."""
    summary = aggregate_plasticity(table)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    for component in BLOCK_COMPONENTS:
        rows = table[table["component"] == component].sort_values("layer")
        if len(rows):
            sem = _finite(rows.get("sem"))
            left.errorbar(rows["layer"], rows["plasticity"], yerr=sem, marker="o", capsize=2, label=component)
    left.set_xlabel("layer (block index)")
    left.set_ylabel("plasticity  ||f(x)-f(y)|| / ||x-y||")
    left.set_title("per layer")
    if left.has_data():
        left.legend(frameon=False)
        left.xaxis.get_major_locator().set_params(integer=True)
    x = np.arange(len(summary))
    colors = [f"C{BLOCK_COMPONENTS.index(c)}" if c in BLOCK_COMPONENTS else "0.6" for c in summary["component"]]
    right.bar(x, summary["plasticity"], yerr=_finite(summary["spread"]), color=colors, capsize=3)
    right.set_xticks(x, summary["component"])
    right.set_ylabel("mean over layers (± std over layers)")
    right.set_title("per component" + ("  (emb: vs pixels)" if "emb" in set(summary["component"]) else ""))
    variant = table.attrs.get("variant")
    fig.suptitle(title or f"Plasticity{f' ({variant} variant)' if variant else ''}")
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, format="png")
    return path


def _finite(values: pd.Series | None) -> np.ndarray | None:
    """A column as floats with NaN as 0 (error bars), None staying None."""
    return None if values is None else np.nan_to_num(pd.to_numeric(values, errors="coerce").to_numpy(dtype=float))
