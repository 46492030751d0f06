"""Pick a model's family by its class; ``register`` adds an adapter of your own, which wins for its classes."""

from __future__ import annotations

from torch import nn

from vitplast_tune.errors import UserError
from vitplast_tune.freezing import Layout
from vitplast_tune.vit.families import hf, timm_beit, timm_eva, timm_naflex, timm_relpos, timm_vit
from vitplast_tune.vit.families.base import Family

_FAMILIES: list[Family] = [
    timm_vit.FAMILY,
    timm_eva.FAMILY,
    timm_beit.FAMILY,
    timm_relpos.FAMILY,
    timm_naflex.FAMILY,
    *hf.FAMILIES,
]


def families() -> list[Family]:
    """Return every registered family, in the order they are tried."""
    return list(_FAMILIES)


def register(family: Family) -> Family:
    """Add ``family`` before the others, so that it can take over a class they adapt, and return it."""
    if any(f.name == family.name for f in _FAMILIES):
        raise ValueError(f"a family named {family.name!r} is registered already")
    _FAMILIES.insert(0, family)
    return family


def get_family(name: str) -> Family:
    """Return the registered family called ``name``."""
    for family in _FAMILIES:
        if family.name == name:
            return family
    raise UserError(f'unknown model family "{name}"; the families are {", ".join(f.name for f in _FAMILIES)}')


def family_of(model: nn.Module) -> Family:
    """Return the family whose model class is nearest the model's own in its class hierarchy."""
    ranked = [(rank, i, f) for i, f in enumerate(_FAMILIES) if (rank := f.rank(model)) is not None]
    if not ranked:
        raise UserError(f"the model is {_unsupported(type(model).__name__)}")
    return min(ranked, key=lambda item: item[:2])[2]


def layout_of(model: nn.Module) -> Layout:
    """Return where ``model``'s components live: its family's ``freezing.Layout``."""
    return family_of(model).layout


def _unsupported(kind: str) -> str:
    """Describe a model of no supported family, and name the families that are."""
    names = ", ".join(f.name for f in _FAMILIES)
    return f"a {kind}, of no supported model family; supported: {names} (docs/models.md says which models each covers)"
