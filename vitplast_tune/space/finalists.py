"""Choose a search's finalists, its best configurations and the two baselines trained again on several seeds."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vitplast_tune.components import ALL, HEAD, subset_name
from vitplast_tune.config import FINALIST_KEY, NOT_SETTINGS
from vitplast_tune.errors import SpaceError
from vitplast_tune.space.baselines import BASELINES  # full finetuning and the linear probe, in every finalists stage

KEYS = ("top", "seeds")


@dataclass(frozen=True)
class Finalists:
    """Say how many configurations (``top``) the finalists stage trains again on how many ``seeds``; 0 is off."""

    top: int = 0
    seeds: int = 0

    @property
    def on(self) -> bool:
        """Tell whether the stage runs."""
        return self.top > 0 and self.seeds > 0

    @property
    def trials(self) -> int:
        """Return the most trials the stage adds: (top + the two baselines) x seeds."""
        return (self.top + len(BASELINES)) * self.seeds if self.on else 0

    def describe(self) -> str:
        """Put the stage in words, as the dry run and the docs say it."""
        if not self.on:
            return "none"
        return (
            f"the {self.top} best configuration(s), full finetuning and the linear probe, each on {self.seeds} seed(s) "
            f"at the whole step budget, never stopped early: up to {self.trials} more trials after the search's"
        )


OFF = Finalists()  # the default: a space file without the key, and either count 0


def _parse_finalists(raw: Any, where: str) -> Finalists:
    """Read a space file's ``finalists`` key, ``{top: K, seeds: N}``, or return ``OFF`` when absent."""
    if raw is None:
        return OFF
    if not isinstance(raw, dict) or set(raw) != set(KEYS):
        raise SpaceError(f"{where}: finalists must be {{top: K, seeds: N}} (0 turns the stage off), got {raw!r}")
    return Finalists(*(count(raw[key], f"{where}: finalists {key}") for key in KEYS))


@dataclass(frozen=True)
class Ended:
    """Hold a trial that ended: its config and its best validation accuracy, None when it has none that counts."""

    config: dict[str, Any]
    best_val_acc: float | None


def ended(config: dict[str, Any], result: dict[str, Any] | None, error: bool = False) -> Ended:
    """Make an ``Ended`` from a trial's config and last report."""
    r = result or {}
    acc = r.get("best_val_acc")
    failed = error or r.get("diverged") or r.get("over_budget")
    good = not failed and isinstance(acc, (int, float)) and math.isfinite(acc)
    return Ended(dict(config), float(acc) if good else None)


def identity(config: dict[str, Any]) -> str:
    """Name a configuration by its parameters less the seed, the encodings and the marks, as text."""
    kept = {k: v for k, v in config.items() if k not in (*NOT_SETTINGS, "seed")}
    kept["components"] = subset_name(kept.get("components", ALL))
    return json.dumps(kept, sort_keys=True, default=str)


def _baseline_of(config: dict[str, Any]) -> str | None:
    """Return the baseline a configuration is, ``all`` in every block or ``head``, or None."""
    subset = subset_name(config.get("components", ALL))
    everywhere = config.get("depth", "all") in ("all", "", None) and config.get("blocks") is None
    return subset if subset in BASELINES and (everywhere or subset == HEAD) else None


def choose(main: Sequence[Ended], stage: Finalists, seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Choose the finalists' configs, each with its ``seed`` and ``finalist`` mark, one seed after another.

    None come back when no trial of ``main`` reported a validation accuracy.
    """
    ranked = sorted((e for e in main if e.best_val_acc is not None), key=lambda e: -float(e.best_val_acc or 0.0))
    if not stage.on or not ranked:
        return []
    picked: list[tuple[dict[str, Any], str]] = []
    seen: set[str] = set()
    for e in ranked:
        if len(picked) < stage.top and _baseline_of(e.config) is None and identity(e.config) not in seen:
            seen.add(identity(e.config))
            picked.append((e.config, "own"))
    for name in BASELINES:
        own = next((e.config for e in ranked if _baseline_of(e.config) == name), None)
        picked.append((own, "own") if own is not None else (_as_baseline(ranked[0].config, name), "best"))
    total = len(picked) * len(seeds)
    clean = [{k: v for k, v in config.items() if k not in NOT_SETTINGS} for config, _ in picked]
    return [
        {**config, "seed": seed, FINALIST_KEY: {"index": i + 1, "of": total, "lr_from": picked[i][1]}}
        for seed in seeds
        for i, config in enumerate(clean)
    ]


def _as_baseline(config: dict[str, Any], name: str) -> dict[str, Any]:
    """Turn a configuration into a baseline: the subset ``name`` in every block, its other parameters kept."""
    made = {**config, "components": name}
    if "depth" in made:
        made["depth"] = "all"
    if "blocks" in made:
        made["blocks"] = None
    return made


def finalist_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """Return a finalist trial's mark, or None for a trial of the search."""
    mark = config.get(FINALIST_KEY)
    return mark if isinstance(mark, dict) else None


def expected_trials(main: Sequence[Ended], finalists: Sequence[dict[str, Any]], stage: Finalists) -> int:
    """Count the finalist trials a search runs, from the marks seen so far, else from ``choose``."""
    for config in finalists:
        if (mark := finalist_of(config)) is not None:
            return int(mark["of"])
    return len(choose(main, stage, range(stage.seeds)))


def count(value: Any, what: str) -> int:
    """Check a count of the stage, ``top`` or ``seeds``, an integer >= 0, naming ``what`` in the message."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpaceError(f"{what} must be an integer >= 0 (0 turns the stage off), got {value!r}")
    return value
