"""The answer of a search with a finalists stage, by the one-standard-error rule (docs/architecture.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from vitplast_tune.components import ALL, HEAD
from vitplast_tune.records.table import finalist_trials, instruction, pct, top_trials
from vitplast_tune.space.files import SearchSpec

Z95 = 1.96  # a 95% interval: the mean difference ± this many standard errors
LABELS = {ALL: "full finetuning", HEAD: "the linear probe"}


@dataclass(frozen=True)
class Configuration:
    """One finalist configuration over its seeds."""

    index: int  # its number among the finalists, best first, the baselines last
    row: dict[str, Any]  # its first row of the trial table
    val: dict[int, float]  # best validation accuracy by seed, of the seeds that trained
    test: dict[int, float]  # test accuracy by seed, of the same seeds
    failed: tuple[int, ...] = ()  # the seeds that failed or diverged, left out
    baseline: str | None = None  # ``all`` or ``head`` where it is a baseline
    lr_from: str = "own"  # whose best trial its rate came from: ``own`` or the search's ``best``

    @property
    def n(self) -> int:
        """The seeds that trained."""
        return len(self.val)

    @property
    def mean_val(self) -> float:
        """Its mean validation accuracy over seeds."""
        return _mean(list(self.val.values()))

    @property
    def se_val(self) -> float:
        """The standard error of that mean (NaN with one seed)."""
        return _sd(list(self.val.values())) / math.sqrt(self.n) if self.n > 1 else math.nan

    @property
    def mean_test(self) -> float:
        """Its mean test accuracy over seeds."""
        return _mean(list(self.test.values()))

    @property
    def sd_test(self) -> float:
        """The standard deviation of its test accuracy over seeds (NaN with one seed)."""
        return _sd(list(self.test.values()))

    @property
    def params(self) -> float:
        """Its trainable parameters (infinite where unknown: never the cheaper one)."""
        value = self.row.get("trainable_params")
        return math.inf if value is None or pd.isna(value) else float(value)

    @property
    def name(self) -> str:
        """Its subset, depth and rate, in words."""
        return instruction(self.row)


@dataclass(frozen=True)
class Gain:
    """The chosen configuration's test accuracy over one baseline's, in points."""

    label: str
    kind: str  # ``itself``, ``failed`` (no seed of the baseline trained) or ``compared``
    points: float = math.nan  # the mean difference
    half: float = math.nan  # 1.96 standard errors of it; NaN with one seed
    n: int = 0
    paired: bool = False

    def said(self) -> str:
        """Put the gain in words."""
        if self.kind == "itself":
            return f"it is {self.label}"
        if self.kind == "failed":
            return f"{self.label}: every seed failed, not compared"
        interval = (
            f"95% interval {self.points - self.half:+.2f} to {self.points + self.half:+.2f}"
            if math.isfinite(self.half)
            else "one seed: no interval"
        )
        how = "paired by seed" if self.paired else "unpaired"
        return f"{self.points:+.2f} points over {self.label} ({interval}, {how}, n={self.n})"


@dataclass(frozen=True)
class FinalAnswer:
    """The finalists' answer: the configuration chosen by the one-standard-error rule and what it is compared with."""

    chosen: Configuration  # the fewest trainable parameters within one SE of the best mean
    best: Configuration  # the best mean validation accuracy
    configurations: tuple[Configuration, ...]  # each with a seed that trained, best mean first
    tied: tuple[Configuration, ...]  # the others within one SE of the best mean
    gains: tuple[Gain, ...]  # over full finetuning and over the linear probe, where they were finalists
    seeds: tuple[int, ...]  # the seeds the finalists trained on
    lost: tuple[Configuration, ...] = field(default_factory=tuple)  # those no seed of which trained

    @property
    def line(self) -> str:
        """The summary's first line: what to finetune, its test accuracy, its gains and its ties."""
        c = self.chosen
        spread = f" ± {100 * c.sd_test:.2f} (SD over {c.n} seeds)" if c.n > 1 else " (one seed: no spread)"
        gains = "; ".join(g.said() for g in self.gains)
        tied = ", ".join(t.name for t in self.tied)
        apart = (
            f"not distinguishable from {tied} (within one standard error of the best mean validation accuracy)"
            if tied
            else "no other finalist within one standard error of its mean validation accuracy"
        )
        return f"Answer: finetune {c.name}: test accuracy {pct(c.mean_test)}{spread}; {gains}; {apart}."

    def lines(self) -> list[str]:
        """Write the answer's line, how it was chosen, the baselines' rates, the seeds left out and each finalist."""
        c, b = self.chosen, self.best
        if math.isfinite(b.se_val):
            rule = (
                f"Chosen by the one-standard-error rule: of {len(self.configurations)} finalist configurations, each "
                f"trained again on seeds {', '.join(map(str, self.seeds))} at the whole budget, the one with the "
                f"fewest trainable parameters ({_count(c.params)}) whose mean validation accuracy ({pct(c.mean_val)}) "
                f"is within one standard error ({100 * b.se_val:.2f} points) of the best mean ({pct(b.mean_val)}, "
                f"{b.name})."
            )
        else:
            rule = (
                f"Chosen by the best mean validation accuracy ({pct(b.mean_val)}) of {len(self.configurations)} "
                "finalist configurations: with one seed that trained, the best has no standard error, so no "
                "configuration is within one of it."
            )
        lines = [self.line, f"  {rule}"]
        rates = [
            f"{LABELS[x.baseline]} at "
            + ("its own best trial's rate" if x.lr_from == "own" else "the best trial's rate (the search ran none)")
            for x in (*self.configurations, *self.lost)
            if x.baseline is not None
        ]
        if rates:
            lines.append("  The baselines' rates: " + "; ".join(rates) + ".")
        failed = [f"{x.name} seed {s}" for x in (*self.configurations, *self.lost) for s in x.failed]
        if failed:
            lines.append(f"  Left out (failed or diverged): {', '.join(failed)}.")
        each = [
            f"{x.name}: validation {pct(x.mean_val)}, test {pct(x.mean_test)}"
            + (f" ± {100 * x.sd_test:.2f}" if x.n > 1 else "")
            + f" (n={x.n})"
            for x in self.configurations
        ]
        return [*lines, "  Finalists (mean over seeds): " + "; ".join(each) + "."]

    def __str__(self) -> str:
        return self.line


def _configurations(trials: pd.DataFrame) -> list[Configuration]:
    """Group a trial table's finalist rows by configuration, in the finalists' order."""
    rows = finalist_trials(trials)
    if rows.empty:
        return []
    found = []
    for index, group in rows.groupby("finalist", sort=True):
        ok = ~group["diverged"].astype(bool) & group["best_val_acc"].notna()
        if "error" in group:
            ok &= group["error"].isna()
        if "over_budget" in group:
            ok &= ~group["over_budget"].fillna(False).astype(bool)
        good = group[ok]
        first = group.iloc[0].to_dict()
        lr_from = first.get("lr_from")
        found.append(
            Configuration(
                int(index),
                first,
                {int(s): float(v) for s, v in zip(good["seed"], good["best_val_acc"])},
                {int(s): float(v) for s, v in zip(good["seed"], good["test_acc"]) if pd.notna(v)},
                tuple(int(s) for s in group.loc[~ok, "seed"]),
                _baseline(first),
                lr_from if isinstance(lr_from, str) else "own",
            )
        )
    return found


def final_answer(trials: pd.DataFrame) -> FinalAnswer | None:
    """Choose the finalists' answer by the one-standard-error rule; None when no finalist trained."""
    every = _configurations(trials)
    found = sorted((c for c in every if c.n), key=lambda c: -c.mean_val)
    if not found:
        return None
    best = found[0]
    floor = best.mean_val - (best.se_val if math.isfinite(best.se_val) else 0.0)
    within = [c for c in found if c.mean_val >= floor - 1e-12]
    chosen = min(within, key=lambda c: (c.params, -c.mean_val))
    gains = tuple(_gain(chosen, x) for x in every if x.baseline is not None)
    seeds = tuple(sorted({s for c in every for s in (*c.val, *c.failed)}))
    tied = tuple(c for c in within if c is not chosen)
    return FinalAnswer(chosen, best, tuple(found), tied, gains, seeds, tuple(c for c in every if not c.n))


def answer_trial(trials: pd.DataFrame, spec: SearchSpec) -> pd.DataFrame:
    """Find the row of the trial whose weights are the search's best model; none before any trial reported.

    With finalists, it is the chosen configuration's seed of the best validation accuracy; else the best trial.
    """
    final = final_answer(trials)
    if final is None:
        return top_trials(trials, spec, 1)
    rows = finalist_trials(trials)
    chosen = rows[(rows["finalist"] == final.chosen.index) & rows["seed"].isin(list(final.chosen.val))]
    return chosen.sort_values("best_val_acc", ascending=False, kind="stable").head(1)


def _gain(chosen: Configuration, baseline: Configuration) -> Gain:
    """Compare the chosen configuration's test accuracy with a baseline's, paired by seed where the seeds match."""
    label = LABELS[baseline.baseline or ALL]
    if baseline is chosen or baseline.index == chosen.index:
        return Gain(label, "itself")
    if not baseline.test or not chosen.test:
        return Gain(label, "failed")
    if set(baseline.test) == set(chosen.test):
        diffs = [chosen.test[s] - baseline.test[s] for s in sorted(chosen.test)]
        se = _sd(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
        return Gain(label, "compared", 100 * _mean(diffs), 100 * Z95 * se, len(diffs), paired=True)
    a, b = list(chosen.test.values()), list(baseline.test.values())
    se = math.sqrt(_sd(a) ** 2 / len(a) + _sd(b) ** 2 / len(b)) if min(len(a), len(b)) > 1 else math.nan
    return Gain(label, "compared", 100 * (_mean(a) - _mean(b)), 100 * Z95 * se, min(len(a), len(b)))


def _baseline(row: dict[str, Any]) -> str | None:
    """Say which baseline a finalist's row is (full finetuning in every block, or the linear probe), or None."""
    depth = row.get("depth")
    everywhere = depth is None or (isinstance(depth, float) and math.isnan(depth)) or depth in ("", "all")
    components = row.get("components")
    return components if components == HEAD or (components == ALL and everywhere) else None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _sd(values: list[float]) -> float:
    """Return the sample standard deviation (n - 1); NaN under two values."""
    if len(values) < 2:
        return math.nan
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def _count(params: float) -> str:
    return "?" if not math.isfinite(params) else f"{int(params):,}"
