"""What a search records and returns: its MLflow parent and child runs, the saved UI view, the Optuna study, the
trial table, the Pareto fronts, the summary, and the MLflow UI command; they take plain values, not the plan."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "search": ["Search"],
        "printed": ["summary"],
        "table": ["trial_table", "read_trials", "write_trials", "top_trials"],
        "study": ["write_study"],
        "trial_runs": ["MlflowTracker"],
        "view": ["View", "ui_command"],
        "pareto": ["pareto_front", "describe_pareto"],
        "ui": ["serve"],
    },
)
