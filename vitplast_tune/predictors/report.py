"""Measure a model's plasticity report once, cache it, and score subsets by what a search measured, without torch."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from vitplast_tune.components import BLOCK_COMPONENTS
from vitplast_tune.config import FinetuneConfig, PlasticityInputs, check_variant
from vitplast_tune.errors import UserError
from vitplast_tune.predictors import scores
from vitplast_tune.predictors.cache import cache_key, default_out_dir
from vitplast_tune.predictors.scores import aggregate_plasticity
from vitplast_tune.storage import replaced
from vitplast_tune.type_checks import checked

if TYPE_CHECKING:
    import torch

    from vitplast_tune.data.decoded import InMemory
    from vitplast_tune.data.staging import Staged

Runner = Callable[..., Any]  # runner(fn, **kwargs) -> fn(**kwargs), here or elsewhere (a Ray worker)
FILES = {"csv": "plasticity.csv", "json": "plasticity.json", "png": "plasticity.png"}


@dataclass
class PlasticityReport:
    """Hold what ``plasticity_report`` measured and wrote.

    Attributes:
        table: The plasticity of each layer, one row per component and block.
        ranking: The components ranked by their plasticity.
        out_dir: The folder the files were written in.
        files: The files written, by kind (csv, json, png).
        meta: The settings, the parameter counts per component, and ``reused`` for a report read back.
    """

    table: pd.DataFrame
    ranking: pd.DataFrame
    out_dir: Path
    files: dict[str, Path] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


@checked(batch_size=1, max_pairs=1)
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
    decoded: InMemory | None = None,
    staged: Sequence[Staged] = (),
) -> PlasticityReport:
    """Measure a model's plasticity between a reference distribution and a downstream test split, and write it.

    Args:
        model_name: The model's name, as ``vit.models.create_model`` takes it.
        weights: A weights file to load into it.
        pretrained: Whether to start from the pretrained weights.
        dataset: The downstream dataset.
        reference: The reference dataset, the pretraining distribution.
        reference_split: The reference's split: "test" or "train".
        data_dir: The data's root (None: the default data directory).
        download: Whether missing data may be downloaded.
        variant: The plasticity variant.
        batch_size: Images per forward pass.
        max_pairs: At most this many image pairs (None: no limit).
        out_dir: Where the files go (None: a cache folder keyed by the inputs).
        device: Where to measure (None: the device this task was given).
        reuse: Whether to load a report already written in ``out_dir`` for the same settings instead.
        runner: Runs the measurement elsewhere: ``runner(fn, **kwargs)`` returns ``fn(**kwargs)`` (None: here).
        decoded: The downstream dataset already decoded.
        staged: The driver's files sent to the runner's node.

    Returns:
        The report; its files are in ``out_dir``.
    """
    _check_split(reference_split)
    check_variant(variant)
    inputs = PlasticityInputs(
        model_name, weights, pretrained, dataset, reference, reference_split, data_dir, variant, max_pairs
    )
    key = cache_key(inputs)
    out = Path(out_dir).expanduser() if out_dir is not None else None
    out = out or default_out_dir(model_name, dataset, reference, variant, key)
    if reuse and (cached := _read(out, key)) is not None:
        return cached
    where = dict(download=download, batch_size=batch_size, device=device, decoded=decoded, staged=list(staged))
    measured = (runner or _here)(_measure, inputs=inputs, **where)
    return _write(out, dict(key, batch_size=batch_size), *measured)


def _check_split(reference_split: str) -> None:
    if reference_split not in ("test", "train"):
        raise UserError(f'reference split must be "test" or "train", not "{reference_split}"')


def search_report(settings: FinetuneConfig, *, reference: str, **options: Any) -> PlasticityReport:
    """Measure the plasticity report of a search's model and dataset, or read it back from the cache.

    Args:
        settings: The search's settings.
        reference: The reference dataset.
        **options: More arguments of ``plasticity_report``.

    Returns:
        The report.
    """
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


def _measure(
    inputs: PlasticityInputs, staged: Sequence = (), **kwargs: Any
) -> tuple[pd.DataFrame, dict[str, int], dict[str, Any]]:
    """Run ``vit.measure.measure_plasticity`` where it is sent, with this node's copies of ``staged`` files."""
    from vitplast_tune.data import staging
    from vitplast_tune.vit.measure import measure_plasticity

    return measure_plasticity(replace(inputs, **staging.local_paths(staged)), **kwargs)


def gradient_report(
    cfg: FinetuneConfig,
    *,
    num_batches: int = 5,
    head_seeds: int = 5,
    decoded: InMemory | None = None,
    runner: Runner | None = None,
    staged: Sequence[Staged] = (),
) -> pd.DataFrame:
    """Measure the gradient criteria of a run's pretrained model.

    Args:
        cfg: The run's settings.
        num_batches: How many of the first training batches to measure on.
        head_seeds: How many head initialisations to measure with.
        decoded: The run's dataset already decoded.
        runner: Runs the measurement elsewhere: ``runner(fn, **kwargs)`` returns ``fn(**kwargs)`` (None: here).
        staged: The driver's files the measurement reads.

    Returns:
        The gradient table: the criteria per head seed, component and layer.
    """
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
    """Describe each gradient criterion in one line: its ranking of the components and how stable it is."""
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
    """Read the report written in ``out`` for the same ``key``, or return None."""
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
) -> PlasticityReport:
    """Write the measured table as CSV, JSON and a plot, each whole or not at all."""
    files = {kind: out / name for kind, name in FILES.items()}
    ranking = aggregate_plasticity(table)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(key, n_pairs=int(table["n_pairs"].max()), **where, **parameters)
    payload = dict(meta, table=_records(table), ranking=_records(ranking))
    title = f"{key['model']}: {key['dataset']} vs {key['reference']} ({key['variant']})"
    with replaced(files["csv"]) as partial:  # the JSON, which ``_read`` matches, comes last
        table.to_csv(partial, index=False)
    with replaced(files["png"]) as partial:
        plot_plasticity(table, partial, title=title)
    with replaced(files["json"]) as partial:
        partial.write_text(json.dumps(payload, indent=2) + "\n")
    return PlasticityReport(table, ranking, out, files, meta)


@dataclass
class Predictors:
    """Hold what a search measures before any training, which scores each subset.

    Attributes:
        plasticity: The plasticity report, if measured.
        gradients: The gradient table per head seed, if measured.
    """

    plasticity: PlasticityReport | None = None
    gradients: pd.DataFrame | None = None

    def scores(self, subset: str, blocks: list[int] | None = None) -> dict[str, float]:
        """Score a subset by every predictor measured.

        Args:
            subset: The subset's name.
            blocks: The blocks whose layers the plasticity scores cover (None: every block).

        Returns:
            Each criterion's score, the gradient criteria averaged over head seeds.
        """
        out: dict[str, float] = {}
        if self.plasticity is not None:
            meta = self.plasticity.meta
            out.update(scores.subset_scores(self.plasticity.table, subset, meta["component_params"], blocks=blocks))
        if self.gradients is not None:
            out.update(scores.subset_criteria(self.gradients, subset))
        return out

    def trial_scores(self, cfg: FinetuneConfig) -> dict[str, float]:
        """Score a trial's subset over the layers of the blocks it trains in.

        Args:
            cfg: The trial's settings.

        Returns:
            The subset's ``scores``.
        """
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
    """Score each subset by the in-network plasticity criteria, measuring the report once."""
    found = search_report(settings, reference=reference, variant="in_network", max_pairs=plasticity_pairs, **measuring)
    counts = found.meta["component_params"]
    rows = {subset: scores.subset_scores(found.table, subset, counts, kind=scores.IN_NETWORK) for subset in subsets}
    return pd.DataFrame(list(rows.values()), index=list(rows), columns=scores.criteria(scores.IN_NETWORK), dtype=float)


def in_network_depth_scores(
    found: PlasticityReport, settings: FinetuneConfig, configs: Iterable[tuple[str, str]]
) -> pd.DataFrame:
    """Score each (components, depth) pair by the in-network criteria over the layers it trains."""
    counts = found.meta["component_params"]
    blocks = scores.num_blocks(found.table)
    rows = {}
    for components, depth in configs:
        cfg = settings.merged({"components": components, "depth": depth})
        blocks_trained = cfg.block_indices(blocks)
        rows[(components, depth)] = scores.subset_scores(
            found.table, components, counts, blocks_trained, scores.IN_NETWORK
        )
    index = pd.MultiIndex.from_tuples(list(rows), names=["components", "depth"])
    return pd.DataFrame(list(rows.values()), index=index, columns=scores.criteria(scores.IN_NETWORK), dtype=float)


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Convert a frame to JSON-safe records, NaN and <NA> as null."""
    return json.loads(frame.to_json(orient="records"))


def plot_plasticity(table: pd.DataFrame, path: str | Path, *, title: str | None = None) -> Path:
    """Plot plasticity per layer and per component as a PNG, and return its path."""
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
    """Return a column as floats with NaN as 0, for error bars."""
    return None if values is None else np.nan_to_num(pd.to_numeric(values, errors="coerce").to_numpy(dtype=float))
