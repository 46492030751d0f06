"""vitplast_tune: which components of a pretrained ViT to finetune, searched with Ray Tune and judged against their
plasticity (Odonnat et al., ICML 2026).

The public API, one verb each::

    import vitplast_tune as vt
    search = vt.run_search(space="component_subsets", name="quickstart")  # the whole search (or vt.SearchOptions)
    search = vt.load_search("quickstart")                                   # a recorded search, no Ray started
    search.trials, search.study, search.runs(), search.best_model()         # DataFrame, Optuna study, MLflow runs
    spec = vt.load_space("paper_grid")                                      # a validated space file
    model, metrics = vt.finetune(vt.FinetuneConfig(components="mha+fc1", lr=0.1))  # one finetuning run
    best = vt.load_best_model("quickstart")                                  # a search's best model
    model = vt.create_model("vit_testbed_patch8_32.fractal", num_classes=10)
    table = vt.compute_plasticity(model, reference_images, downstream_images)

Every mistake a user can fix raises a ``vt.UserError``, one subclass per kind. The library logs to the
``vitplast_tune`` loggers, on standard error. Importing the package starts nothing; each name loads its module on
first use.
"""

import lazy_loader as _lazy

__version__ = "0.1.0"

# The public names are listed once, in __init__.pyi (what type checkers read too); each loads its module on first use.
__getattr__, __dir__, __all__ = _lazy.attach_stub(__name__, __file__)
