"""The plan of a search: the space file, the flags and the files they name, validated into one ``SearchPlan`` before
anything starts (no Ray, no MLflow run, no model download). Every problem is a ``UserError``: one line, exit code 2.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from vitplast_tune.config import FinetuneConfig, trial_config
from vitplast_tune.errors import UserError
from vitplast_tune.names import check_name, default_name
from vitplast_tune.plan import checks, inputs, resume
from vitplast_tune.plan.options import (
    DEFAULT_MAX_FAILURES,
    DEFAULT_SEED,
    EXPERIMENT,
    EXPERIMENT_ENV,
    TRACKING_URI_ENV,
    SearchOptions,
    SearchPlan,
)
from vitplast_tune.space.files import SearchSpec, load_space, searched_augmentations
from vitplast_tune.storage import default_storage, is_uri, storage_uri


def prepare(options: SearchOptions) -> SearchPlan:
    """Validate the space, flags, files and resume state into a plan; raise UserError on the first problem.

    Nothing is started or written (apart from creating the storage directory): no Ray, no MLflow run.
    """
    spec = load_space(options.space).with_overrides(num_samples=options.num_samples, budgets=options.budgets)
    if spec.budgets and options.settings.get("max_steps") is not None:
        raise UserError(f"{spec.path.name} trains at step budgets {spec.budget_steps}: give --budgets, not --max-steps")
    checks.check_metric(spec)
    checks.check_resources(options)
    storage = storage_uri(str(options.storage or default_storage()))
    if not is_uri(storage):
        storage = str(Path(storage).expanduser().resolve())
        checks.check_writable(Path(storage))
    name = check_name(options.name or default_name(spec.name), storage)
    record = resume.resume_record(spec, options, storage, name)
    if record is None:
        plan, said = new_plan(spec, options, storage, name)
    else:
        plan, said = resume.resumed_plan(spec, options, storage, name, record), []
    plan.spec, plan.notes = fit_scheduler(plan.spec, plan.settings.max_steps)
    plan.notes += said
    checks.check_plasticity(options, plan.settings.dataset)
    checks.check_local_resources(options)
    reference = options.plasticity_reference if options.plasticity else None
    budget = inputs.Budget(plan.max_trainable_params, subsets(plan.spec, plan.settings))
    plan.decoded, plan.settings.augment = inputs.check_inputs(
        plan.settings, reference, budget, searched_augmentations(plan.spec)
    )
    return plan


def new_plan(spec: SearchSpec, options: SearchOptions, storage: str, name: str) -> tuple[SearchPlan, list[str]]:
    """The plan of a new search, and a note for each MLflow setting taken from the environment."""
    settings = trial_settings(spec, options)
    tracking_uri, experiment, said = mlflow_target(options, storage)
    plan = SearchPlan(
        spec,
        options,
        name,
        storage,
        tracking_uri,
        settings,
        seed=DEFAULT_SEED if options.seed is None else options.seed,
        max_failures=DEFAULT_MAX_FAILURES if options.max_failures is None else options.max_failures,
        max_concurrent=options.max_concurrent,
        experiment=experiment,
    )
    return plan, said


def subsets(spec: SearchSpec, settings: FinetuneConfig) -> tuple[str, ...]:
    """Every component subset the search's trials may train (the space's ``components``, else the settings')."""
    param = spec.parameters.get("components")
    return tuple(param.grid_values()) if param is not None else (settings.components,)


def mlflow_target(options: SearchOptions, storage: str) -> tuple[str, str, list[str]]:
    """Where a new search records: the tracking URI and experiment (the flags, else MLflow's environment variables,
    else ``sqlite:///<storage>/mlflow.db`` and ``EXPERIMENT``), and a note for each value taken from the environment."""
    env_uri, env_experiment = os.environ.get(TRACKING_URI_ENV, "").strip(), os.environ.get(EXPERIMENT_ENV, "").strip()
    tracking_uri = options.tracking_uri or env_uri or _default_tracking_uri(storage)
    experiment = options.experiment if options.experiment is not None else env_experiment or EXPERIMENT
    if not experiment.strip():
        raise UserError("--experiment must name an MLflow experiment (it is empty)")
    notes = [
        f"MLflow {what} {value} from ${env} (a flag overrides it)"
        for what, value, env, flag in (
            ("tracking URI", tracking_uri, TRACKING_URI_ENV, options.tracking_uri),
            ("experiment", experiment, EXPERIMENT_ENV, options.experiment),
        )
        if flag is None and os.environ.get(env, "").strip()
    ]
    return tracking_uri, experiment, notes


def fit_scheduler(spec: SearchSpec, max_steps: int) -> tuple[SearchSpec, list[str]]:
    """The space with its scheduler's grace period clamped to the trial budget, and the note saying so."""
    s = spec.scheduler
    if s.name == "fifo" or s.grace_period <= max_steps:
        return spec, []
    note = (
        f"scheduler grace_period {s.grace_period} is above max_steps {max_steps}: using {max_steps}, "
        "so no trial is stopped early"
    )
    return replace(spec, scheduler=replace(s, grace_period=max_steps)), [note]


def trial_settings(spec: SearchSpec, options: SearchOptions) -> FinetuneConfig:
    """The trial settings: FinetuneConfig defaults < space defaults < command line; all validated."""
    overrides = dict(options.settings)  # None is a value here (--set weights=none): a key left out keeps the space's
    seed = DEFAULT_SEED if options.seed is None else options.seed
    try:
        base = resolve_paths(FinetuneConfig.from_dict({**spec.defaults, **overrides}))
        base.seed = overrides.get("seed", spec.defaults.get("seed", seed))
        if not base.threads:
            base.threads = max(1, int(options.cpus_per_trial))
        for config in spec.corner_configs():
            trial_config(config, base).validate()
    except UserError as exc:
        raise UserError(f"{exc} (settings from {spec.path.name} and the command line)") from None
    return base


def resolve_paths(settings: FinetuneConfig) -> FinetuneConfig:
    """``settings`` with ``weights`` and ``data_dir`` as absolute paths (``~`` expanded, relative to this working
    directory): trials run elsewhere, in working directories of Tune's (and files are sent to other nodes by path)."""
    absolute = lambda path: str(Path(path).expanduser().resolve()) if path is not None else None
    return replace(settings, weights=absolute(settings.weights), data_dir=absolute(settings.data_dir))


def _default_tracking_uri(storage: str) -> str:
    root = Path(storage) if not is_uri(storage) else default_storage()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"
