"""Scores of each component subset known before any training (plasticity, gradient criteria, the parameter
count), measured once per model and dataset and cached."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "report": ["plasticity_report", "search_report", "gradient_report", "Predictors", "PlasticityReport"],
        "scores": ["aggregate_plasticity", "subset_scores", "log_trainable_params"],
    },
)
