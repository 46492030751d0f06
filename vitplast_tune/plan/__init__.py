"""The plan of a search: options and flags validated into one ``SearchPlan`` before anything starts, resuming, and
the dry run's estimate; nothing here starts Ray or writes an MLflow run."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "options": ["SearchOptions", "EXPERIMENT", "DEFAULT_SEED", "DEFAULT_MAX_FAILURES"],
        "search_plan": ["SearchPlan"],
        "planner": ["prepare", "mlflow_target", "fit_scheduler"],
        "resume": ["resume_command"],
        "resources": ["ray_request", "show_resources"],
    },
)
