"""Datasets for finetuning and plasticity: the registry, splits, batches, transforms, fractals, caches and staging."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "datasets": ["load_dataset", "num_classes", "list_datasets", "register_dataset"],
        "decoded": ["InMemory"],
        "fractals": ["fractal_dataset"],
        "splits": ["Splits"],
        "transforms": ["register_augmentation"],
    },
)
