"""Datasets for finetuning and plasticity: the registry of named datasets, splits, batches, training
augmentations, the fractal images, the JPEG image cache, and the files a cluster's nodes are sent."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "datasets": [
            "load_dataset",
            "decode_dataset",
            "num_classes",
            "list_datasets",
            "check_dataset_name",
            "register_dataset",
            "resolve_augmentation",
        ],
        "decoded": ["InMemory"],
        "fractals": ["fractal_dataset"],
        "splits": ["Splits", "SmallImages"],
        "transforms": ["register_augmentation", "augmentation", "prepare_images"],
        "staging": ["Files", "Staged", "stage", "localize", "needed"],
    },
)
