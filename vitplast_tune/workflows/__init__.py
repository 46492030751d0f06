"""Run the jobs built from searches: dry runs, reanalysis, verification and the criteria lab."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "preview": ["dry_run"],
        "reanalysis": ["reanalyze", "compare_datasets", "cross_dataset"],
        "verification": ["verify_recommendation"],
        "lab": ["run_lab", "qualify", "analyze_lab", "ray_session"],
        "preregistered_labs": ["run_registered", "RunSettings"],
    },
)
