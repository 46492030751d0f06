"""Define every option of a search once, in ``SearchOptions``, with the defaults of how a search runs.

The command line's flags, its ``--help``, the resume command and ``run_search``'s keywords are all made from it.
``config.FinetuneConfig`` holds the defaults of what a trial does.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, fields, replace
from typing import Any

import yaml

from vitplast_tune.config import PAPER_MODEL, PLASTICITY_VARIANTS, PRECISIONS, cache_dir, parse_setting
from vitplast_tune.errors import OptionsError, did_you_mean, option, speaking_flags
from vitplast_tune.space.files import SearchSpec
from vitplast_tune.space.objectives import OBJECTIVES
from vitplast_tune.type_checks import check_types

EXPERIMENT = "vitplast_tune"  # the MLflow experiment a search logs to unless --experiment or MLFLOW_EXPERIMENT_NAME
# MLflow's own environment variables, honoured as defaults (flags win).
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_SEED = 0
DEFAULT_MAX_FAILURES = 2
DEFAULT_CONNECT_TIMEOUT_S = 30.0


# The groups of options, in the order ``vitplast search --help`` lists them.
GROUPS = {
    "search": "the search",
    "trial": "what every trial does (default: the space file's defaults)",
    "where": "where trials run and results go",
    "plasticity": "plasticity",
}
# The options that are settings of every trial (FinetuneConfig fields): ``settings`` gathers them (``--set`` too).
TRIAL_SETTINGS = (
    "model",
    "weights",
    "dataset",
    "data_dir",
    "download",
    "augment",
    "max_steps",
    "batch_size",
    "eval_every",
    "precision",
)


def _option(default: Any = None, help: str = "", *, group: str, flag: str | None = None, **argparse: Any) -> Any:
    """Make a field of ``SearchOptions`` that holds its group, flag, help and argparse keywords."""
    resume = argparse.pop("resume", False)
    metadata = {"group": group, "flag": flag, "help": help, "argparse": argparse, "resume": resume}
    if default in (dict, list):  # a mutable default: a new one for each instance
        return field(default_factory=default, metadata=metadata)
    return field(default=default, metadata=metadata)


def _space_file(space: Any) -> str:
    """Keep a space as a file's name or path; a mapping is written once to the cache, named by its content."""
    if isinstance(space, SearchSpec):
        return str(space.path)
    if isinstance(space, Mapping):
        text = yaml.safe_dump(dict(space), sort_keys=False)
        folder = cache_dir() / "spaces"
        path = folder / f"space-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
        if not path.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / f".{path.name}.{os.getpid()}.tmp"
            partial.write_text(text)
            os.replace(partial, path)
        return str(path)
    if isinstance(space, (str, os.PathLike)):
        return str(space)
    raise OptionsError(
        f"{option('space', space)}: a space is a shipped name, a path to a .yaml file, a mapping of the space file's "
        "keys or a SearchSpec"
    )


@dataclass
class SearchOptions:
    """How a search runs: every option of ``vitplast search`` and every keyword of ``run_search``.

    Each field's metadata holds its flag, group and help. ``settings`` override the space file's defaults, and the
    trial options (``model``, ``dataset``, ...) join them; a setting given None is a value, and one left out keeps the
    file's. ``seed`` and ``max_failures`` left None mean the defaults for a new search and the recorded values for a
    resumed one. Only ``space`` is given by position.

    Attributes:
        space: A shipped space's name, a .yaml path, a mapping of a space file's keys or a ``SearchSpec``.
        name: The search's name (None: ``<space>-<date>``).
        resume: Continue the interrupted search ``name`` with its recorded settings.
        num_samples: The number of trials, or a grid's repeats (None: the space file's).
        finalists_top: The best configurations trained again after the trials (0: none; None: the space file's).
        finalists_seeds: The seeds each finalist trains on (None: the space file's).
        seed: The seed of the search algorithm, and the training seed unless the space sets one.
        objective: accuracy, accuracy_per_gpu_hour or pareto (None: the space file's metric).
        verbose: The progress output (0: no lines; 2: also DEBUG messages and Ray's and MLflow's notices).
        max_steps: Training steps per trial.
        budgets: Step budgets of a grid, analyzed apart; the i-th replaces the space's i-th.
        batch_size: The training batch size.
        eval_every: Evaluate and report every this many steps.
        model: A timm model's name, or ``hf:<hub id or folder>``.
        weights: Local weights for ``model``, instead of the hub.
        dataset: The dataset.
        data_dir: Where the dataset lies (None: ``~/.cache/vitplast_tune/data``).
        download: Download the dataset when missing.
        augment: The training augmentation (None: the space file's, else the dataset's).
        precision: The training precision (auto: bf16 where the GPU has it, else fp16 on CUDA, fp32 on the CPU).
        settings: Any trial settings (FinetuneConfig fields), over the space file's.
        storage: Where Ray Tune's results go: a local folder or a URI (None: ``~/vitplast_tune_results``).
        tracking_uri: The MLflow tracking URI (None: MLFLOW_TRACKING_URI, else ``sqlite:///<storage>/mlflow.db``).
        experiment: The MLflow experiment (None: MLFLOW_EXPERIMENT_NAME, else ``EXPERIMENT``).
        address: The Ray cluster to join (None: RAY_ADDRESS, else a local Ray).
        connect_timeout_s: How long to wait for the tracking store, the storage and the cluster's head.
        cpus_per_trial: CPUs per trial, also its torch threads.
        gpus_per_trial: GPUs per trial; a fraction shares a GPU, 2 or more train data-parallel.
        workers_per_trial: Data-parallel workers per trial (0: one per GPU).
        placement: Pack a trial's workers on few nodes, or spread them.
        resources_per_trial: Custom Ray resources per trial.
        max_concurrent: The most trials at once (None: as many as resources allow).
        max_failures: Retries of a trial that crashes, from its last checkpoint.
        max_trainable_params: The parameter budget (None: the space file's).
        plasticity: Measure plasticity and its correlation with accuracy.
        plasticity_variant: paper or in_network.
        plasticity_reference: The reference dataset paired with the downstream test split.
        plasticity_pairs: The most image pairs for plasticity (None: all).

    Raises:
        OptionsError: A trial option and ``settings`` give one setting two values.
        SpaceError: ``space`` is none of the kinds above.
    """

    space: Any = _option(
        "component_subsets",
        "space file: a shipped name (see the README) or a path to a .yaml file",
        group="search",
    )
    _: KW_ONLY  # every option after the space by name: SearchOptions("grid.yaml", name="s", storage="results")
    name: str | None = _option(
        None, "search name (the MLflow parent run and the results folder); default: <space>-<date>", group="search"
    )
    resume: bool = _option(
        False,
        "continue the interrupted search --name, with its recorded settings",
        group="search",
        action="store_true",
    )
    num_samples: int | None = _option(
        None, "number of trials (a grid: repeats of the grid); default: the space file's", group="search", type=int
    )
    finalists_top: int | None = _option(
        None,
        "the best configurations trained again on several seeds after the trials, beside full finetuning and "
        "the linear probe (0: no finalists stage); default: the space file's finalists, else 0",
        group="search",
        type=int,
    )
    finalists_seeds: int | None = _option(
        None,
        "the seeds each finalist trains on (0: no finalists stage); default: the space file's",
        group="search",
        type=int,
    )
    seed: int | None = _option(
        None,
        f"seed of the search algorithm, and the training seed unless the space sets one (default: {DEFAULT_SEED})",
        group="search",
        type=int,
    )
    objective: str | None = _option(
        None,
        "what the search optimises: accuracy (the space file's metric), accuracy_per_gpu_hour (validation accuracy per "
        "hour of the trial's own training steps) or pareto (Optuna's multi-objective TPE over accuracy and training "
        "seconds; needs a space with scheduler: fifo); default: the space file's metric",
        group="search",
        choices=OBJECTIVES,
        resume=True,
    )
    verbose: int = _option(
        1, "no progress lines while trials run", group="search", flag="--quiet", action="store_const", const=0
    )
    max_steps: int | None = _option(None, "training steps per trial", group="trial", type=int)
    budgets: tuple[int, ...] | None = _option(
        None,
        "a grid at several step budgets, analyzed apart (e.g. --budgets 150 1000); the i-th replaces the space's "
        "i-th budget and keeps what it narrows; default: the space's budgets",
        group="trial",
        type=int,
        nargs="+",
        metavar="STEPS",
    )
    batch_size: int | None = _option(None, "training batch size", group="trial", type=int)
    eval_every: int | None = _option(None, "evaluate and report every N steps", group="trial", type=int)
    model: str | None = _option(
        None,
        f"timm model name, e.g. {PAPER_MODEL} (the paper's), or hf:<hub id or folder> (transformers; docs/models.md)",
        group="trial",
    )
    weights: str | None = _option(
        None, "local weights for --model (safetensors or torch state dict), instead of the hub", group="trial"
    )
    dataset: str | None = _option(
        None,
        "digits (offline default), cifar10, cifar100, pets, flowers102, cifar10c:<corruption>, imagefolder",
        group="trial",
    )
    data_dir: str | None = _option(None, "where the dataset lies (default ~/.cache/vitplast_tune/data)", group="trial")
    download: bool | None = _option(
        None, "download the dataset when missing (needs a network)", group="trial", action="store_true"
    )
    augment: str | None = _option(
        None,
        "training augmentation: paper (RandomResizedCrop 8-100%% + flip), light (RandomResizedCrop 80-100%%, no "
        "flip), none; default: the space file's, else the dataset's (paper for natural images, light for digits and "
        "fractals)",
        group="trial",
    )
    precision: str | None = _option(
        None,
        "auto: bf16 where the GPU supports it, else fp16 with a gradient scaler on CUDA, fp32 on CPU",
        group="trial",
        choices=PRECISIONS,
    )
    settings: dict[str, Any] = _option(
        dict,
        "any trial setting (a FinetuneConfig field), parsed by its type: --set weight_decay=0.05 --set compile=true "
        "--set blocks=9,10,11 --set weights=none; repeatable; overrides the space file",
        group="trial",
        flag="--set",
        action="append",
        type=parse_setting,
        metavar="KEY=VALUE",
    )
    storage: str | None = _option(
        None,
        "Ray Tune results: a local directory or a URI (s3://, gs://); default ~/vitplast_tune_results",
        group="where",
    )
    tracking_uri: str | None = _option(
        None, "MLflow tracking URI; default: MLFLOW_TRACKING_URI, else sqlite:///<storage>/mlflow.db", group="where"
    )
    experiment: str | None = _option(
        None,
        f"MLflow experiment of the search's runs; default: MLFLOW_EXPERIMENT_NAME, else {EXPERIMENT}",
        group="where",
    )
    address: str | None = _option(
        None,
        "join this Ray cluster (e.g. ray://host:10001 or auto); default: RAY_ADDRESS, else a local Ray instance",
        group="where",
        resume=True,
    )
    connect_timeout_s: float = _option(
        DEFAULT_CONNECT_TIMEOUT_S,
        "how long to wait for the tracking server (or database), the storage and, with --address, the cluster's "
        "head to answer",
        group="where",
        flag="--connect-timeout",
        type=float,
        metavar="SECONDS",
        resume=True,
    )
    cpus_per_trial: float = _option(
        1.0, "CPUs reserved per trial, also its torch threads", group="where", type=float, resume=True
    )
    gpus_per_trial: float = _option(
        0.0,
        "GPUs per trial; fractions such as 0.5 share a GPU, 2 or more train data-parallel (DDP), one worker per GPU",
        group="where",
        type=float,
        resume=True,
    )
    workers_per_trial: int = _option(
        0,
        "data-parallel workers per trial (a Ray Train run of torch DDP), each with its share of the trial's CPUs and "
        "GPUs (0: one per GPU of --gpus-per-trial; docs/guide/many-gpus.md)",
        group="where",
        type=int,
        resume=True,
    )
    placement: str = _option(
        "pack",
        "where a trial's workers run: pack them on as few nodes as hold them, or spread them over nodes",
        group="where",
        choices=("pack", "spread"),
        resume=True,
    )
    resources_per_trial: dict[str, float] = _option(
        dict,
        "custom Ray resources per trial, as JSON, e.g. '{\"a100\": 1}'",
        group="where",
        type=json.loads,
        resume=True,
    )
    max_concurrent: int | None = _option(
        None, "most trials running at once; default: as many as resources allow", group="where", type=int
    )
    max_failures: int | None = _option(
        None,
        "retries of a trial that crashes, from its last checkpoint (a trial of several workers: also its Train run's "
        "restarts of its workers, Train's FailureConfig); applies to a resumed search's remaining trials "
        f"(default: {DEFAULT_MAX_FAILURES})",
        group="where",
        type=int,
    )
    max_trainable_params: int | None = _option(
        None, "the parameter budget: trials over it are not trained; default: the space file's", group="where", type=int
    )
    plasticity: bool = _option(
        True,
        "skip measuring plasticity and its correlation with accuracy",
        group="plasticity",
        flag="--no-plasticity",
        action="store_false",
        resume=True,
    )
    plasticity_variant: str = _option(
        "paper",
        "paper: every component applied to the embedding output (the paper's definition); in_network: real inputs",
        group="plasticity",
        choices=PLASTICITY_VARIANTS,
        resume=True,
    )
    plasticity_reference: str = _option(
        "fractals",
        "reference dataset paired with the downstream test split (the paper uses ImageNet val)",
        group="plasticity",
        resume=True,
    )
    plasticity_pairs: int | None = _option(
        None,
        "most image pairs for plasticity (the paper uses 12,800); default: all",
        group="plasticity",
        type=int,
        resume=True,
    )

    def __post_init__(self) -> None:
        check_types(self, skip=("space", "settings"), label=option, error=OptionsError)  # each option's type
        self.space = _space_file(self.space)
        if self.budgets is not None:
            self.budgets = tuple(self.budgets)
        self.settings = self._gathered_settings()

    def _gathered_settings(self) -> dict[str, Any]:
        """Gather ``settings`` and the trial options given; refuse a setting given two values."""
        pairs = list(self.settings.items()) if isinstance(self.settings, Mapping) else self.settings
        if not isinstance(pairs, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
            raise OptionsError(f"{option('settings')} must be a mapping of settings, got {pairs!r:.60}")
        given = {key: getattr(self, key) for key in TRIAL_SETTINGS if getattr(self, key) is not None}
        gathered = dict(given)
        for key, value in pairs:
            if key in given and given[key] != value:
                said = f"--set {key}={value}" if speaking_flags() else f"settings[{key!r}]={value!r}"
                raise OptionsError(f"{said} contradicts {option(key, given[key])}; give the setting once")
            gathered[key] = value
        return gathered

    @classmethod
    def of(cls, options: SearchOptions | None = None, **keywords: Any) -> SearchOptions:
        """Make options from an instance, from keywords, or from an instance with keywords replacing some fields.

        Args:
            options: The options to start from (default: every option's default).
            **keywords: Fields of ``SearchOptions``, by the command line's names.

        Returns:
            The options.

        Raises:
            OptionsError: A keyword is no option.
        """
        names = [f.name for f in fields(cls)]
        for key in keywords:
            if key not in names:
                raise OptionsError(f'unknown option "{key}"{did_you_mean(key, names)}; the options: {", ".join(names)}')
        if options is None:
            return cls(**keywords)
        return replace(options, **keywords) if keywords else options

    def words(self, names: Sequence[str]) -> list[str]:
        """Write the command-line words that give the options ``names`` their values, for the resume command.

        Args:
            names: The options to give; those at their default are left out.

        Returns:
            The words, each flag followed by its value, a switch alone.
        """
        defaults, words = SearchOptions(), []
        for f in fields(self):
            if f.name not in names or getattr(self, f.name) == getattr(defaults, f.name):
                continue
            value, meta = getattr(self, f.name), f.metadata
            flag = meta["flag"] or f"--{f.name.replace('_', '-')}"
            if meta["argparse"].get("action") in ("store_true", "store_false"):
                words.append(flag)
            elif isinstance(value, dict):
                words += [flag, json.dumps(value)]
            else:
                words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return words


def resumed_with(options: SearchOptions) -> list[str]:
    """Return the names of the options the resume command repeats, which a search's record does not hold."""
    return [f.name for f in fields(options) if f.metadata.get("resume")]
