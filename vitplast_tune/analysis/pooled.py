"""The criteria lab's verdict pooled across labs (tasks, and models): per lab, each predictor's Spearman difference to
log(#trainable parameters); pooled, their mean with a stratified bootstrap (each lab resampled by its own hierarchical
bootstrap, independently of the others, the mean taken replicate by replicate), judged in one family under Holm with
the single components' agreement pooled the same way (the mean Spearman over labs, its exact permutation law the
convolution of each lab's). A random-effects estimate (DerSimonian-Laird, ``statsmodels``) is shown beside as a
figure, as are the per-lab and per-model differences: only the pooled rows carry verdicts.

The pooled estimate is conditional on these labs (the stratified bootstrap treats the tasks as fixed); the
random-effects interval is the one that widens with their disagreement.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from vitplast_tune.analysis import multiple
from vitplast_tune.analysis.correlation import MIN_POINTS, interval, spearman
from vitplast_tune.analysis.lab import (
    AGREEMENT_SCORE,
    AGREEMENT_WORDS,
    LAB_PREDICTORS,
    N_BOOT,
    WORDS,
    format_p,
    predictor_statistics,
)
from vitplast_tune.analysis.resampling import runs_of
from vitplast_tune.components import BLOCK_COMPONENTS
from vitplast_tune.errors import UserError
from vitplast_tune.predictors.scores import BASELINE

POOLED_FILE = "pooled.json"


@dataclass
class LabData:
    """What the pooled verdict reads of one lab: its name, model, task and dataset, its subsets' table (with the
    predictors and ``in_verdict``), every stage's trials, and the wall minutes its searches took (as recorded)."""

    name: str
    model: str
    task: str
    dataset: str
    table: pd.DataFrame
    trials: pd.DataFrame
    qualifies: bool = True
    minutes: float = math.nan  # the wall minutes of the lab's searches, summed over its stages (``lab.json``)
    searches: int = 0


def read_lab(directory: Path) -> LabData:
    """A finished lab's files (``lab.json``, ``analysis/criteria_subsets.csv``, ``analysis/lab_trials.csv``); UserError
    naming what is missing."""
    directory = Path(directory)
    record_path, analysis = directory / "lab.json", directory / "analysis"
    files = [record_path, analysis / "criteria_subsets.csv", analysis / "lab_trials.csv"]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise UserError(
            f"lab {directory.name} in {directory.parent} is not analyzed ({missing[0].name} missing): run "
            "vitplast lab run TASK (or analyze TASK) for it first"
        )
    record = json.loads(record_path.read_text())
    table = pd.read_csv(files[1])
    table["in_verdict"] = table["in_verdict"].astype(bool)
    trials = pd.read_csv(files[2], dtype={"trial_id": str, "run_id": str})
    qualifies = bool(record.get("qualification", {}).get("qualifies", False))
    stages = record.get("stages", {})
    minutes = sum(s["seconds"] for s in stages.values()) / 60 if stages else math.nan
    where = (directory.name, record["model"], record["task"], record["dataset"])
    return LabData(*where, table, trials, qualifies, minutes, len(stages))


@dataclass
class PooledResult:
    """The pooled verdict: which labs, each predictor per lab (figures) and pooled (judged), the pooled agreement."""

    labs: list[LabData]
    per_lab: pd.DataFrame  # lab, model, task, predictor, n, spearman, baseline_spearman, diff, 95% low/high
    pooled: pd.DataFrame  # predictor, labs, diff (mean over labs), adjusted interval, level, p, Holm p, verdict; RE
    agreement: dict = field(default_factory=dict)
    family: int = 0
    alpha: float = multiple.ALPHA
    n_boot: int = N_BOOT
    excluded: list[str] = field(default_factory=list)  # labs left out: their task did not qualify


def per_lab_statistics(
    labs: list[LabData], n_boot: int, seed: int, columns: tuple[str, ...] = LAB_PREDICTORS
) -> tuple[pd.DataFrame, dict]:
    """Each predictor in each lab (``lab.predictor_statistics`` on its subsets in the verdict; lab k resampled from seed
    ``seed + k``, so the labs' resamples are independent): rows of figures, and {predictor: [samples per lab]}."""
    rows, samples = [], {}
    for k, lab in enumerate(labs):
        verdict = lab.table[lab.table["in_verdict"]].reset_index(drop=True)
        runs = runs_of(lab.trials, [(c,) for c in verdict["components"]])
        for p in (q for q in columns if q in verdict and q != BASELINE):
            s = predictor_statistics(verdict, runs, p, n_boot=n_boot, seed=seed + k, min_points=MIN_POINTS)
            low, high = multiple.percentile_interval(s.samples, 0.95) if s.samples is not None else (math.nan,) * 2
            rows.append(
                {"lab": lab.name, "model": lab.model, "task": lab.task, "predictor": p, "n": s.row["n"]}
                | {k2: s.row.get(k2, math.nan) for k2 in ("spearman", "baseline_spearman", "diff_vs_baseline")}
                | {"low": low, "high": high, "se": _spread(s.samples)}
                | {"note": s.row.get("note") or ("" if s.samples is not None else str(s.row.get("verdict", "")))}
            )
            if s.samples is not None:
                samples.setdefault(p, []).append(s.samples)
    return pd.DataFrame(rows), samples


def _spread(samples: np.ndarray | None) -> float:
    """The standard deviation of a lab's bootstrap differences over the resamples where they are defined (a binary
    predictor is constant on some), as its interval is taken; NaN with fewer than two."""
    values = multiple.defined(samples)
    return float(np.std(values)) if len(values) > 1 else math.nan


def pooled_agreement(labs: list[LabData], score: str = AGREEMENT_SCORE) -> dict:
    """The single components' agreement pooled: the mean over labs of the Spearman between their ``score`` and their
    test accuracy (each component at an interior best rate), and its exact two-sided permutation p-value: each lab's
    components permuted independently, the law of the mean the convolution of the labs' laws (``sum_law``)."""
    pairs = []
    for lab in labs:
        rows = lab.table.set_index("components")
        common = [c for c in BLOCK_COMPONENTS if c in rows.index and rows.loc[c, "position"] == "interior"]
        common = [c for c in common if np.isfinite(rows.loc[c].get(score, math.nan))]
        if len(common) >= 3:
            pairs.append((rows.loc[common, score].to_numpy(float), rows.loc[common, "mean"].to_numpy(float)))
    out = {"score": score, "labs": len(pairs), "spearman": math.nan, "p": math.nan}
    if not pairs:
        return out
    observed = float(np.mean([spearman(x, y) for x, y in pairs]))
    values, probs = sum_law([permutation_values(x, y) for x, y in pairs])
    out.update(spearman=observed, p=float(probs[np.abs(values / len(pairs)) >= abs(observed) - 1e-9].sum()))
    out["per_lab"] = [float(spearman(x, y)) for x, y in pairs]
    return out


def permutation_values(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman of ``x`` with every ordering of ``y``'s values (all ``n!``; for the few single components)."""
    orders = np.array(list(itertools.permutations(range(len(y)))))
    return spearman(np.broadcast_to(x, orders.shape), y[orders], -1)


def sum_law(laws: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The exact law of a sum of independent variables, each uniform over the given values: (values, probabilities),
    values rounded to 1e-9 so equal sums merge."""
    values, probs = np.array([0.0]), np.array([1.0])
    for law in laws:
        v, counts = np.unique(np.round(law, 9), return_counts=True)
        sums = np.round(values[:, None] + v[None, :], 9).ravel()
        weights = (probs[:, None] * (counts / counts.sum())[None, :]).ravel()
        values, inverse = np.unique(sums, return_inverse=True)
        probs = np.bincount(inverse, weights=weights)
    return values, probs


def random_effects(diffs: np.ndarray, ses: np.ndarray) -> dict:
    """DerSimonian-Laird random-effects pooling of per-lab differences with their bootstrap standard errors
    (``statsmodels.stats.meta_analysis.combine_effects``): the estimate, its 95% interval and tau^2."""
    keep = np.isfinite(diffs) & np.isfinite(ses) & (ses > 0)
    if keep.sum() < 2:
        return {"re": math.nan, "re_low": math.nan, "re_high": math.nan, "tau2": math.nan}
    from statsmodels.stats.meta_analysis import combine_effects

    res = combine_effects(diffs[keep], ses[keep] ** 2, method_re="dl")
    low, high = res.conf_int(alpha=0.05, use_t=False)[1]  # (fixed, random effects, ...): the random effects' row
    return {"re": float(res.mean_effect_re), "re_low": float(low), "re_high": float(high), "tau2": float(res.tau2)}


def pool(
    labs: list[LabData],
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    alpha: float = multiple.ALPHA,
    columns: tuple[str, ...] = LAB_PREDICTORS,
) -> PooledResult:
    """The pooled verdict of labs: per lab each predictor's difference (figures), pooled its mean over labs with the
    stratified bootstrap, judged with the pooled agreement in one Holm family; random effects beside."""
    if not labs:
        raise UserError("no lab to pool")
    per_lab, samples = per_lab_statistics(labs, n_boot, seed, columns)
    names = [p for p in columns if p in samples]
    rows, stacked = [], []
    for p in names:
        mine = per_lab[(per_lab["predictor"] == p) & per_lab["se"].notna()]
        stacked.append(np.vstack(samples[p]).mean(axis=0))
        effects = random_effects(mine["diff_vs_baseline"].to_numpy(float), mine["se"].to_numpy(float))
        rows.append({"predictor": p, "labs": len(mine), "diff": float(mine["diff_vs_baseline"].mean()), **effects})
    agreement = pooled_agreement(labs)
    estimates = [r["diff"] for r in rows] + [agreement["spearman"]]
    given = [None] * len(rows) + [agreement["p"] if np.isfinite(agreement["p"]) else None]
    judged = multiple.judge(estimates, [*stacked, None], given, alpha=alpha)
    for r, j in zip(rows, judged.itertuples()):
        r.update(low=j.low, high=j.high, level=j.level, p=j.p, p_holm=j.p_holm, verdict=WORDS.get(j.verdict, ""))
    last = judged.iloc[-1]
    agreement.update(p_holm=last["p_holm"], verdict=AGREEMENT_WORDS.get(last["verdict"], ""))
    result = PooledResult(labs, per_lab, pd.DataFrame(rows), agreement, int(judged.attrs["family"]), alpha, n_boot)
    return result


def conclusions(result: PooledResult) -> list[str]:
    """The pooled verdict's sentences, generated from its figures: which predictors rank the subsets better or worse
    than the parameter count after Holm (none is said to where no pooled adjusted interval excludes 0), the pooled
    agreement, and over which labs."""
    models = sorted({lab.model for lab in result.labs})
    tasks = sorted({lab.task for lab in result.labs})
    family = f"Holm over the {result.family} pooled verdicts, family-wise {100 * result.alpha:g}%"
    where = f"pooled over {len(result.labs)} labs ({len(models)} model(s): {', '.join(models)}; {len(tasks)} task(s): {', '.join(tasks)})"
    p = result.pooled
    better = p[p["verdict"] == "better"].sort_values("diff", ascending=False)
    worse = p[p["verdict"] == "worse"]
    out = []
    for b in better.itertuples():
        out.append(
            f"{b.predictor} ranks the subsets better than log(#trainable parameters), {where}: mean difference "
            f"{b.diff:+.2f} {interval(b.low, b.high)} at {multiple.describe_level(b.level)} ({family}, Holm p={format_p(b.p_holm, result.n_boot)})."
        )
    if better.empty:
        out.append(
            f"No predictor ranks the subsets better than log(#trainable parameters), {where} ({family}): no pooled "
            "adjusted interval lies above 0."
        )
    if len(worse):
        listed = ", ".join(f"{w.predictor} ({w.diff:+.2f})" for w in worse.itertuples())
        out.append(f"Worse than the parameter count, pooled: {listed}.")
    a = result.agreement
    if np.isfinite(a["spearman"]):
        out.append(
            f"The paper's narrower claim (the single components rank by test accuracy as by {a['score']}), pooled over "
            f"{a['labs']} labs, {a['verdict']}: mean Spearman {a['spearman']:+.2f}, exact permutation p={a['p']:.3g}, "
            f"Holm p={a['p_holm']:.3g}."
        )
    if result.excluded:
        out.append(f"Left out, their task did not qualify: {', '.join(result.excluded)}.")
    timed = [f"{lab.name} {lab.minutes:.1f} min ({lab.searches} searches)" for lab in result.labs if lab.searches]
    if timed:
        out.append(f"Each lab's searches took (wall time as recorded): {'; '.join(timed)}.")
    return out


def describe_pooled(result: PooledResult) -> str:
    """The pooled verdict as text: per lab each predictor's difference (figures, 95%), then pooled with verdicts,
    random effects beside, per model, and the sentences."""
    per = result.per_lab.copy()
    per["diff [95%]"] = [
        f"{d:+.2f} {interval(lo, hi)}" if np.isfinite(d) else note
        for d, lo, hi, note in zip(per["diff_vs_baseline"], per["low"], per["high"], per["note"])
    ]
    wide = per.pivot_table(index="predictor", columns="lab", values="diff [95%]", aggfunc="first", sort=False)
    lines = [
        "Per lab: each predictor's Spearman minus log(#trainable params)'s (hierarchical bootstrap, 95%, figures only):",
        wide.to_string(),
        "",
        f"Pooled over the labs (mean of the differences; stratified bootstrap, {result.n_boot} resamples per lab; the "
        f"interval adjusted for the {result.family} pooled verdicts, Holm, family-wise {100 * result.alpha:g}%; "
        "random effects, DerSimonian-Laird, 95%, beside):",
    ]
    for r in result.pooled.itertuples():
        lines.append(
            f"  {r.predictor:<22} labs={r.labs:<2} diff {r.diff:+.2f} {interval(r.low, r.high)} "
            f"({multiple.describe_level(r.level)}) p={format_p(r.p, result.n_boot)} "
            f"Holm p={format_p(r.p_holm, result.n_boot)} {r.verdict:<20} "
            f"random effects {r.re:+.2f} {interval(r.re_low, r.re_high)} tau^2={r.tau2:.3g}"
        )
    models = sorted(per["model"].unique())
    if len(models) > 1:
        by_model = per.groupby(["predictor", "model"], sort=False)["diff_vs_baseline"].mean().unstack()
        lines += [
            "",
            "Mean difference per model (figures only):",
            by_model.to_string(float_format=lambda v: f"{v:+.2f}"),
        ]
    lines += ["", "What it says (generated from the figures above):", *(f"  {s}" for s in conclusions(result))]
    return "\n".join(lines)


def write_pooled(result: PooledResult, out: Path) -> list[Path]:
    """``pooled.json`` (the labs, each predictor's pooled verdict, the agreement: what ``recommend`` reads),
    ``pooled.csv`` and ``pooled_per_lab.csv`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / POOLED_FILE, out / "pooled.csv", out / "pooled_per_lab.csv"]
    labs = [
        {"lab": lab.name, "model": lab.model, "task": lab.task, "dataset": lab.dataset, "minutes": lab.minutes}
        for lab in result.labs
    ]
    payload = {
        "labs": labs,
        "excluded": result.excluded,
        "family": result.family,
        "alpha": result.alpha,
        "predictors": json.loads(result.pooled.to_json(orient="records")),
        "agreement": json.loads(pd.Series(result.agreement).to_json()),
        "conclusions": conclusions(result),
    }
    files[0].write_text(json.dumps(payload, indent=2) + "\n")
    result.pooled.to_csv(files[1], index=False)
    result.per_lab.to_csv(files[2], index=False)
    return files


def pool_labs(directories: list[Path], out: Path, *, include_unqualified: bool = False, n_boot: int = N_BOOT) -> str:
    """Read the labs in ``directories``, pool those whose task qualified (all with ``include_unqualified``), write the
    files into ``out`` and return the report as text."""
    labs = [read_lab(d) for d in directories]
    kept = [lab for lab in labs if lab.qualifies or include_unqualified]
    result = pool(kept, n_boot=n_boot)
    result.excluded = [lab.name for lab in labs if not (lab.qualifies or include_unqualified)]
    files = write_pooled(result, Path(out))
    return describe_pooled(result) + f"\nfiles: {files[0].parent}"
