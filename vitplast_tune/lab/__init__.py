"""Set up the criteria lab on offline tasks, keep its records, and judge its pre-registered verdict."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "tasks": ["Lab", "TASKS", "MODELS"],
        "qualify": ["Qualification", "describe_qualifications"],
        "preregistration": ["Preregistration", "read_preregistration"],
        "records": ["lab_trials", "LabRecords", "read_kept"],
        "design": ["Design", "read_design"],
        "analysis": ["LabAnalysis", "analyze_lab", "describe_lab"],
        "pooled": ["PooledResult", "pool"],
        "report": ["pool_folders", "analyze_folder", "describe_pooled"],
        "forest": ["forest_plots"],
    },
)
