"""Score each component subset before training, from measurements cached per model and dataset."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "report": ["plasticity_report", "search_report", "gradient_report", "Predictors", "PlasticityReport"],
        "scores": ["aggregate_plasticity", "subset_scores", "log_trainable_params"],
    },
)
