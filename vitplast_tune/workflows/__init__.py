"""The top floor's jobs built from searches, one verb each: a dry run (the plan, timed here, nothing started),
analyzing a finished search again, the paper's cross-dataset table of several, checking a recommendation with a
short search, the criteria lab's stages and the pre-registered lab run. The only package above both ``run`` and
``recommend``."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "preview": ["dry_run", "capacity"],
        "reanalysis": ["reanalyze", "compare_datasets", "cross_dataset"],
        "verification": ["verify_recommendation"],
        "lab": ["run_lab", "qualify", "analyze_lab", "ray_session"],
        "registered": ["run_registered", "RunSettings"],
    },
)
