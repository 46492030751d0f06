"""The criteria lab on offline tasks: its tasks, models and folder layout, the stage spaces, the qualifying check (on
validation data), the pre-registration, the kept records and the estimate; ``workflows.lab`` runs its stages."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "tasks": ["Lab", "TASKS", "MODELS", "read_lab_record"],
        "stages": ["base_space", "stage_space"],
        "qualify": ["Qualification", "at_best_rate", "describe_qualifications"],
        "preregistration": ["Preregistration", "read_preregistration"],
        "records": ["kept_tables", "write_kept", "lab_trials"],
        "estimate": ["Estimate", "describe_estimates"],
    },
)
