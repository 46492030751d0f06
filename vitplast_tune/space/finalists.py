"""The finalists stage of a search: once its trials have ended, its best configurations and the two baselines (full
finetuning, the linear probe) are trained again on several seeds at the whole step budget, as trials of the same
search, for an answer that one seed does not decide.

Here, without Ray: the space key ``finalists: {top: K, seeds: N}`` (``Finalists``; its flags and where the stage
applies: ``plan.finalists``), and which configurations its trials train, from the search's ended trials
(``choose``). ``choose`` is a pure function of those trials, so that the searcher that suggests the
finalists (``run.finalists``), the driver that counts them and the progress lines agree.

A configuration is a trial's sampled parameters less its seed: its subset (and methods), depth, learning rate and
any other parameter the space searches. The finalists are the ``top`` best configurations by best validation
accuracy other than the baselines, then full finetuning (``all`` in every block) and the linear probe (``head``),
each at the rate of its own best trial, or the best trial's when the search ran none of it; each on ``seeds`` seeds,
the same ones for every configuration, none of them the search's own training seed.
"""

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
    """How many configurations the finalists stage trains again, and on how many seeds (either 0: no stage).

    Attributes:
        top: The best configurations of the search, besides the two baselines.
        seeds: The seeds each configuration trains on.
    """

    top: int = 0
    seeds: int = 0

    @property
    def on(self) -> bool:
        """Whether the stage runs."""
        return self.top > 0 and self.seeds > 0

    @property
    def trials(self) -> int:
        """The most trials the stage adds: (top + the two baselines) x seeds; fewer when the search ended fewer
        configurations than ``top``."""
        return (self.top + len(BASELINES)) * self.seeds if self.on else 0

    def describe(self) -> str:
        """The stage in words, as the dry run and the docs say it."""
        if not self.on:
            return "none"
        return (
            f"the {self.top} best configuration(s), full finetuning and the linear probe, each on {self.seeds} seed(s) "
            f"at the whole step budget, never stopped early: up to {self.trials} more trials after the search's"
        )


OFF = Finalists()  # the default: a space file without the key, and either count 0


def parse_finalists(raw: Any, where: str) -> Finalists:
    """Read a space file's ``finalists`` key.

    Args:
        raw: The key's value: ``{top: K, seeds: N}`` (None: absent).
        where: The file, for messages.

    Returns:
        The stage (``OFF`` when absent).

    Raises:
        SpaceError: Not a mapping of ``top`` and ``seeds``, or a count that is not an integer >= 0.
    """
    if raw is None:
        return OFF
    if not isinstance(raw, dict) or set(raw) != set(KEYS):
        raise SpaceError(f"{where}: finalists must be {{top: K, seeds: N}} (0 turns the stage off), got {raw!r}")
    return Finalists(*(count(raw[key], f"{where}: finalists {key}") for key in KEYS))


@dataclass(frozen=True)
class Ended:
    """A trial of the search as the finalists are chosen from it: its config, and its best validation accuracy
    (None: it failed, diverged, was over the parameter budget or reported none)."""

    config: dict[str, Any]
    best_val_acc: float | None


def ended(config: dict[str, Any], result: dict[str, Any] | None, error: bool = False) -> Ended:
    """A trial that ended, from its config and its last report (``error``: it crashed).

    Args:
        config: The trial's config.
        result: Its last report (None: none).
        error: Whether it ended with an error.

    Returns:
        The trial as ``choose`` reads it.
    """
    r = result or {}
    acc = r.get("best_val_acc")
    failed = error or r.get("diverged") or r.get("over_budget")
    good = not failed and isinstance(acc, (int, float)) and math.isfinite(acc)
    return Ended(dict(config), float(acc) if good else None)


def identity(config: dict[str, Any]) -> str:
    """A configuration's identity: its parameters less the seed, Optuna's encodings and a finalist's or reference
    trial's mark, as text."""
    kept = {k: v for k, v in config.items() if k not in (*NOT_SETTINGS, "seed")}
    kept["components"] = subset_name(kept.get("components", ALL))
    return json.dumps(kept, sort_keys=True, default=str)


def baseline_of(config: dict[str, Any]) -> str | None:
    """The baseline a configuration is (``all`` in every block, or ``head``), or None."""
    subset = subset_name(config.get("components", ALL))
    everywhere = config.get("depth", "all") in ("all", "", None) and config.get("blocks") is None
    return subset if subset in BASELINES and (everywhere or subset == HEAD) else None


def choose(main: Sequence[Ended], stage: Finalists, seeds: Sequence[int]) -> list[dict[str, Any]]:
    """The configs of the finalists' trials, in the order they are suggested: every configuration on the first seed,
    then on the next.

    Each config is its configuration's (Optuna's encodings left out) with ``seed`` and ``finalist``: its
    configuration's number (from 1, best first, the baselines last), the finalist trials in all (``of``), and where its
    rate came from (``lr_from``: ``own``, its own best trial's; ``best``, the search's best trial's).

    Args:
        main: The search's trials that ended, in the order they were suggested (ties keep it).
        stage: How many configurations and seeds.
        seeds: The seeds (``finalist_seeds``).

    Returns:
        The configs; none when no trial of the search reported a validation accuracy.
    """
    ranked = sorted((e for e in main if e.best_val_acc is not None), key=lambda e: -float(e.best_val_acc or 0.0))
    if not stage.on or not ranked:
        return []
    picked: list[tuple[dict[str, Any], str]] = []
    seen: set[str] = set()
    for e in ranked:
        if len(picked) < stage.top and baseline_of(e.config) is None and identity(e.config) not in seen:
            seen.add(identity(e.config))
            picked.append((e.config, "own"))
    for name in BASELINES:
        own = next((e.config for e in ranked if baseline_of(e.config) == name), None)
        picked.append((own, "own") if own is not None else (as_baseline(ranked[0].config, name), "best"))
    total = len(picked) * len(seeds)
    clean = [{k: v for k, v in config.items() if k not in NOT_SETTINGS} for config, _ in picked]
    return [
        {**config, "seed": seed, FINALIST_KEY: {"index": i + 1, "of": total, "lr_from": picked[i][1]}}
        for seed in seeds
        for i, config in enumerate(clean)
    ]


def as_baseline(config: dict[str, Any], name: str) -> dict[str, Any]:
    """A configuration turned into a baseline: its subset ``name`` in every block, its other parameters kept."""
    made = {**config, "components": name}
    if "depth" in made:
        made["depth"] = "all"
    if "blocks" in made:
        made["blocks"] = None
    return made


def finalist_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """A finalist trial's mark (its ``index``, ``of`` and ``lr_from``), or None for a trial of the search."""
    mark = config.get(FINALIST_KEY)
    return mark if isinstance(mark, dict) else None


def expected_trials(main: Sequence[Ended], finalists: Sequence[dict[str, Any]], stage: Finalists) -> int:
    """How many finalist trials a search runs, from its trials that ended and the finalist configs seen so far.

    Args:
        main: The search's trials that ended (all of them: the stage starts after the last).
        finalists: The configs of the finalist trials made so far (their mark says how many there are in all).
        stage: The stage.

    Returns:
        The count: the marks' ``of``, else what ``choose`` makes of ``main``.
    """
    for config in finalists:
        if (mark := finalist_of(config)) is not None:
            return int(mark["of"])
    return len(choose(main, stage, range(stage.seeds)))


def count(value: Any, what: str) -> int:
    """Check a count of the stage (its ``top`` or ``seeds``).

    Args:
        value: The count given.
        what: Where it was given, for the message (``--finalists-top``, a file's key).

    Returns:
        The count.

    Raises:
        SpaceError: It is not an integer >= 0 (one line, naming ``what``).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpaceError(f"{what} must be an integer >= 0 (0 turns the stage off), got {value!r}")
    return value
