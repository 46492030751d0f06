"""Define a model family's adapter: where each component lives, and how to run the model in parts.

Every family is a pre-norm ViT; families differ in names and in what a block takes besides its tokens (``Embedded``).
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
    """The embedding output (the input of block 0), and the keyword arguments each block takes besides it."""

    tokens: Tensor
    block_kwargs: list[dict[str, Any]] = field(default_factory=list)

    def kwargs(self, block: int) -> dict[str, Any]:
        """Return block ``block``'s keyword arguments; none when the family passes none."""
        return self.block_kwargs[block] if self.block_kwargs else {}

    @classmethod
    def shared(cls, tokens: Tensor, blocks: int, **kwargs: Any) -> Embedded:
        """Build an embedding output whose ``blocks`` blocks all take the same keyword arguments, Nones left out."""
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
        """Return the position of the family's nearest class in the model's MRO, or None when it does not fit."""
        classes = self.model_classes
        return next((i for i, cls in enumerate(type(model).__mro__) if cls in classes), None)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """Return the model's blocks, in order."""
        return list(model.get_submodule(self.layout.blocks))

    def embed(self, model: nn.Module, pixels: Tensor) -> Embedded:
        """Return the input of block 0 for a batch of normalised images, with what each block takes besides it."""
        raise NotImplementedError

    def run_blocks(self, model: nn.Module, embedded: Embedded) -> Tensor:
        """Run every block in turn on the embedding output; return the tokens before the final norm."""
        x = embedded.tokens
        for i, block in enumerate(self.blocks(model)):
            x = block(x, **embedded.kwargs(i))
        return x

    def features(self, model: nn.Module, pixels: Tensor) -> Tensor:
        """Return the backbone's tokens before the final norm, which a linear probe caches."""
        return self.run_blocks(model, self.embed(model, pixels))

    def head(self, model: nn.Module, tokens: Tensor) -> Tensor:
        """Return the logits from ``features``: the final norm, pooling and head."""
        return model.forward_head(model.norm(tokens))

    def head_tokens(self, model: nn.Module) -> int | None:
        """Return how many leading tokens ``head`` reads under token pooling; None for all."""
        if getattr(model, "global_pool", None) == "token" and getattr(model, "attn_pool", None) is None:
            return int(getattr(model, "num_prefix_tokens", 1))
        return None

    def component_modules(self, block: nn.Module) -> dict[str, list[nn.Module]]:
        """Return, per block component, the submodules of ``block`` that compute it."""
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
        """Apply a block component to the embedding output ``e``: fc2 takes ``e`` zero-padded to its input width."""
        if component == "mha":
            return first_tensor(modules[0](e, **self.attention_kwargs(kwargs)))
        if component == "fc2":
            fc2 = modules[0]
            return F.linear(e, fc2.weight[:, : e.shape[-1]], fc2.bias)
        outputs = [first_tensor(m(e)) for m in modules]
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)

    def attention_kwargs(self, block_kwargs: dict[str, Any]) -> dict[str, Any]:
        """Return the keyword arguments the attention takes, from its block's."""
        return block_kwargs

    def check(self, model: nn.Module) -> list[nn.Module]:
        """Return the model's blocks after checking each has every component and an fc2 from a wider hidden layer."""
        blocks = self.blocks(model)
        if not blocks:
            raise UserError("the model has no blocks")
        for i, block in enumerate(blocks):
            fc2 = self.component_modules(block)["fc2"][0]
            if not isinstance(fc2, nn.Linear) or fc2.in_features < fc2.out_features:
                raise UserError(f"block {i}: fc2 must be an nn.Linear from the hidden width to the model width")
        return blocks

    def prepare_lora(self, model: nn.Module) -> None:
        """Ready ``model`` for LoRA on ``layout.lora``: each such layer must be called as a module."""

    def set_grad_checkpointing(self, model: nn.Module, enable: bool) -> None:
        """Turn on or off the recomputing of each block's activations in the backward pass."""
        model.set_grad_checkpointing(enable)


def first_tensor(output: Any) -> Tensor:
    """Return a module's output tensor: the first item of a tuple, as transformers' attention returns."""
    return output[0] if isinstance(output, (tuple, list)) else output


def _submodule(block: nn.Module, name: str) -> nn.Module | None:
    module: Any = block
    for part in name.split("."):
        module = getattr(module, part, None)
        if not isinstance(module, nn.Module):
            return None
    return module
