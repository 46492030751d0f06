"""Check a search's space file, flags and the files they name into one ``SearchPlan`` before anything starts.

Every problem is a ``UserError``: one line, exit code 2.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from vitplast_tune import environment
from vitplast_tune._compat import versions
from vitplast_tune._compat.mlflow import MAX_EXPERIMENT_NAME
from vitplast_tune.config import FinetuneConfig, trial_config
from vitplast_tune.errors import OptionsError, UserError, option
from vitplast_tune.lock import check_not_running
from vitplast_tune.plan import checks, finalists, inputs, resume, services, state, trials
from vitplast_tune.plan.options import (
    DEFAULT_MAX_FAILURES,
    DEFAULT_SEED,
    EXPERIMENT,
    EXPERIMENT_ENV,
    TRACKING_URI_ENV,
    SearchOptions,
)
from vitplast_tune.plan.search_plan import Running, SearchPlan
from vitplast_tune.search_names import check_name, default_name
from vitplast_tune.space.distributions import Constant
from vitplast_tune.space.files import SearchSpec, load_space, searched_augmentations
from vitplast_tune.space.objectives import with_objective
from vitplast_tune.storage import RESULTS_ENV, SEARCH_FILE, default_storage, is_uri, storage_uri


def prepare(options: SearchOptions) -> SearchPlan:
    """Check the space, flags, files and resume state into a plan.

    It starts and writes nothing: no Ray, no MLflow run, no folder.

    Args:
        options: How the search runs.

    Returns:
        The plan: everything decided, nothing started.

    Raises:
        UserError: The first problem found.
    """
    checks.check_resources(options)
    running = Running.of(options)  # what follows reads this, not the options
    checks._check_environment(running)
    checks._check_plasticity(running)
    spec = load_space(options.space).with_overrides(num_samples=options.num_samples, budgets=options.budgets)
    spec = with_objective(spec, options.objective)
    if spec.budgets and options.settings.get("max_steps") is not None:
        raise UserError(f"{spec.path.name} trains at step budgets {spec.budget_steps}: give --budgets, not --max-steps")
    storage = storage_uri(str(options.storage or default_storage()))
    local = not is_uri(storage)
    if local:
        storage = str(Path(storage).expanduser().resolve())
        checks._check_writable(Path(storage), _storage_origin(options.storage))
    name = check_name(options.name or default_name(spec.name), storage)
    directory = Path(storage) / name if local else None  # None when the search lies behind a URI
    check_not_running(directory or default_storage() / name, name)
    record = resume._resume_record(spec, options.resume, storage, name, directory)
    if record is None:
        plan, said = _new_plan(spec, options, running, storage, name)
    else:
        plan = resume.resumed_plan(spec, options, running, storage, name, record)
        said = _resumed_state(plan, directory, record)
    bucket = None if local else _storage_origin(options.storage)
    _check_services(plan, bucket, _tracking_origin(options.tracking_uri, record is not None, name))
    spec, notes = _fit_scheduler(plan.spec, plan.settings.max_steps)
    trials._check_batches(spec, plan.settings, running.resources.workers)
    checks._check_local_resources(running)
    reference = running.reference
    checks._check_reference(reference, plan.settings.dataset)
    budget = inputs.Budget(plan.max_trainable_params, _subsets(spec, plan.settings), plan.corners)
    decoded, augment = inputs.check_inputs(plan.settings, reference, budget, searched_augmentations(spec))
    settings = replace(plan.settings, augment=augment)
    notes = (*notes, *said, *versions.untested())  # note a Ray, MLflow or timm newer than tested
    return replace(plan, spec=spec, settings=settings, decoded=decoded, notes=notes)


def _new_plan(
    spec: SearchSpec, options: SearchOptions, running: Running, storage: str, name: str
) -> tuple[SearchPlan, list[str]]:
    """Make the plan of a new search, with a note for each MLflow setting taken from the environment."""
    settings, corners = _trial_settings(spec, options)
    tracking_uri, experiment, said = mlflow_target(options, storage)
    flagged = options.finalists_top is not None or options.finalists_seeds is not None
    spec, staged = finalists._fit_finalists(
        finalists._with_finalists(spec, options.finalists_top, options.finalists_seeds), flagged
    )
    said += staged
    said += [
        f"{key} given on the command line is searched by {spec.path.name}: each trial samples its own, the value "
        "given is unused"
        for key in options.settings
        if key in spec.parameters and not isinstance(spec.parameters[key], Constant)
    ]
    said += _warmup_notes(settings, corners)
    plan = SearchPlan(
        spec,
        running,
        name,
        storage,
        tracking_uri,
        settings,
        seed=DEFAULT_SEED if options.seed is None else options.seed,
        max_failures=DEFAULT_MAX_FAILURES if options.max_failures is None else options.max_failures,
        max_concurrent=options.max_concurrent,
        experiment=experiment,
        corners=corners,
    )
    return plan, said


def _resumed_state(plan: SearchPlan, directory: Path | None, record: dict) -> list[str]:
    """Check the state a resumed search continues from; note when a new TPE takes over its remaining trials."""
    directory = directory or Path(plan.storage) / plan.name
    state._check_resume_state(directory, record)
    note = state._check_generator_state(directory, plan.spec.algorithm)
    return [note] if note else []


def _storage_origin(given: str | None) -> str:
    """Say where a search's storage came from, for the messages of its checks."""
    if given:
        return option("storage")
    return f"${RESULTS_ENV}" if (environment.read(RESULTS_ENV) or "").strip() else "the default storage"


def _tracking_origin(given: str | None, resumed: bool, name: str) -> str:
    """Say where a search's MLflow tracking URI came from, for the messages of ``_check_services``."""
    if resumed:
        return f"the search's record {name}/{SEARCH_FILE}"
    if given:
        return "--tracking-uri"
    if (environment.read(TRACKING_URI_ENV) or "").strip():
        return f"${TRACKING_URI_ENV}"
    return "the default, beside the storage"


def _check_services(plan: SearchPlan, storage_origin: str | None, tracking_origin: str) -> None:
    """Check that the storage and the MLflow tracking store answer within ``--connect-timeout``."""
    timeout_s = plan.running.connect_timeout_s
    if storage_origin is not None:
        services.check_storage(plan.storage, storage_origin, timeout_s)
    services.check_tracking(plan.tracking_uri, tracking_origin, timeout_s)


def _warmup_notes(settings: FinetuneConfig, corners: tuple[FinetuneConfig, ...]) -> list[str]:
    """Note a trial whose warm-up lasts its whole budget or more: its learning rate never reaches lr."""
    long = {(c.warmup, c.max_steps) for c in corners}
    long = sorted((w, m) for w, m in long | {(settings.warmup, settings.max_steps)} if w >= m)
    if not long:
        return []
    warmup, steps = long[0]
    return [
        f"warm-up of {warmup} steps with max_steps {steps}: the learning rate rises for the whole budget and never "
        "reaches lr; set warmup_steps (or warmup_fraction) below max_steps"
    ]


def _subsets(spec: SearchSpec, settings: FinetuneConfig) -> tuple[str, ...]:
    """Return every component subset the search's trials may train."""
    param = spec.parameters.get("components")
    return tuple(param.grid_values()) if param is not None else (settings.components,)


def mlflow_target(options: SearchOptions, storage: str) -> tuple[str, str, list[str]]:
    """Decide a new search's MLflow tracking URI and experiment, with a note for each taken from the environment.

    Each is the flag's, else MLflow's environment variable's, else ``sqlite:///<storage>/mlflow.db`` and ``EXPERIMENT``.
    UserError when the experiment is empty or longer than MLflow takes.
    """
    env_uri = (environment.read(TRACKING_URI_ENV) or "").strip()
    env_experiment = (environment.read(EXPERIMENT_ENV) or "").strip()
    tracking_uri = options.tracking_uri or env_uri or _default_tracking_uri(storage)
    experiment = options.experiment if options.experiment is not None else env_experiment or EXPERIMENT
    if not experiment.strip():
        raise UserError("--experiment must name an MLflow experiment (it is empty)")
    if len(experiment) > MAX_EXPERIMENT_NAME:  # MLflow would refuse it with a traceback once Ray is up
        given = option("experiment") if options.experiment is not None else f"${EXPERIMENT_ENV}"
        raise OptionsError(
            f"{given} is {len(experiment)} characters long; MLflow takes experiment names of at most "
            f"{MAX_EXPERIMENT_NAME} characters"
        )
    notes = [
        f"MLflow {what} {value} from ${env} (a flag overrides it)"
        for what, value, env, flag, given in (
            ("tracking URI", tracking_uri, TRACKING_URI_ENV, options.tracking_uri, env_uri),
            ("experiment", experiment, EXPERIMENT_ENV, options.experiment, env_experiment),
        )
        if flag is None and given
    ]
    return tracking_uri, experiment, notes


def _fit_scheduler(spec: SearchSpec, max_steps: int) -> tuple[SearchSpec, list[str]]:
    """Clamp the scheduler's grace period to the trial budget, with a note when it does."""
    s = spec.scheduler
    if s.name == "fifo" or s.grace_period <= max_steps:
        return spec, []
    note = (
        f"scheduler grace_period {s.grace_period} is above max_steps {max_steps}: using {max_steps}, "
        "so no trial is stopped early"
    )
    return replace(spec, scheduler=replace(s, grace_period=max_steps)), [note]


def _trial_settings(spec: SearchSpec, options: SearchOptions) -> tuple[FinetuneConfig, tuple[FinetuneConfig, ...]]:
    """Merge the trial settings (FinetuneConfig < space defaults < command line) and the corners' settings."""
    overrides = dict(options.settings)  # None is a value here (--set weights=none): a key left out keeps the space's
    seed = DEFAULT_SEED if options.seed is None else options.seed
    try:
        base = _resolve_paths(FinetuneConfig.from_dict({**spec.defaults, **overrides}))
        base.seed = overrides.get("seed", spec.defaults.get("seed", seed))
        if not base.threads:
            base.threads = max(1, int(options.cpus_per_trial))
        base.validate()  # a setting the space searches too (--set components=...) is checked all the same
        corners = tuple(trial_config(config, base).validate() for config in spec.corner_configs())
    except UserError as exc:
        raise UserError(f"{exc} (settings from {spec.path.name} and the command line)") from None
    return base, corners


def _resolve_paths(settings: FinetuneConfig) -> FinetuneConfig:
    """Make ``weights`` and ``data_dir`` absolute, since trials run in Tune's working folders and other nodes."""
    absolute = lambda path: str(Path(path).expanduser().resolve()) if path is not None else None
    return replace(settings, weights=absolute(settings.weights), data_dir=absolute(settings.data_dir))


def _default_tracking_uri(storage: str) -> str:
    root = Path(storage) if not is_uri(storage) else default_storage().expanduser().resolve()
    return f"sqlite:///{root / 'mlflow.db'}"
