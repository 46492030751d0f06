"""Run a search on Ray: the driver, the trainable, the searchers, schedulers, cluster and progress."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "driver": ["run", "execute", "analyze"],
        "trainable": ["train_trial"],
        "tuner": ["search_algorithm"],
        "optuna_search": ["OptunaSearcher"],
        "schedulers": ["scheduler"],
        "before_trials": ["measure_predictors", "measuring_worker"],
        "progress": ["Progress"],
    },
)
