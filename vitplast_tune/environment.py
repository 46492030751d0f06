"""Register every environment variable the package reads, and read them only through ``read`` and ``is_set``."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    """Describe an environment variable: what it sets, what happens when it is unset, and who reads it.

    ``kind`` is ``setting`` (the user's), ``honoured`` (another project's) or ``internal`` (set while a search runs).
    """

    name: str
    what: str
    unset: str
    kind: str = "setting"
    read_by: str = ""


def _by_name(*variables: Variable) -> dict[str, Variable]:
    """Key the variables by their names, in the order given."""
    return {v.name: v for v in variables}


VARIABLES: dict[str, Variable] = _by_name(
    Variable(
        "VITPLAST_RESULTS_DIR",
        "The storage root where searches are recorded and found by name (a folder or a URI such as s3://...); "
        "--storage and storage= win.",
        "~/vitplast_tune_results",
        read_by="storage.default_storage",
    ),
    Variable(
        "VITPLAST_CACHE_DIR",
        "Where generated files live: datasets, image caches, plasticity reports, spaces given as mappings.",
        "~/.cache/vitplast_tune",
        read_by="config.cache_dir",
    ),
    Variable(
        "VITPLAST_LOG_LEVEL",
        "How much the library says on standard error: DEBUG, INFO, WARNING or ERROR; at DEBUG the commands also show "
        "Ray's and MLflow's start-up notices (as --verbose does); --quiet and --verbose win.",
        "INFO, without those notices",
        read_by="log",
    ),
    Variable(
        "VITPLAST_CLUSTER_CONFIG",
        "The Ray cluster launcher YAML whose node types a trial too large for every node may be placed on.",
        "~/ray_bootstrap_config.yaml, else the node types the cluster reports",
        read_by="run.cluster",
    ),
    Variable(
        "MLFLOW_TRACKING_URI",
        "MLflow's own: the tracking store a new search records to (--tracking-uri wins), and the store "
        "load_best_model(run_id=...) reads.",
        "sqlite:///<storage>/mlflow.db, beside the search's storage",
        "honoured",
        "plan.planner, records.best_trial, vit.best_model",
    ),
    Variable(
        "MLFLOW_ALLOW_FILE_STORE",
        "MLflow's own: true lets MLflow 3 open a tracking URI that is a folder (its file store, in maintenance mode); "
        "unset, such a URI is refused before the search starts.",
        "a folder is refused as a tracking URI",
        "honoured",
        "plan.services (through MLflow's own reader)",
    ),
    Variable(
        "MLFLOW_EXPERIMENT_NAME",
        "MLflow's own: the experiment a new search's runs go to (--experiment wins).",
        "vitplast_tune",
        "honoured",
        "plan.planner",
    ),
    Variable(
        "RAY_ADDRESS",
        "Ray's own: the cluster a search joins (--address wins; local starts a local instance).",
        "a local Ray instance, started and stopped by the search",
        "honoured",
        "plan.resources.address",
    ),
    Variable(
        "RAY_AUTH_MODE",
        "Ray's own: named in the message when a cluster refuses the driver (token authentication).",
        "unset (Ray's default)",
        "honoured",
        "run.cluster",
    ),
    Variable(
        "CUDA_VISIBLE_DEVICES",
        "CUDA's own: named in the message when a GPU asked for cannot be used.",
        "every GPU visible",
        "honoured",
        "vit.devices",
    ),
    Variable(
        "TUNE_MAX_PENDING_TRIALS_PG",
        "Ray Tune's: how many trials may wait for resources at once; set from the search's plan while it runs.",
        "set by the search (Tune's default on a cluster that does not grow)",
        "internal",
        "run.tuner",
    ),
    Variable(
        "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS",
        "Ray Tune's: its default loggers off while a search runs (MLflow is the record; Tune's TensorBoard "
        "logger would import torch into the driver).",
        "set to 1 by the search",
        "internal",
        "run.tuner",
    ),
    Variable(
        "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S",
        "Ray Tune's: its warning about syncing the experiment's state off while a search runs.",
        "set to 0 by the search",
        "internal",
        "run.tuner",
    ),
    Variable(
        "RAY_AIR_NEW_OUTPUT",
        "Ray Tune's: its older reporter, which prints no 'Configuration for experiment' box nor tables at "
        "verbose=0 / --quiet.",
        "set to 0 by the search",
        "internal",
        "run.tuner",
    ),
    Variable(
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR",
        "MLflow's: its artifact progress bar off while the package downloads a run's files.",
        "set to false for the download, yours put back after",
        "internal",
        "_compat.mlflow",
    ),
    Variable(
        "HF_HUB_OFFLINE",
        "Hugging Face's own: set (1, true, yes, on), a model whose weights (a timm tag's or an hf: hub id's) are not "
        "in the local cache is refused at once.",
        "the hub is asked, within a few seconds",
        "honoured",
        "vit.hub",
    ),
    Variable(
        "HF_ENDPOINT",
        "Hugging Face's own: the hub's address, asked before a model whose weights are not in the local cache is "
        "loaded.",
        "Hugging Face's hub",
        "honoured",
        "vit.hub",
    ),
    *(
        Variable(
            name,
            "MLflow's own: set by this package while trials run, so a tracking server that stops or stalls is "
            "noticed within minutes, not hours, and a restart within a minute is ridden out (records.tracking.BOUNDED_ENV); a value the user set is kept.",
            "MLflow's default",
            "internal",
            "records.tracking",
        )
        for name in (
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
            "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER",
            "MLFLOW_HTTP_REQUEST_TIMEOUT",
        )
    ),
    Variable(
        "_MLFLOW_SGI_NAME",
        "MLflow's own: which server `mlflow ui` runs the app under (uvicorn, waitress, gunicorn).",
        "uvicorn",
        "honoured",
        "_compat.mlflow_app",
    ),
)

# The SLURM script's own (scripts/cluster/slurm.sbatch), read by the shell, not the package.
SCRIPT_VARIABLES: dict[str, Variable] = _by_name(
    Variable(
        "VITPLAST_RUN",
        "A command prefix every Ray node and the driver run under, e.g. an Apptainer image: "
        '"apptainer exec --nv $HOME/vitplast-tune.sif".',
        "none: the job's Python",
        read_by="scripts/cluster/slurm.sbatch",
    ),
    Variable(
        "VITPLAST_RAY_PORT",
        "The Ray head's port.",
        "a free port",
        read_by="scripts/cluster/slurm.sbatch",
    ),
    Variable(
        "VITPLAST_RESULTS_DIR",
        "As above: the storage the job's search records to.",
        "~/vitplast_tune_results",
        read_by="scripts/cluster/slurm.sbatch",
    ),
)


def read(name: str, default: str | None = None) -> str | None:
    """Read a registered environment variable, else ``default``; KeyError when ``name`` is not in ``VARIABLES``."""
    if name not in VARIABLES:
        raise KeyError(f"environment variable {name} is not registered in vitplast_tune.environment.VARIABLES")
    return os.environ.get(name, default)


def is_set(name: str) -> bool:
    """Tell whether a registered environment variable is set, even to an empty value; KeyError when unregistered."""
    return read(name) is not None
