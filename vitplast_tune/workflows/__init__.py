"""The top floor's jobs built from searches, one verb each: a dry run (the plan, timed here, nothing started),
analyzing a finished search again, the paper's cross-dataset table of several, and checking a recommendation with a
short search. The only package above both ``run`` and ``recommend``."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "preview": ["dry_run", "capacity"],
        "reanalysis": ["reanalyze", "compare_datasets"],
        "verification": ["verify_recommendation"],
    },
)
