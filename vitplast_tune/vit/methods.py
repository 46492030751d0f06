"""How each component of a run trains (``components.METHODS``): in full, by LoRA adapters, by its biases (BitFit) or
not at all; and the way back from any method's trained weights to a plain timm model.

LoRA comes from Hugging Face peft: ``inject_adapter_in_model`` replaces the chosen ``nn.Linear`` layers of the timm
ViT in place (``blocks.0.attn.qkv`` becomes a ``lora.Linear`` holding the original as ``base_layer`` and the
adapters ``lora_A`` / ``lora_B``); the model stays what it was (a timm model, or a transformers one), and its family's
layout says which layers LoRA adapts. Merging folds ``(alpha / r) * B @ A``
into each base weight and puts the base layer back: the state dict then loads strictly into ``timm.create_model``.
peft imports transformers (seconds of imports), so it is imported only where a run trains by LoRA, never on the driver.
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

ADAPTER = "default"  # peft's adapter name: parameters are named blocks.0.attn.qkv.lora_A.default.weight


def apply_methods(model: nn.Module, cfg: FinetuneConfig) -> dict[str, int]:
    """Set a model up to train as a run's settings say: LoRA adapters injected, everything else frozen.

    Args:
        model: The model, changed in place.
        cfg: The run's settings: where ``components`` asks for LoRA (rank ``lora_rank``, ``lora_alpha``) and in
            which blocks (``depth`` or ``blocks``).

    Returns:
        The trainable parameter count per component and for the head (``freezing.freeze``).

    Raises:
        UserError: If LoRA cannot adapt the chosen layers, or peft is not installed.
    """
    family = family_of(model)
    blocks = cfg.block_indices(freezing.num_blocks(model, family.layout))
    targets = lora_targets(model, cfg.components, blocks)
    if targets:
        family.prepare_lora(model)
        inject_lora(model, targets, cfg.lora_rank, cfg.lora_alpha)
    return freezing.freeze(model, cfg.components, blocks, layout=family.layout)  # after injection (which freezes)


def lora_targets(model: nn.Module, subset: str | Mapping[str, str], blocks: Sequence[int] | None) -> list[str]:
    """The full names of the linear layers LoRA adapts (``blocks.2.attn.qkv``, ...: the family layout's ``lora``
    layers of each LoRA component, in the chosen blocks), in model order."""
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


def require_peft(subset: str | Mapping[str, str] = "") -> None:
    """Check that peft, which LoRA needs, is installed (it comes in the ``lora`` extra, not the base install).

    Args:
        subset: the subset that trains by LoRA, named in the message.

    Raises:
        UserError: naming the extra to install, when peft is not there.
    """
    if importlib.util.find_spec("peft") is None:
        what = f"{components.subset_name(subset)}: " if subset else ""
        raise UserError(f'{what}LoRA needs peft, in the lora extra: pip install "vitplast_tune[lora]" (-e ".[lora]")')


def inject_lora(model: nn.Module, targets: Iterable[str], rank: int, alpha: float) -> None:
    """Replace each named ``nn.Linear`` by peft's LoRA layer in place (adapter B starts at zero: the model is unchanged)."""
    require_peft()
    from peft import LoraConfig, inject_adapter_in_model

    # A regex is matched with re.fullmatch against each full module name: exactly these layers (a list would also
    # match any name ending in an entry).
    pattern = "|".join(re.escape(t) for t in targets)
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, target_modules=pattern, bias="none"), model)


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every LoRA adapter into its base linear layer and put that layer back: a plain timm model (the same
    object); a model without adapters is returned as it is."""
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
    """Rebuild the plain model a run trained, with its trained tensors in place and LoRA merged, in eval mode.

    Its state dict loads strictly into ``timm.create_model(cfg.model, num_classes=...)``.

    Args:
        cfg: The run's settings.
        trained: The trainable tensors the run saved (e.g. a search's best weights, of any method), by name.

    Returns:
        The model.

    Raises:
        UserError: If ``trained`` does not match the run's trainable tensors.
    """
    num_classes = _head_classes(trained, models.family_of_name(cfg.model).layout) or _num_classes(cfg)
    torch.manual_seed(cfg.seed)  # as the run built it (``training.build_run``): the same weights where none are loaded
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
    """The classes of a trained head: the rows of its last weight matrix (the classifier, after any attention pooling;
    None when the tensors hold no head)."""
    rows = None
    for name, tensor in trained.items():
        try:
            head = freezing.parameter_component(name, layout)[0] == components.HEAD
        except UserError:  # not this model's: the check of every name below says so
            continue
        if head and tensor.ndim == 2 and not freezing.is_adapter(name):
            rows = tensor.shape[0]
    return rows


def _num_classes(cfg: FinetuneConfig) -> int:
    from vitplast_tune.data import datasets

    return datasets.num_classes(cfg.dataset, data_dir=cfg.data_dir)


def trainable_parameters(cfg: FinetuneConfig) -> int:
    """Count the parameters a run trains (its subset by their methods, its blocks and the head).

    Args:
        cfg: The run's settings.

    Returns:
        The count, taken on an untrained model.
    """
    from vitplast_tune.data import datasets

    model = models.create_model(cfg.model, datasets.num_classes(cfg.dataset, data_dir=cfg.data_dir), pretrained=False)
    return sum(apply_methods(model, cfg).values())
