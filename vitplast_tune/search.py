"""Building and running (or resuming) a Ray Tune search over component subsets and hyperparameters.

``run(options)`` is the whole job: validate everything before any Ray or MLflow work, compute the
plasticity table once on the driver, open the MLflow parent run, start or join Ray, run the
Tuner (OptunaSearch / grid / random, ASHA or median stopping), then analyse and summarise.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from ray.tune import Callback
from ray.tune.search.optuna import OptunaSearch

from vitplast_tune import data, models, spaces
from vitplast_tune.errors import SearchInterrupted, UserError
from vitplast_tune.trial import trial_config

SEARCH_FILE = "vitplast_search.json"
EXPERIMENT = "vitplast_tune"


@dataclass
class SearchOptions:
    """What the command line controls; ``settings`` override the space file's defaults."""

    space: str = "component_subsets"
    name: str | None = None
    storage: str | None = None
    tracking_uri: str | None = None
    address: str | None = None
    num_samples: int | None = None
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    resources_per_trial: dict[str, float] = field(default_factory=dict)
    max_concurrent: int | None = None
    seed: int = 0
    resume: bool = False
    max_failures: int = 2
    settings: dict[str, Any] = field(default_factory=dict)
    plasticity: bool = True
    plasticity_variant: str = "paper"
    plasticity_reference: str = "fractals"
    plasticity_pairs: int | None = None
    verbose: int = 1


@dataclass
class SearchPlan:
    """A validated search: everything decided, nothing started."""

    spec: spaces.SearchSpec
    options: SearchOptions
    name: str
    storage: str
    tracking_uri: str
    settings: dict[str, Any]
    decoded: data.InMemory | None = None  # a small dataset, decoded once for every trial

    @property
    def local_dir(self) -> Path | None:
        """The search's directory when storage is a local path (None for s3:// and the like)."""
        return None if _is_uri(self.storage) else Path(self.storage) / self.name


@dataclass
class SearchResult:
    """The finished search: its trials (one row each) and where everything lies."""

    plan: SearchPlan
    trials: pd.DataFrame
    parent_run_id: str
    elapsed_s: float
    correlations: pd.DataFrame | None = None


# ----------------------------------------------------------------------------- validation


def default_storage() -> Path:
    """Where searches are stored when ``--storage`` is not given: ``~/vitplast_tune_results``."""
    return Path.home() / "vitplast_tune_results"


def prepare(options: SearchOptions) -> SearchPlan:
    """Validate the space, settings, resources and paths; raise UserError on the first problem.

    Starts nothing: no Ray, no MLflow run, no model download.
    """
    spec = spaces.load_space(options.space).with_overrides(num_samples=options.num_samples)
    settings = _settings(spec, options)
    _check_resources(options)
    decoded = _check_data(settings)
    if options.plasticity:
        from vitplast_tune.plasticity import VARIANTS

        if options.plasticity_variant not in VARIANTS:
            raise UserError(f'unknown plasticity variant "{options.plasticity_variant}"; use one of {", ".join(VARIANTS)}')
        data.check_dataset_name(options.plasticity_reference)
    from vitplast_tune.cluster import storage_uri  # cluster: s3://, gs://, ... checked; file:// made a path

    storage = storage_uri(str(options.storage or default_storage()))
    if not _is_uri(storage):
        storage = str(Path(storage).expanduser().resolve())
        _check_writable(Path(storage))
    name = options.name or f"{spec.name}-{datetime.now():%Y%m%d-%H%M%S}"
    if "/" in name or name.startswith("."):
        raise UserError(f'--name "{name}" must be a plain directory name')
    tracking_uri = options.tracking_uri or _default_tracking_uri(storage)
    plan = SearchPlan(spec, options, name, storage, tracking_uri, settings, decoded)
    _check_resume(plan)
    return plan


def _settings(spec: spaces.SearchSpec, options: SearchOptions) -> dict[str, Any]:
    """The trial settings: FinetuneConfig defaults < space defaults < command line; all validated."""
    from vitplast_tune.training import FinetuneConfig

    overrides = {k: v for k, v in options.settings.items() if v is not None}
    try:
        base = FinetuneConfig.from_dict({**spec.defaults, **overrides})
        base.seed = overrides.get("seed", spec.defaults.get("seed", options.seed))
        if not base.threads:
            base.threads = max(1, int(options.cpus_per_trial))
        settings = base.to_dict()
        for config in _corner_configs(spec):
            trial_config(config, settings).validate()
    except UserError as exc:
        raise UserError(f"{exc} (settings from {spec.path.name} and the command line)") from None
    return settings


def _check_data(settings: dict[str, Any]) -> data.InMemory | None:
    """Check the model, its weights file and the dataset; return a small dataset decoded once.

    The decoded dataset (None for datasets read lazily from disk) is shared with every trial
    through the object store, so it is decoded here and nowhere else on the driver.
    """
    config = models.pretrained_data_config(settings["model"])
    models.check_weights(settings["model"], settings["weights"], settings["pretrained"])
    data.num_classes(settings["dataset"], settings.get("data_dir"))
    return data.decode_dataset(settings["dataset"], config, data_dir=settings.get("data_dir"), download=settings["download"])


def _corner_configs(spec: spaces.SearchSpec) -> list[dict[str, Any]]:
    """Configurations that touch every choice and both ends of every range."""
    base = spec.example()
    configs = [base]
    for name, p in spec.parameters.items():
        values = list(p.values) if p.kind == "choice" else [p.low, p.high] if p.kind != "constant" and p.kind != "subsets" else []
        if p.kind == "randint":
            values = [int(v) for v in values]
        configs += [{**base, name: v} for v in values]
    return configs


def _check_resources(options: SearchOptions) -> None:
    if options.cpus_per_trial < 0 or options.gpus_per_trial < 0:
        raise UserError("--cpus-per-trial and --gpus-per-trial must not be negative")
    if options.cpus_per_trial == 0 and options.gpus_per_trial == 0 and not options.resources_per_trial:
        raise UserError("a trial needs some resource: give --cpus-per-trial or --gpus-per-trial above 0")
    if options.gpus_per_trial > 1 and not float(options.gpus_per_trial).is_integer():
        raise UserError("--gpus-per-trial above 1 must be a whole number")
    if any(v < 0 for v in options.resources_per_trial.values()):
        raise UserError("custom resources per trial must not be negative")
    if options.max_concurrent is not None and options.max_concurrent < 1:
        raise UserError("--max-concurrent must be at least 1")
    if options.max_failures < 0:
        raise UserError("--max-failures must not be negative")


def _check_writable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"storage path {path} is not writable ({exc.strerror}); pass --storage DIR") from None


def _check_resume(plan: SearchPlan) -> None:
    directory = plan.local_dir
    if directory is None:
        return
    record = directory / SEARCH_FILE
    if plan.options.resume:
        if not record.is_file():
            raise UserError(f'no search "{plan.name}" to resume in {plan.storage}; check --name and --storage')
        saved = json.loads(record.read_text())
        if saved["fingerprint"] != plan.spec.fingerprint:
            raise UserError(
                f'search "{plan.name}" was started with a different space file ({saved["space_path"]}); '
                "resume it with that file, or start a new search with another --name"
            )
    elif record.exists():
        raise UserError(f'search "{plan.name}" already exists in {plan.storage}; pass --resume to continue it, or another --name')


def _default_tracking_uri(storage: str) -> str:
    root = Path(storage) if not _is_uri(storage) else default_storage()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


def _is_uri(path: str) -> bool:
    return "://" in path


# ----------------------------------------------------------------------------- running


def run(options: SearchOptions, callbacks: Sequence[Callback] = ()) -> SearchResult:
    """Validate, then run (or resume) the search and return its trials; see the module docstring."""
    plan = prepare(options)
    return execute(plan, callbacks)


def execute(plan: SearchPlan, callbacks: Sequence[Callback] = ()) -> SearchResult:
    """Run a prepared search: tracking, Ray, the Tuner, the summary records.

    ``callbacks``: extra Ray Tune callbacks (e.g. the trial timeline of scripts/bench_trial.py).
    """
    import ray
    from ray import tune

    from vitplast_tune import tracking

    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    started = time.perf_counter()
    report = measure_plasticity(plan)  # on the driver, before Ray: it also proves the weights load
    owns_ray = not ray.is_initialized()
    if owns_ray:
        _init_ray(plan.options.address)
    try:  # cluster: join and check the per-trial request before any record exists; Ray shut down on failure
        _check_cluster(plan)
        mlflow = tracking.client(plan.tracking_uri)
        parent = _parent_run(plan, mlflow, report)
        _write_record(plan, parent)
    except BaseException:
        if owns_ray:
            ray.shutdown()
        raise
    try:
        callbacks = [tracking.MlflowTracker(plan.tracking_uri, parent, _describe_trial(plan, report)), *callbacks]
        if plan.options.verbose:
            callbacks.append(Progress(plan.spec.total_trials))
        trainable = tune.with_resources(
            tune.with_parameters(finetune_trial, settings=plan.settings, decoded=plan.decoded), _trial_resources(plan.options)
        )
        tuner = _tuner(plan, trainable, callbacks)
        grid = tuner.fit()
        trials = _trial_table(grid, plan, report)
    except KeyboardInterrupt:
        mlflow.set_terminated(parent, status="KILLED")
        raise
    finally:
        if owns_ray:
            ray.shutdown()
    unfinished = _unfinished(grid, plan.spec.total_trials)
    mlflow.set_terminated(parent, status="KILLED" if unfinished else "FINISHED")
    if unfinished:
        raise SearchInterrupted(
            f"{unfinished} trial(s) unfinished; nothing is lost: continue the search with "
            f"python scripts/search.py --name {plan.name} --storage {plan.storage} --resume"
        )
    result = SearchResult(plan, trials, parent, time.perf_counter() - started)
    _log_summary(result, mlflow)
    if report is not None:
        result.correlations = analyse(result, mlflow)
    return result


def _unfinished(grid, total: int) -> int:
    """Trials of the search that neither finished nor failed (Tune stops early on Ctrl-C)."""
    return max(total - grid.num_terminated - grid.num_errors, 0)


def finetune_trial(config: dict[str, Any], settings: dict[str, Any], decoded=None) -> None:
    """The Tune trainable (see ``trial.train_trial``)."""
    from vitplast_tune.trial import train_trial

    train_trial(config, settings, decoded)


def _init_ray(address: str | None) -> None:
    import ray

    from vitplast_tune import cluster

    address = cluster.address(address)  # --address, else RAY_ADDRESS
    runtime_env = {"env_vars": {"PYTHONWARNINGS": "ignore::DeprecationWarning"}}
    if address:
        cluster.connect(address, runtime_env=runtime_env, log_to_driver=False)  # UserError when refused/unreachable
    else:
        ray.init(include_dashboard=False, runtime_env=runtime_env, log_to_driver=False, configure_logging=False)


def _check_cluster(plan: SearchPlan) -> None:
    """UserError when no node (or node type) of the cluster can ever hold one trial; see cluster.py."""
    from vitplast_tune import cluster

    cluster.preflight(_trial_resources(plan.options), plan.storage, say=print if plan.options.verbose else lambda *a: None)


def _trial_resources(options: SearchOptions) -> dict[str, float]:
    return {"cpu": options.cpus_per_trial, "gpu": options.gpus_per_trial, **options.resources_per_trial}


def _tuner(plan: SearchPlan, trainable, callbacks: list):
    from ray import tune

    spec, options = plan.spec, plan.options
    path = f"{plan.storage}/{plan.name}"
    if options.resume and tune.Tuner.can_restore(path):
        return tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True)
    search_alg = None
    param_space: dict[str, Any] = {}
    if spec.algorithm == "optuna":
        import optuna
        from optuna.samplers import TPESampler

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        search_alg = OptunaSearcher(
            space=spaces.OptunaSpace(spec), metric=spec.metric, mode=spec.mode, sampler=TPESampler(seed=options.seed)
        )
    else:
        from ray.tune.search import BasicVariantGenerator

        param_space = spaces.tune_param_space(spec)
        search_alg = BasicVariantGenerator(random_state=options.seed, max_concurrent=options.max_concurrent or 0)
    if options.max_concurrent and spec.algorithm == "optuna":
        from ray.tune.search import ConcurrencyLimiter

        search_alg = ConcurrencyLimiter(search_alg, max_concurrent=options.max_concurrent)
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            metric=spec.metric, mode=spec.mode, search_alg=search_alg, scheduler=_scheduler(plan),
            num_samples=spec.num_samples, reuse_actors=True, trial_dirname_creator=trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=plan.name, storage_path=plan.storage, callbacks=callbacks, verbose=0,
            failure_config=tune.FailureConfig(max_failures=options.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        ),
    )


def trial_dirname(trial) -> str:
    """Short trial folder names ("trial_<id>") instead of Tune's config-laden ones."""
    return f"trial_{trial.trial_id}"


class OptunaSearcher(OptunaSearch):
    """Ray Tune's OptunaSearch, telling Optuna FAIL for a trial that errored or diverged.

    The stock searcher reports an errored trial's last value as COMPLETE; a failure should not
    teach TPE that its configuration was fine.
    """

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if error or (result or {}).get("diverged"):
            result, error = None, True
        super().on_trial_complete(trial_id, result=result, error=error)


class Progress(Callback):
    """One line per finished trial and a heartbeat every 30 s, instead of Tune's large tables."""

    def __init__(self, total: int, every_s: float = 30.0):
        self.total, self.every_s = total, every_s
        self.done, self.best, self.started, self.last = 0, None, time.time(), time.time()

    def setup(self, **info) -> None:
        self.started = self.last = time.time()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.done = 1 + sum(t.status in ("TERMINATED", "ERROR") for t in trials if t is not trial)
        r = trial.last_result or {}
        name = _trial_label(trial.config)
        if r.get("diverged"):
            return self._print(f"{name}: diverged ({r.get('error', '')})")
        acc = r.get("best_val_acc")
        if acc is not None and (self.best is None or acc > self.best[0]):
            self.best = (acc, name)
        early = " (stopped early)" if r.get("step", 0) < r.get("max_steps", 0) else ""
        self._print(f"{name}: best val_acc {_pct(acc)} at step {r.get('best_step')}{early}")

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.done = 1 + sum(t.status in ("TERMINATED", "ERROR") for t in trials if t is not trial)
        self._print(f"{_trial_label(trial.config)}: failed; see its MLflow run")

    def on_step(self, iteration, trials, **info) -> None:
        if time.time() - self.last >= self.every_s:
            running = sum(t.status == "RUNNING" for t in trials)
            self._print(f"{running} running")

    def _print(self, text: str) -> None:
        self.last = time.time()
        best = f" | best so far {_pct(self.best[0])} ({self.best[1]})" if self.best else ""
        elapsed = time.strftime("%M:%S", time.gmtime(time.time() - self.started))
        print(f"[{elapsed}] {self.done}/{self.total} trials done | {text}{best}", flush=True)


def _trial_label(config: dict[str, Any]) -> str:
    lr = config.get("lr")
    return spaces.config_components(config) + (f" lr={lr:.3g}" if isinstance(lr, (int, float)) else "")


def _scheduler(plan: SearchPlan):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule

    s = plan.spec.scheduler
    if s.name == "asha":
        return ASHAScheduler(
            time_attr="step", max_t=plan.settings["max_steps"], grace_period=s.grace_period, reduction_factor=s.reduction_factor
        )
    if s.name == "median":
        return MedianStoppingRule(time_attr="step", grace_period=s.grace_period)
    return FIFOScheduler()


def _describe_trial(plan: SearchPlan, report):
    """The function that names a trial's MLflow run and gives its params and plasticity scores."""
    settings = plan.settings

    def describe(config: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, float]]:
        subset = spaces.config_components(config)
        cfg = trial_config(config, settings)
        params = {**cfg.to_dict(), "components": subset, **spaces.component_flags(subset)}
        name = f"{subset} lr={cfg.lr:.3g}" + (f" seed={cfg.seed}" if "seed" in config else "")
        return name, params, subset_scores(report, subset)

    return describe


def subset_scores(report, subset: str) -> dict[str, float]:
    """Plasticity scores of a subset from the search's plasticity report (empty when there is none)."""
    if report is None:
        return {}
    from vitplast_tune import plasticity

    return plasticity.subset_scores(report.table, subset, report.meta["component_params"])


def measure_plasticity(plan: SearchPlan):
    """The plasticity report of the search's model and data, from the cache when it was measured before."""
    if not plan.options.plasticity:
        return None
    from vitplast_tune import plasticity

    s, o = plan.settings, plan.options
    if o.verbose:
        print(f"Plasticity of {s['model']} ({o.plasticity_variant} variant): {s['dataset']} test split vs {o.plasticity_reference} ...", flush=True)
    report = plasticity.plasticity_report(
        s["model"], weights=s["weights"], pretrained=s["pretrained"], dataset=s["dataset"],
        reference=o.plasticity_reference, data_dir=s["data_dir"], download=s["download"],
        variant=o.plasticity_variant, max_pairs=o.plasticity_pairs, reuse=True,
    )  # fmt: skip
    if o.verbose:
        ranking = report.ranking.dropna(subset=["rank"]).sort_values("rank")
        order = " > ".join(f"{r.component} {r.plasticity:.3g}" for r in ranking.itertuples())
        print(f"  ranking: {order}  ({'cached' if report.meta.get('reused') else 'measured'}, {report.out_dir})", flush=True)
    return report


def _parent_run(plan: SearchPlan, mlflow, report=None) -> str:
    from vitplast_tune import tracking

    if plan.options.resume:
        existing = tracking.find_search_run(mlflow, EXPERIMENT, plan.name)
        if existing:
            mlflow.update_run(existing, status="RUNNING")
            return existing
    params = {"space": plan.spec.name, "algorithm": plan.spec.algorithm, "scheduler": plan.spec.scheduler.name,
              "num_samples": plan.spec.num_samples, "metric": plan.spec.metric, "mode": plan.spec.mode,
              "search_seed": plan.options.seed, **plan.settings}  # fmt: skip
    tags = {"vitplast.space_fingerprint": plan.spec.fingerprint, "vitplast.storage": f"{plan.storage}/{plan.name}"}
    if report is not None:
        params.update(plasticity_variant=report.meta["variant"], plasticity_reference=report.meta["reference"],
                      plasticity_pairs=report.meta["n_pairs"])  # fmt: skip
    run_id = tracking.start_search_run(mlflow, EXPERIMENT, plan.name, params, tags)
    mlflow.log_text(run_id, plan.spec.text, f"space/{plan.spec.path.name}")
    if report is not None:
        tracking.log_artifacts(mlflow, run_id, report.files.values(), "plasticity")
        means = {f"plasticity/{r.component}": r.plasticity for r in report.ranking.itertuples()}
        tracking.log_metrics(mlflow, run_id, means)
    return run_id


def _write_record(plan: SearchPlan, parent_run_id: str) -> None:
    directory = plan.local_dir
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    record = {"name": plan.name, "space_path": str(plan.spec.path), "fingerprint": plan.spec.fingerprint,
              "tracking_uri": plan.tracking_uri, "parent_run_id": parent_run_id, "settings": plan.settings}  # fmt: skip
    (directory / SEARCH_FILE).write_text(json.dumps(record, indent=2, default=str))


# ----------------------------------------------------------------------------- results


def _trial_table(grid, plan: SearchPlan, report=None) -> pd.DataFrame:
    """One row per trial: its subset, parameters, final and best metrics, status and plasticity scores.

    ``val_acc_common`` is each trial's validation accuracy at ``common_step``, the last evaluation
    every trial reached: with early stopping, the one budget all trials share.
    """
    rows, curves = [], []
    for result in grid:
        config, metrics = result.config or {}, result.metrics or {}
        subset = spaces.config_components(config)
        rows.append(
            {
                "trial_id": metrics.get("trial_id", ""),
                "components": subset,
                **{k: v for k, v in config.items() if k != "components" and k not in spaces.COMPONENT_FLAGS},
                "val_acc": metrics.get("val_acc"),
                "best_val_acc": metrics.get("best_val_acc"),
                "test_acc": metrics.get("test_acc"),
                "step": metrics.get("step"),
                "trainable_params": metrics.get("trainable_params"),
                "max_steps": plan.settings["max_steps"],
                "diverged": bool(metrics.get("diverged", 0)),
                "error": None if result.error is None else str(result.error).splitlines()[0][:200],
                **subset_scores(report, subset),
            }
        )
        curves.append(_val_curve(result))
    reached = [max(curve) for curve, row in zip(curves, rows) if curve and not row["diverged"] and row["error"] is None]
    common = min(reached) if reached else None
    for row, curve in zip(rows, curves):
        row["common_step"], row["val_acc_common"] = common, curve.get(common)
    return pd.DataFrame(rows)


def _val_curve(result) -> dict[int, float]:
    """Validation accuracy by step, from every report of a trial."""
    frame = result.metrics_dataframe
    if frame is None or "val_acc" not in frame or "step" not in frame:
        return {}
    frame = frame.dropna(subset=["step", "val_acc"])
    return dict(zip(frame["step"].astype(int), frame["val_acc"].astype(float)))


def _log_summary(result: SearchResult, mlflow) -> None:
    from vitplast_tune import tracking

    directory = result.plan.local_dir
    if directory is None or result.trials.empty:
        return
    path = directory / "trials.csv"
    result.trials.to_csv(path, index=False)
    tracking.log_artifacts(mlflow, result.parent_run_id, [path])
    best = top_trials(result, 1)
    if not best.empty:
        tracking.log_metrics(mlflow, result.parent_run_id, {"best_val_acc": best.iloc[0]["best_val_acc"],
                             "best_test_acc": best.iloc[0].get("test_acc"), "num_trials": len(result.trials)})  # fmt: skip


def analyse(result: SearchResult, mlflow) -> pd.DataFrame:
    """Plasticity vs final accuracy over the finished trials: metrics and plots on the parent run."""
    from vitplast_tune import analysis, tracking

    out = (result.plan.local_dir or default_storage() / result.plan.name) / "analysis"
    found = analysis.analyse_trials(result.trials, out)
    metrics = {"analysis/n_finished": found.n_finished}
    for row in found.correlations.itertuples():
        for stat in ("n", "spearman", "spearman_low", "spearman_high", "kendall", "kendall_low", "kendall_high"):
            metrics[f"corr/{row.target}/{row.predictor}/{stat}"] = getattr(row, stat)
    tracking.log_metrics(mlflow, result.parent_run_id, metrics)
    tracking.log_artifacts(mlflow, result.parent_run_id, found.files, "analysis")
    return found.correlations


def reanalyse(name: str, storage: str | None = None, tracking_uri: str | None = None) -> SearchResult:
    """Analyse a finished search again from its stored trial table and log to its parent run."""
    from vitplast_tune import tracking

    directory = Path(storage or default_storage()).expanduser() / name
    record_path, trials_path = directory / SEARCH_FILE, directory / "trials.csv"
    if not record_path.is_file() or not trials_path.is_file():
        raise UserError(f'no finished search "{name}" in {directory.parent}; check --name and --storage')
    record = json.loads(record_path.read_text())
    spec = spaces.load_space(record["space_path"])
    options = SearchOptions(space=record["space_path"], name=name, storage=str(directory.parent))
    plan = SearchPlan(spec, options, name, str(directory.parent), tracking_uri or record["tracking_uri"], record["settings"])
    result = SearchResult(plan, pd.read_csv(trials_path), record["parent_run_id"], 0.0)
    result.correlations = analyse(result, tracking.client(plan.tracking_uri))
    return result


def top_trials(result: SearchResult, k: int = 10) -> pd.DataFrame:
    """The ``k`` best trials by best validation accuracy (or the space's metric when it is not accuracy)."""
    trials = result.trials
    if trials.empty:
        return trials
    spec = result.plan.spec
    column = "best_val_acc" if spec.metric == "val_acc" else spec.metric
    if column not in trials:
        column = "val_acc"
    ok = trials[~trials["diverged"] & trials[column].notna()]
    return ok.sort_values(column, ascending=spec.mode == "min").head(k)


def summary(result: SearchResult, k: int = 10) -> str:
    """The text a person reads at the end: top trials, where results lie, how to open MLflow."""
    plan = result.plan
    top = top_trials(result, k)
    lines = [f"Search {plan.name}: {len(result.trials)} trials in {result.elapsed_s / 60:.1f} min "
             f"({plan.spec.algorithm}, scheduler {plan.spec.scheduler.name}, {plan.settings['model']} on {plan.settings['dataset']})"]  # fmt: skip
    failed = int(result.trials["diverged"].sum() + result.trials["error"].notna().sum()) if not result.trials.empty else 0
    if failed:
        lines.append(f"{failed} trial(s) failed or diverged; see their MLflow runs for the reason")
    if not top.empty:
        table = pd.DataFrame(
            {
                "components": top["components"],
                "lr": top["lr"].map(lambda v: f"{v:.3g}") if "lr" in top else "",
                "val_acc": top["val_acc"].map(_pct),
                "best_val_acc": top["best_val_acc"].map(_pct),
                "test_acc": top["test_acc"].map(_pct),
                "steps": top["step"].map(lambda v: "" if pd.isna(v) else int(v)),
                "trainable": top["trainable_params"].map(lambda v: "" if pd.isna(v) else f"{int(v):,}"),
            }
        )
        lines += ["", f"Top {len(top)} trials (best validation accuracy; test accuracy of its best-validation weights):",
                  table.to_string(index=False)]  # fmt: skip
    if result.correlations is not None:
        from vitplast_tune.analysis import describe_correlations

        lines += ["", "Does the plasticity of the trained subset predict accuracy? Spearman with a bootstrap 95% interval,"
                  " beside the naive baseline log(trainable parameters):", describe_correlations(result.correlations)]  # fmt: skip
    lines += ["", f"Results (Ray Tune): {plan.storage}/{plan.name}"]
    if plan.local_dir is not None:
        lines.append(f"Trial table:        {plan.local_dir / 'trials.csv'}")
    lines.append(f"MLflow runs:        mlflow ui --backend-store-uri {plan.tracking_uri} --host 127.0.0.1   (experiment '{EXPERIMENT}', parent run '{plan.name}')")
    return "\n".join(lines)


def _pct(value: Any) -> str:
    return "" if value is None or pd.isna(value) else f"{100 * float(value):.2f}%"

