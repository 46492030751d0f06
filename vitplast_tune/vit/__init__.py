"""The torch side: build models, finetune a run, measure plasticity and gradients, pretrain the testbed."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "models": ["create_model", "check_weights", "data_config", "pretrained_data_config"],
        "training": ["finetune", "Finetuned", "DivergedError"],
        "devices": ["resolve_device", "resolve_precision", "DeviceError"],
        "plasticity": ["compute_plasticity"],
        "methods": ["plain_model"],
        "best_model": ["load_best_model"],
        "pretraining": ["pretrain_testbed"],
        "gradients": ["gradient_table"],
    },
)
