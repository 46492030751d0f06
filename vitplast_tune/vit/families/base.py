"""What a model family's adapter says: where each component lives (its ``freezing.Layout``), how to reach the
embedding output that the paper's plasticity needs, how to run the blocks and the head on it, and how to ready a
model for LoRA and gradient checkpointing.

Every family is a pre-norm ViT: an embedding (patches, prefix tokens, positions), then blocks of norm1, attention,
norm2 and an MLP, then a final norm, pooling and a linear head; the families differ in names and in what a block
takes besides its tokens (rotary embeddings, relative position biases, attention masks), which ``Embedded`` carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitplast_tune.components import BLOCK_COMPONENTS
from vitplast_tune.errors import UserError
from vitplast_tune.freezing import Layout


@dataclass
class Embedded:
    """The embedding output (the input of block 0) and the keyword arguments that each block takes besides it."""

    tokens: Tensor
    block_kwargs: list[dict[str, Any]] = field(default_factory=list)

    def kwargs(self, block: int) -> dict[str, Any]:
        """The keyword arguments of block ``block`` (none when the family passes none)."""
        return self.block_kwargs[block] if self.block_kwargs else {}

    @classmethod
    def shared(cls, tokens: Tensor, blocks: int, **kwargs: Any) -> Embedded:
        """The embedding output whose ``blocks`` blocks all take the same keyword arguments: those of ``kwargs`` that
        are not None (a model without a shared table passes none)."""
        given = {key: value for key, value in kwargs.items() if value is not None}
        return cls(tokens, [dict(given) for _ in range(blocks)] if given else [])


class Family:
    """A model family's adapter; subclasses set ``name``, ``about``, ``layout``, ``model_classes`` and ``embed``."""

    name: str = ""
    about: str = ""  # one line: which models, for the docs and errors
    layout: Layout
    drop_path: bool = True  # whether the family's models take a stochastic depth rate (``drop_path_rate``)
    cache_features: bool = True  # whether ``head`` computes the logits from cached backbone features
    model_classes: tuple[type, ...] = ()  # the model classes (and their subclasses) this family adapts

    def rank(self, model: nn.Module) -> int | None:
        """How closely the family fits ``model``: the position of its nearest class in the model's MRO (0: exactly
        the model's class), None when it does not fit."""
        classes = self.model_classes
        return next((i for i, cls in enumerate(type(model).__mro__) if cls in classes), None)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The model's blocks, in order."""
        return list(model.get_submodule(self.layout.blocks))

    def embed(self, model: nn.Module, pixels: Tensor) -> Embedded:
        """The input of block 0 for a batch of normalised images, with what each block takes besides it."""
        raise NotImplementedError

    def run_blocks(self, model: nn.Module, embedded: Embedded) -> Tensor:
        """Every block in turn on the embedding output: the tokens before the final norm."""
        x = embedded.tokens
        for i, block in enumerate(self.blocks(model)):
            x = block(x, **embedded.kwargs(i))
        return x

    def features(self, model: nn.Module, pixels: Tensor) -> Tensor:
        """The backbone's tokens before the final norm (what a linear probe caches)."""
        return self.run_blocks(model, self.embed(model, pixels))

    def head(self, model: nn.Module, tokens: Tensor) -> Tensor:
        """The logits from ``features``: final norm, pooling and head (timm's ``forward_head``)."""
        return model.forward_head(model.norm(tokens))

    def head_tokens(self, model: nn.Module) -> int | None:
        """How many leading tokens ``head`` reads (class and other prefix tokens under token pooling); None: all."""
        if getattr(model, "global_pool", None) == "token" and getattr(model, "attn_pool", None) is None:
            return int(getattr(model, "num_prefix_tokens", 1))
        return None

    def component_modules(self, block: nn.Module) -> dict[str, list[nn.Module]]:
        """Per block component, the submodules of ``block`` that compute it (``layout.modules`` present in the block:
        one, or a gated MLP's two input projections)."""
        found = {}
        for component in BLOCK_COMPONENTS:
            modules = [m for name in self.layout.modules[component] if (m := _submodule(block, name)) is not None]
            if not modules:
                raise UserError(
                    f"a {type(block).__name__} block has none of {', '.join(self.layout.modules[component])} "
                    f"({component}): not the block layout of the {self.name} family"
                )
            found[component] = modules
        return found

    def apply(self, component: str, modules: list[nn.Module], e: Tensor, kwargs: dict[str, Any]) -> Tensor:
        """A block component applied to the embedding output ``e`` (the paper's variant of plasticity): the norms and
        the attention on ``e`` (with the block's keyword arguments), fc1 on ``e`` (a gated MLP's two projections
        joined), fc2 on ``e`` zero-padded to its input width (so only its first ``width`` input columns act)."""
        if component == "mha":
            return first_tensor(modules[0](e, **self.attention_kwargs(kwargs)))
        if component == "fc2":
            fc2 = modules[0]
            return F.linear(e, fc2.weight[:, : e.shape[-1]], fc2.bias)
        outputs = [first_tensor(m(e)) for m in modules]
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)

    def attention_kwargs(self, block_kwargs: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments the attention takes, from its block's (the same by default)."""
        return block_kwargs

    def check(self, model: nn.Module) -> list[nn.Module]:
        """The model's blocks after checking each has every component and an fc2 from a hidden width at least the
        model's (the paper's zero padding); UserError otherwise."""
        blocks = self.blocks(model)
        if not blocks:
            raise UserError("the model has no blocks")
        for i, block in enumerate(blocks):
            fc2 = self.component_modules(block)["fc2"][0]
            if not isinstance(fc2, nn.Linear) or fc2.in_features < fc2.out_features:
                raise UserError(f"block {i}: fc2 must be an nn.Linear from the hidden width to the model width")
        return blocks

    def prepare_lora(self, model: nn.Module) -> None:
        """Ready ``model`` for LoRA adapters on ``layout.lora`` (each such layer must be called as a module)."""

    def set_grad_checkpointing(self, model: nn.Module, enable: bool) -> None:
        """Recompute each block's activations in the backward pass (or not)."""
        model.set_grad_checkpointing(enable)


def first_tensor(output: Any) -> Tensor:
    """A module's output tensor (the first item of a tuple, as transformers' attention returns)."""
    return output[0] if isinstance(output, (tuple, list)) else output


def _submodule(block: nn.Module, name: str) -> nn.Module | None:
    module: Any = block
    for part in name.split("."):
        module = getattr(module, part, None)
        if not isinstance(module, nn.Module):
            return None
    return module
