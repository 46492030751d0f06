"""Print and keep the pooled verdict: its text, ``pooled.json`` and tables, forest plots and an MLflow run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from vitplast_tune.analysis.verdicts import decision, family_clause, format_mc, format_p, summary
from vitplast_tune.errors import UserError
from vitplast_tune.lab import analysis, forest
from vitplast_tune.lab.design import PREREGISTRATION, Design, read_design
from vitplast_tune.lab.pooled import PooledResult, pool
from vitplast_tune.lab.records import read_kept
from vitplast_tune.recommend.ranking import POOLED_FILE

SAYS = "What it says (generated from the figures above):"
EXPERIMENT = "vitplast-lab-pooled"


def conclusions(result: PooledResult) -> list[str]:
    """Write the pooled verdict's sentences, or say that an interim look gives figures only."""
    d = result.design
    lacking = sorted({n for a in result.labs for n in a.notes})
    records = [f"The labs' records: {'; '.join(lacking)}."] if lacking else []
    untested = [f"{j.claim.key} ({j.why_untested})" for j in result.judged if j.result is None]
    untested_line = [f"Not tested, no lab could judge them: {', '.join(untested)}."] if untested else []
    if result.interim:
        interim = f"Interim, figures only: {result.interim}. The family is judged once, on all of them; no words yet."
        return [interim, *untested_line, *records]
    tested = [j.result for j in result.judged if j.result is not None]
    n_tasks = len({a.records.task for a in result.labs})
    level = (
        f"A task-level test (signs flipped over tasks) needs at least {result.tasks_needed} tasks under "
        f"{family_clause(d.alpha, d.correction, len(tested))} (its smallest p, 1/2^N, below {d.alpha:g}/{len(tested)}); "
        f"these labs cover {n_tasks}, so every verdict above holds {result.scope.split(' (')[0]} only."
    )
    return [*summary(tested), *untested_line, level, *records]


def _judged_lines(result: PooledResult) -> list[str]:
    lines = []
    said = (lambda r: "interim") if result.interim else decision
    for j in result.judged:
        r = j.result
        if r is None:
            lines.append(f"  {j.claim.claim:<10} {j.claim.predictor:<22} not tested: {j.why_untested}")
            continue
        lines.append(
            f"  {j.claim.claim:<10} {j.claim.predictor:<22} labs={j.labs} diff {r.estimate:+.2f} "
            f"[{format_mc(r.low, r.interval_se)}, {format_mc(r.high, r.interval_se)}] ({100 * r.level:.3g}%) "
            f"p={format_p(r.p, r.p_se)} corrected p={format_p(r.p_adjusted, r.p_adjusted_se)}  {said(r)}"
        )
    return lines


def _headline_lines(result: PooledResult) -> list[str]:
    lines = []
    for h in result.headline.itertuples():
        if not math.isfinite(h.re):
            continue
        lines.append(
            f"  {h.predictor:<22} {h.what:<18} labs={h.labs} random effects {h.re:+.2f} [{h.re_low:+.2f}, "
            f"{h.re_high:+.2f}]  tau^2={h.tau2:.3g}  I^2={100 * h.i2:.0f}%  (labs' mean {h.fixed:+.2f})"
        )
    return lines


def _power_lines(result: PooledResult) -> list[str]:
    p = result.power
    if p.empty:
        return []
    d = result.design
    return [
        f"  {r.predictor:<22} {r.what:<18} pooled SE {r.se_pooled:.3f}: power {r.superiority:.2f} to show it better "
        f"when better by {d.margin:g}, {r.equivalence:.2f} to show equivalence when equal; labs for 80%: "
        f"{r.labs_for_80} better, {r.equivalence_labs_for_80} equivalent (task-level, with tau^2: {r.task_level_80} "
        f"and {r.equivalence_task_level_80})"
        for r in p.itertuples()
    ]


def describe_pooled(result: PooledResult) -> str:
    """Describe the pooled verdict as text: per lab, the family, the headline, the power and the sentences.

    Args:
        result: The pooled verdict.

    Returns:
        The text.
    """
    d = result.design
    per = result.per_lab.copy()
    per["diff [95%]"] = [
        f"{v:+.2f} [{lo:+.2f}, {hi:+.2f}]" if np.isfinite(v) else note
        for v, lo, hi, note in zip(per["diff"], per["low"], per["high"], per["note"])
    ]
    per["row"] = per["predictor"] + np.where(per["what"] == analysis.SUBSETS, "", " (single)")
    wide = per.pivot_table(index="row", columns="lab", values="diff [95%]", aggfunc="first", sort=False)
    family = sum(j.result is not None for j in result.judged)
    lines = [
        f"Pre-registration {Path(d.source).name} (registered {d.registered}): {d.resamples} crossed resamples per lab "
        f"(seeds jointly, {'test images jointly where kept' if d.test_images_joint else 'test images not resampled'}),"
        f" bootstrap seed "
        f"{d.bootstrap_seed}, margin ±{d.margin:g}, {family_clause(d.alpha, d.correction, family)}.",
        "",
        "Per lab: each predictor's Spearman minus the baseline's (crossed bootstrap, 95%, figures only):",
        wide.to_string(),
        "",
        "The pre-registered family, pooled (the labs' mean; interval at the claim's corrected level; p with its Monte "
        f"Carlo standard error; 'undecided' within {d.undecided_mc_se:g} of them from alpha):",
        *_judged_lines(result),
        "",
        "Headline: the tasks' random effects (DerSimonian-Laird, 95%; figures, the words hold across these tasks):",
        *_headline_lines(result),
        "",
        f"Power of this design at the strictest threshold ({d.alpha:g}/{family}; normal approximation from the labs' "
        "bootstrap errors, conditional on the tasks):",
        *_power_lines(result),
        "",
        SAYS,
        *(f"  {s}" for s in conclusions(result)),
    ]
    return "\n".join(lines)


def _write_pooled(result: PooledResult, out: Path) -> list[Path]:
    """Write ``pooled.json``, which ``vitplast recommend`` reads, the tables and the forest plots into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for j in result.judged:
        r = j.result
        said = "interim" if result.interim else decision(r) if r is not None else "not tested"
        verdict = {"better": "better"}.get(j.claim.claim, j.claim.claim) if said == "established" else said
        rows.append(
            {"claim": j.claim.claim, "predictor": j.claim.predictor, "labs": j.labs, "diff": j.estimate}
            | {"low": r.low if r else math.nan, "high": r.high if r else math.nan, "level": r.level if r else math.nan}
            | {"p": j.p, "p_se": j.p_se, "p_adjusted": r.p_adjusted if r else math.nan}
            | {"p_adjusted_se": r.p_adjusted_se if r else math.nan, "decision": said, "verdict": verdict}
        )
    table = pd.DataFrame(rows)
    files = [out / POOLED_FILE, out / "pooled.csv", out / "pooled_per_lab.csv", out / "headline.csv"]
    labs = [
        {"lab": a.records.name, "model": a.records.model, "task": a.records.task, "dataset": a.records.dataset}
        | {"minutes": a.records.minutes, "seeds": a.records.seeds, "notes": a.notes}
        for a in result.labs
    ]
    better = table[table["claim"] == "better"]
    payload = {
        "design": result.design.source,
        "registered": result.design.registered,
        "labs": labs,
        "excluded": result.excluded,
        "complete": not result.interim,
        "family": int(table["p_adjusted"].notna().sum()),
        "alpha": result.design.alpha,
        "margin": result.design.margin,
        "correction": result.design.correction,
        "predictors": json.loads(better.to_json(orient="records")),
        "claims": json.loads(table.to_json(orient="records")),
        "headline": json.loads(result.headline.to_json(orient="records")),
        "tasks_needed": result.tasks_needed,
        "conclusions": conclusions(result),
    }
    files[0].write_text(json.dumps(payload, indent=2) + "\n")
    table.to_csv(files[1], index=False)
    result.per_lab.to_csv(files[2], index=False)
    result.headline.to_csv(files[3], index=False)
    return files + forest.forest_plots(result, out)


def _log_pooled(result: PooledResult, files: list[Path], tracking_uri: str, name: str) -> str:
    """Log the pooled MLflow run with the design, each claim's figures and ``files``, and return its run id."""
    from vitplast_tune.records.tracking import client, experiment_id

    mlflow = client(tracking_uri)
    run = mlflow.create_run(experiment_id(mlflow, EXPERIMENT), run_name=name)
    d = result.design
    params = {"design": Path(d.source).name, "registered": d.registered, "alpha": d.alpha, "margin": d.margin}
    params |= {"correction": d.correction, "resamples": d.resamples, "bootstrap_seed": d.bootstrap_seed}
    params |= {"labs": ", ".join(a.records.name for a in result.labs)[:500], "complete": not result.interim}
    for key, value in params.items():
        mlflow.log_param(run.info.run_id, key, value)
    for j in result.judged:
        if j.result is not None:
            mlflow.log_metric(run.info.run_id, f"{j.claim.claim}.{j.claim.predictor}.diff", j.estimate)
            mlflow.log_metric(run.info.run_id, f"{j.claim.claim}.{j.claim.predictor}.p_adjusted", j.result.p_adjusted)
    for path in files:
        mlflow.log_artifact(run.info.run_id, str(path), "forest" if path.suffix == ".png" else None)
    mlflow.set_terminated(run.info.run_id)
    return run.info.run_id


def design_for(folders: list[Path], design: str | Path | None) -> Design:
    """Read the design named, else the ``preregistration.yaml`` beside the lab folders."""
    if design is not None:
        return read_design(design)
    found = {Path(f).resolve().parent / PREREGISTRATION for f in folders}
    if len(found) == 1 and (path := found.pop()).is_file():
        return read_design(path)
    raise UserError(f"no {PREREGISTRATION} beside the labs: name the pre-registration (--design FILE)")


def analyze_folder(folder: str | Path, design: str | Path | None = None, *, n_boot: int | None = None) -> str:
    """Analyze a lab again from its kept folder alone.

    Args:
        folder: The kept lab.
        design: The pre-registration, by default the one beside the folder.
        n_boot: The number of resamples, by default the design's.

    Returns:
        The analysis as text.

    Raises:
        UserError: If the folder or the pre-registration is missing, or the lab ran under another design.
    """
    records = read_kept(folder)
    chosen = design_for([Path(folder)], design)
    chosen.ran_under(records.record.get("preregistration_sha256"), records.name)
    return analysis.describe_lab(analysis.analyze_lab(records, chosen, n_boot=n_boot))


def pool_folders(
    folders: list[Path],
    out: Path,
    *,
    design: str | Path | None = None,
    tracking_uri: str | None = None,
    include_unqualified: bool = False,
    n_boot: int | None = None,
) -> tuple[PooledResult, str]:
    """Pool kept labs under the pre-registration and write its files, and an MLflow run if asked.

    Args:
        folders: The kept labs.
        out: The folder for pooled.json, its tables and forest plots.
        design: The pre-registration, by default the one beside the folders.
        tracking_uri: Where to log the pooled MLflow run, or None for no run.
        include_unqualified: Whether to pool labs whose task did not qualify too.
        n_boot: The number of resamples, by default the design's.

    Returns:
        The result and its text.

    Raises:
        UserError: If a folder or the pre-registration is missing, or a lab ran under another design.
    """
    records = [read_kept(f) for f in folders]
    chosen = design_for(folders, design)
    for r in records:
        chosen.ran_under(r.record.get("preregistration_sha256"), r.name)
    used = [r for r in records if r.qualifies or include_unqualified]
    result = pool([analysis.analyze_lab(r, chosen, n_boot=n_boot) for r in used], chosen)
    result.excluded = [r.name for r in records if r not in used]
    files = _write_pooled(result, Path(out))
    text = describe_pooled(result)
    if tracking_uri:
        text += f"\nMLflow run {_log_pooled(result, files, tracking_uri, Path(out).name)} ({EXPERIMENT})"
    return result, text + f"\nfiles: {Path(out)}"
