"""vitplast_tune: which components of a pretrained ViT to finetune, searched with Ray Tune and
judged against their plasticity (Odonnat et al., ICML 2026).

Modules, one concept each: ``components`` (the six names and freezing), ``models`` (timm ViTs and
the offline testbed), ``data`` (datasets and splits), ``plasticity`` (rates of change),
``spaces`` (search-space files), ``training`` / ``trial`` (one finetuning run, and as a Tune
trainable), ``search`` (the Tuner), ``tracking`` (MLflow), ``analysis`` (correlations, plots),
``cluster`` (joining Ray clusters). Importing the package starts nothing.
"""

__version__ = "0.1.0"
