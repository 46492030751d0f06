"""Plan a search: check its options into one ``SearchPlan`` before anything starts, resume it, and estimate it."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "options": ["SearchOptions", "EXPERIMENT", "DEFAULT_SEED", "DEFAULT_MAX_FAILURES"],
        "search_plan": ["SearchPlan"],
        "planner": ["prepare"],
        "resume": ["resume_command"],
        "resources": ["ray_request"],
    },
)
