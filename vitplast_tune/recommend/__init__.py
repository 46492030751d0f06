"""Recommend which component subsets to finetune, and check a recommendation with a short search."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "ranking": ["Recommendation", "recommend", "describe"],
    },
)
