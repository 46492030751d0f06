"""Set up how each component trains (in full, by LoRA, by its biases or not at all), and merge back to a plain model.

LoRA comes from peft, which imports transformers, so peft is imported only where a run trains by LoRA.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from vitplast_tune import components, freezing
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import UserError
from vitplast_tune.vit import models
from vitplast_tune.vit.families.registry import family_of


def apply_methods(model: nn.Module, cfg: FinetuneConfig) -> dict[str, int]:
    """Set a model up to train as a run's settings say, and return its trainable parameters per component."""
    family = family_of(model)
    blocks = cfg.block_indices(freezing.num_blocks(model, family.layout))
    targets = lora_targets(model, cfg.components, blocks)
    if targets:
        family.prepare_lora(model)
        inject_lora(model, targets, cfg.lora_rank, cfg.lora_alpha)
    return freezing.freeze(model, cfg.components, blocks, layout=family.layout)  # after injection, which freezes


def lora_targets(model: nn.Module, subset: str | Mapping[str, str], blocks: Sequence[int] | None) -> list[str]:
    """List the full names of the linear layers LoRA adapts, in model order."""
    layout = family_of(model).layout
    chosen = [c for c, m in components.parse_methods(subset).items() if m == components.LORA]
    wanted: set[str] = set()
    for i in range(freezing.num_blocks(model, layout)):
        for c in chosen if blocks is None or i in blocks else ():
            layers = freezing.lora_layers(model, c, i, layout)
            if not layers:
                raise UserError(f"LoRA on {c}: block {i} has none of {', '.join(layout.lora[c])} ({layout.family})")
            wanted.update(layers)
    found = [name for name, _ in model.named_modules() if name in wanted]
    odd = [name for name in found if not isinstance(model.get_submodule(name), nn.Linear)]
    if odd:
        raise UserError(f"LoRA needs nn.Linear layers at {', '.join(odd)}")
    return found


def _require_peft(subset: str | Mapping[str, str] = "") -> None:
    """Raise UserError, naming the ``lora`` extra, when peft is missing."""
    if importlib.util.find_spec("peft") is None:
        what = f"{components.subset_name(subset)}: " if subset else ""
        raise UserError(f'{what}LoRA needs peft, in the lora extra: pip install "vitplast_tune[lora]" (-e ".[lora]")')


def inject_lora(model: nn.Module, targets: Iterable[str], rank: int, alpha: float) -> None:
    """Replace each named ``nn.Linear`` by peft's LoRA layer in place; B starts at zero, so the model is unchanged."""
    _require_peft()
    from peft import LoraConfig, inject_adapter_in_model

    # peft fullmatches a regex against each module name; a list would also match names ending in an entry.
    pattern = "|".join(re.escape(t) for t in targets)
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, target_modules=pattern, bias="none"), model)


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every LoRA adapter into its base layer, put that layer back, and return the model."""
    if "peft" not in sys.modules:  # no adapter can have been injected
        return model
    from peft.tuners.lora import LoraLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge(safe_merge=True)  # W <- W + (alpha / r) * B @ A, checked for NaN
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module.get_base_layer())
    if hasattr(model, "peft_config"):  # inject_adapter_in_model leaves this attribute behind
        del model.peft_config
    return model


def plain_model(cfg: FinetuneConfig, trained: Mapping[str, torch.Tensor]) -> nn.Module:
    """Rebuild the plain model a run trained, with its trained tensors and LoRA merged, in eval mode.

    Its state dict loads strictly into ``timm.create_model(cfg.model, num_classes=...)``.

    Args:
        cfg: The run's settings.
        trained: The tensors the run trained, by name.

    Returns:
        The model.

    Raises:
        UserError: ``trained`` does not fit the run's trainable tensors.
    """
    num_classes = _head_classes(trained, models._family_of_name(cfg.model).layout) or _num_classes(cfg)
    torch.manual_seed(cfg.seed)  # as build_run seeds it, so unloaded weights match
    model = models.create_model(cfg.model, num_classes, pretrained=cfg.pretrained, weights=cfg.weights)
    apply_methods(model, cfg)
    params = dict(model.named_parameters())
    unknown = sorted(set(trained) - set(params))
    unknown += sorted(k for k in set(trained) & set(params) if params[k].shape != trained[k].shape)
    if unknown:
        raise UserError(
            f"the trained weights do not fit {cfg.model} trained as {cfg.components}: unknown names or other shapes "
            f"{', '.join(unknown[:3])}{' ...' if len(unknown) > 3 else ''}; they belong to another model or method"
        )
    with torch.no_grad():
        for name, tensor in trained.items():
            params[name].copy_(tensor)
    model = merge_lora(model).requires_grad_(True)
    return model.eval()


def _head_classes(trained: Mapping[str, torch.Tensor], layout: freezing.Layout) -> int | None:
    """Return the rows of a trained head's last weight matrix, or None when there is no head."""
    rows = None
    for name, tensor in trained.items():
        try:
            head = freezing.parameter_component(name, layout)[0] == components.HEAD
        except UserError:  # not this model's: the check below says so
            continue
        if head and tensor.ndim == 2 and not freezing.is_adapter(name):
            rows = tensor.shape[0]
    return rows


def _num_classes(cfg: FinetuneConfig) -> int:
    from vitplast_tune.data import datasets

    return datasets.num_classes(cfg.dataset, data_dir=cfg.data_dir)


def trainable_parameters(cfg: FinetuneConfig) -> int:
    """Count the parameters a run trains, on an untrained model."""
    from vitplast_tune.data import datasets

    model = models.create_model(cfg.model, datasets.num_classes(cfg.dataset, data_dir=cfg.data_dir), pretrained=False)
    return sum(apply_methods(model, cfg).values())
