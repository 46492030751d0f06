"""The plan of a search: the space file, the flags and the files they name, validated into one ``SearchPlan`` before
anything starts (no Ray, no MLflow run, no model download). Every problem is a ``UserError``: one line, exit code 2.
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
from vitplast_tune.names import check_name, default_name
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
from vitplast_tune.space.distributions import Constant
from vitplast_tune.space.files import SearchSpec, load_space, searched_augmentations
from vitplast_tune.space.objectives import with_objective
from vitplast_tune.storage import RESULTS_ENV, SEARCH_FILE, default_storage, is_uri, storage_uri


def prepare(options: SearchOptions) -> SearchPlan:
    """Validate the space, flags, files and resume state into a plan.

    Nothing is started or written: no Ray, no MLflow run, no folder (``services`` probes leave nothing behind).

    Args:
        options: How the search runs.

    Returns:
        The plan: everything decided, nothing started.

    Raises:
        UserError: On the first problem found.
    """
    checks.check_resources(options)
    running = Running.of(options)  # how the search runs, resolved once: what follows reads it, not the options
    checks.check_environment(running)
    checks.check_plasticity(running)
    spec = load_space(options.space).with_overrides(num_samples=options.num_samples, budgets=options.budgets)
    spec = with_objective(spec, options.objective)
    if spec.budgets and options.settings.get("max_steps") is not None:
        raise UserError(f"{spec.path.name} trains at step budgets {spec.budget_steps}: give --budgets, not --max-steps")
    storage = storage_uri(str(options.storage or default_storage()))
    local = not is_uri(storage)
    if local:
        storage = str(Path(storage).expanduser().resolve())
        checks.check_writable(Path(storage), storage_origin(options.storage))
    name = check_name(options.name or default_name(spec.name), storage)
    directory = Path(storage) / name if local else None  # the search's folder (None: it lies behind a URI)
    check_not_running(directory or default_storage() / name, name)
    record = resume.resume_record(spec, options.resume, storage, name, directory)
    if record is None:
        plan, said = new_plan(spec, options, running, storage, name)
    else:
        plan = resume.resumed_plan(spec, options, running, storage, name, record)
        said = resumed_state(plan, directory, record)
    bucket = None if local else storage_origin(options.storage)
    check_services(plan, bucket, tracking_origin(options.tracking_uri, record is not None, name))
    spec, notes = fit_scheduler(plan.spec, plan.settings.max_steps)
    trials.check_batches(spec, plan.settings, running.resources.workers)
    checks.check_local_resources(running)
    reference = running.reference
    checks.check_reference(reference, plan.settings.dataset)
    budget = inputs.Budget(plan.max_trainable_params, subsets(spec, plan.settings), plan.corners)
    decoded, augment = inputs.check_inputs(plan.settings, reference, budget, searched_augmentations(spec))
    settings = replace(plan.settings, augment=augment)
    notes = (*notes, *said, *versions.untested())  # a Ray, MLflow or timm newer than its internals were read from
    return replace(plan, spec=spec, settings=settings, decoded=decoded, notes=notes)


def new_plan(
    spec: SearchSpec, options: SearchOptions, running: Running, storage: str, name: str
) -> tuple[SearchPlan, list[str]]:
    """The plan of a new search, and a note for each MLflow setting taken from the environment."""
    settings, corners = trial_settings(spec, options)
    tracking_uri, experiment, said = mlflow_target(options, storage)
    flagged = options.finalists_top is not None or options.finalists_seeds is not None
    spec, staged = finalists.fit_finalists(
        finalists.with_finalists(spec, options.finalists_top, options.finalists_seeds), flagged
    )
    said += staged
    said += [
        f"{key} given on the command line is searched by {spec.path.name}: each trial samples its own, the value "
        "given is unused"
        for key in options.settings
        if key in spec.parameters and not isinstance(spec.parameters[key], Constant)
    ]
    said += warmup_notes(settings, corners)
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


def resumed_state(plan: SearchPlan, directory: Path | None, record: dict) -> list[str]:
    """Tune's state of a resumed search (in its folder ``directory``) checked (``state``); a note when a new TPE
    takes over its remaining trials (TPE's state moved aside)."""
    directory = directory or Path(plan.storage) / plan.name
    state.check_resume_state(directory, record)
    note = state.check_generator_state(directory, plan.spec.algorithm)
    return [note] if note else []


def storage_origin(given: str | None) -> str:
    """Say where a search's storage came from: ``--storage`` (``storage=`` from Python), ``$VITPLAST_RESULTS_DIR`` or
    the default (``~/vitplast_tune_results``), for the messages of its checks."""
    if given:
        return option("storage")
    return f"${RESULTS_ENV}" if (environment.read(RESULTS_ENV) or "").strip() else "the default storage"


def tracking_origin(given: str | None, resumed: bool, name: str) -> str:
    """Say where a search's MLflow tracking URI came from (for the messages of ``check_services``).

    Args:
        given: ``--tracking-uri`` (None: not given).
        resumed: Whether the search is resumed (its record names the URI).
        name: The search's name.

    Returns:
        The origin: the record, the flag, MLflow's environment variable or the default.
    """
    if resumed:
        return f"the search's record {name}/{SEARCH_FILE}"
    if given:
        return "--tracking-uri"
    if (environment.read(TRACKING_URI_ENV) or "").strip():
        return f"${TRACKING_URI_ENV}"
    return "the default, beside the storage"


def check_services(plan: SearchPlan, storage_origin: str | None, tracking_origin: str) -> None:
    """The storage and the MLflow tracking store must answer (``services``) within ``--connect-timeout``, each named
    with where it came from (``tracking_origin``; ``storage_origin``, None for a local folder, already checked)."""
    timeout_s = plan.running.connect_timeout_s
    if storage_origin is not None:
        services.check_storage(plan.storage, storage_origin, timeout_s)
    services.check_tracking(plan.tracking_uri, tracking_origin, timeout_s)


def warmup_notes(settings: FinetuneConfig, corners: tuple[FinetuneConfig, ...]) -> list[str]:
    """A note when some trial warms up for its whole budget or more (warm-up steps not below ``max_steps``): its
    learning rate never reaches the value searched. ``corners``: the settings of the trials at the space's corners."""
    long = {(c.warmup, c.max_steps) for c in corners}
    long = sorted((w, m) for w, m in long | {(settings.warmup, settings.max_steps)} if w >= m)
    if not long:
        return []
    warmup, steps = long[0]
    return [
        f"warm-up of {warmup} steps with max_steps {steps}: the learning rate rises for the whole budget and never "
        "reaches lr; set warmup_steps (or warmup_fraction) below max_steps"
    ]


def subsets(spec: SearchSpec, settings: FinetuneConfig) -> tuple[str, ...]:
    """Every component subset the search's trials may train (the space's ``components``, else the settings')."""
    param = spec.parameters.get("components")
    return tuple(param.grid_values()) if param is not None else (settings.components,)


def mlflow_target(options: SearchOptions, storage: str) -> tuple[str, str, list[str]]:
    """Decide where a new search records: its MLflow tracking URI and experiment.

    Each is the flag's, else MLflow's environment variable's, else ``sqlite:///<storage>/mlflow.db`` and
    ``EXPERIMENT``.

    Args:
        options: How the search runs (its ``tracking_uri`` and ``experiment``).
        storage: The search's storage, where the default tracking database lies.

    Returns:
        The tracking URI, the experiment, and a note for each value taken from the environment.

    Raises:
        UserError: The experiment given is empty, or longer than MLflow takes.
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


def fit_scheduler(spec: SearchSpec, max_steps: int) -> tuple[SearchSpec, list[str]]:
    """Clamp the space's scheduler's grace period to the trial budget.

    Args:
        spec: The space.
        max_steps: The trial budget in training steps.

    Returns:
        The space (itself when nothing needed clamping) and the note saying so (none when nothing did).
    """
    s = spec.scheduler
    if s.name == "fifo" or s.grace_period <= max_steps:
        return spec, []
    note = (
        f"scheduler grace_period {s.grace_period} is above max_steps {max_steps}: using {max_steps}, "
        "so no trial is stopped early"
    )
    return replace(spec, scheduler=replace(s, grace_period=max_steps)), [note]


def trial_settings(spec: SearchSpec, options: SearchOptions) -> tuple[FinetuneConfig, tuple[FinetuneConfig, ...]]:
    """The trial settings (FinetuneConfig defaults < space defaults < command line) and those of the trials at the
    space's corners (``SearchSpec.corner_configs``); all validated."""
    overrides = dict(options.settings)  # None is a value here (--set weights=none): a key left out keeps the space's
    seed = DEFAULT_SEED if options.seed is None else options.seed
    try:
        base = resolve_paths(FinetuneConfig.from_dict({**spec.defaults, **overrides}))
        base.seed = overrides.get("seed", spec.defaults.get("seed", seed))
        if not base.threads:
            base.threads = max(1, int(options.cpus_per_trial))
        base.validate()  # a setting the space searches too (--set components=...) is checked all the same
        corners = tuple(trial_config(config, base).validate() for config in spec.corner_configs())
    except UserError as exc:
        raise UserError(f"{exc} (settings from {spec.path.name} and the command line)") from None
    return base, corners


def resolve_paths(settings: FinetuneConfig) -> FinetuneConfig:
    """``settings`` with ``weights`` and ``data_dir`` as absolute paths (``~`` expanded, relative to this working
    directory): trials run elsewhere, in working directories of Tune's (and files are sent to other nodes by path)."""
    absolute = lambda path: str(Path(path).expanduser().resolve()) if path is not None else None
    return replace(settings, weights=absolute(settings.weights), data_dir=absolute(settings.data_dir))


def _default_tracking_uri(storage: str) -> str:
    root = Path(storage) if not is_uri(storage) else default_storage().expanduser().resolve()
    return f"sqlite:///{root / 'mlflow.db'}"
