"""The criteria lab on offline tasks: its tasks, models and folder layout, the stage spaces, the qualifying check (on
validation data), the pre-registration, the kept records and the estimate; ``workflows.lab`` runs its stages. And its
verdict: the design the analysis reads, a kept lab read back, each lab's figures, the family judged pooled, the report,
forest plots and the dated results page."""

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
        "design": ["Design", "read_design"],
        "kept": ["LabRecords", "read_kept"],
        "analysis": ["LabAnalysis", "analyze_lab", "describe_lab"],
        "pooled": ["PooledResult", "pool"],
        "report": ["pool_folders", "analyze_folder", "describe_pooled"],
        "forest": ["forest_plots"],
    },
)
