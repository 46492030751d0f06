"""Generate the dated page that re-analyses the first kept labs under the pre-registered design.

The page shows what each change of the design does to every figure that the page of 2026-12-01 quoted.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from vitplast_tune.analysis import multiple
from vitplast_tune.analysis.correlation import spearman
from vitplast_tune.analysis.verdicts import decision, format_mc, format_p, p_se, quantile_se
from vitplast_tune.components import BLOCK_COMPONENTS
from vitplast_tune.lab import analysis, forest, pooled, report
from vitplast_tune.lab.records import read_kept

OLD_ROW = re.compile(
    r"^  (\w+)\s+labs=\d+\s+diff ([-+]\d\.\d\d) (\[[^\]]+\]) \(([\d.]+%)\) p=([\d.e-]+) Holm p=([\d.e-]+) (.+?)\s+"
    r"random effects"
)
OLD_NARROWER = re.compile(r"mean Spearman ([-+]\d\.\d\d), exact permutation p=([\d.]*\d), Holm p=([\d.]*\d)")


@dataclass
class Quoted:
    """Hold what the page of 2026-12-01 printed for the pooled labs: per predictor, per lab and the narrower claim."""

    pooled: dict[str, tuple[str, ...]]
    per_lab: dict[str, dict[str, str]]
    narrower: tuple[str, str, str]


def read_quoted(page: str) -> Quoted:
    """Read the pooled-s1 printout quoted on the page of 2026-12-01."""
    block = page.split("### The pooled verdict on `s1`")[1].split("```")[1]
    rows = {m.group(1): m.groups()[1:] for line in block.splitlines() if (m := OLD_ROW.match(line))}
    table = block.split("figures only):\n")[1].split("\n\n")[0].splitlines()
    labs = table[0].split()[1:]
    per_lab = {}
    for line in table[2:]:
        name, cells = line.split()[0], re.findall(r"[-+]\d\.\d\d \[[^\]]+\]", line)
        per_lab[name] = dict(zip(labs, cells))
    narrower = OLD_NARROWER.search(block)
    return Quoted(rows, per_lab, narrower.groups() if narrower else ("", "", ""))


def _exact_agreement(labs: list[analysis.LabAnalysis], score: str = "plasticity_mean") -> tuple[float, float]:
    """Test the narrower claim as the old page did: the labs' mean Spearman and its exact permutation p."""
    laws, observed = [], []
    for a in labs:
        rows = a.table.set_index("components")
        common = [c for c in BLOCK_COMPONENTS if c in rows.index and rows.loc[c, "position"] == "interior"]
        x, y = rows.loc[common, score].to_numpy(float), rows.loc[common, "mean"].to_numpy(float)
        orders = np.array(list(itertools.permutations(range(len(y)))))
        laws.append(spearman(np.broadcast_to(x, orders.shape), y[orders], -1))
        observed.append(spearman(x, y))
    values, probs = np.array([0.0]), np.array([1.0])
    for law in laws:  # convolve the law of the sum lab by lab
        v, counts = np.unique(np.round(law, 9), return_counts=True)
        sums = np.round(values[:, None] + v[None, :], 9).ravel()
        values, inverse = np.unique(sums, return_inverse=True)
        probs = np.bincount(inverse, weights=(probs[:, None] * (counts / counts.sum())[None, :]).ravel())
    mean = float(np.mean(observed))
    return mean, float(probs[np.abs(values / len(laws)) >= abs(mean) - 1e-9].sum())


def _two_sided_family(labs: list[analysis.LabAnalysis], predictors: list[str], alpha: float) -> pd.DataFrame:
    """Judge the old page's Holm family of 9 on these resamples, with Monte Carlo errors and decisions."""
    rows = []
    for p in predictors:
        _, estimate, samples = pooled._pooled_samples(labs, p, analysis.SUBSETS)
        rows.append({"predictor": p, "estimate": estimate, "samples": samples})
    rho, exact = _exact_agreement(labs)
    judged = multiple.judge(
        [r["estimate"] for r in rows] + [rho], [r["samples"] for r in rows] + [None], [None] * len(rows) + [exact]
    )
    table = pd.DataFrame(rows).drop(columns="samples").assign(**{c: judged[c].to_numpy()[:-1] for c in judged})
    n_boot = len(rows[0]["samples"])
    table["p_se"] = [2 * p_se(q / 2, n_boot) for q in table["p"]]  # p is twice a share, so its error doubles
    order = np.argsort(np.r_[table["p"], exact], kind="stable")
    multiplier = np.empty(len(order))
    multiplier[order] = len(order) - np.arange(len(order))
    table["p_holm_se"] = multiplier[:-1] * table["p_se"]
    undecided = (table["p_holm"] - alpha).abs() <= 3 * table["p_holm_se"]
    words = {"above 0": "better", "below 0": "worse", "not different from 0": "no clear difference"}
    table["said"] = np.where(undecided, "undecided", table["verdict"].map(words))
    table.attrs.update(narrower=(rho, exact, float(judged["p_holm"].iloc[-1])), n_boot=n_boot)
    return table


@dataclass
class Page:
    """Hold a generated page, its pooled result, its forest plots and, for the verdict's page, the README's block."""

    text: str
    result: pooled.PooledResult
    plots: list[Path]
    readme: str = ""


def _interval(low: float, high: float, samples: np.ndarray | None, level: float) -> str:
    tail = (1 - level) / 2
    se = max(quantile_se(samples, tail), quantile_se(samples, 1 - tail)) if samples is not None else math.nan
    return f"[{format_mc(low, se)}, {format_mc(high, se)}]"


def _pooled_rows(quoted: Quoted, first: pd.DataFrame, second: pd.DataFrame, result: pooled.PooledResult) -> list[str]:
    claims = {(j.claim.claim, j.claim.predictor): j for j in result.judged}
    lines = [
        "| predictor | printed 2026-12-01 (4,000 resamples, seeds within subsets) | seeds jointly (4,000) | "
        "seeds jointly, 20,000 resamples | the pre-registered family (better; equivalent) |",
        "|---|---|---|---|---|",
    ]
    for a, b in zip(first.itertuples(), second.itertuples()):
        d, interval, level, p, holm, said = quoted.pooled.get(a.predictor, ("?",) * 6)
        better, same = claims.get(("better", a.predictor)), claims.get(("equivalent", a.predictor))
        new = "; ".join(
            f"corrected p {format_p(j.result.p_adjusted, j.result.p_adjusted_se)} {decision(j.result)}"
            for j in (better, same)
            if j is not None and j.result is not None
        )
        lines.append(
            f"| {a.predictor} | {d} {interval} ({level}), p {p}, Holm p {holm}, {said.strip()} | {a.estimate:+.2f} "
            f"[{a.low:+.2f}, {a.high:+.2f}] ({100 * a.level:.3g}%), p {a.p:.2g}, Holm p {a.p_holm:.2g}, {a.said} | "
            f"p {format_p(b.p, b.p_se)}, Holm p {format_p(b.p_holm, b.p_holm_se)}, {b.said} | {new} |"
        )
    return lines


def _narrower_row(quoted: Quoted, first: pd.DataFrame, second: pd.DataFrame, result: pooled.PooledResult) -> str:
    rho, p, holm = quoted.narrower
    j = next(j for j in result.judged if j.claim.claim == "narrower")
    r = j.result
    _, _, holm4 = first.attrs["narrower"]
    new_rho, exact, holm20 = second.attrs["narrower"]
    return (
        f"| narrower claim (plasticity_mean, single components) | mean Spearman {rho} against 0, exact p {p}, Holm p "
        f"{holm} | {new_rho:+.2f}, exact p {exact:.3g}, Holm p {holm4:.3g} | Holm p {holm20:.3g} | against the "
        f"baseline: mean difference {r.estimate:+.2f}, corrected p {format_p(r.p_adjusted, r.p_adjusted_se)} "
        f"{decision(r)} |"
    )


def _per_lab_rows(quoted: Quoted, result: pooled.PooledResult) -> list[str]:
    per = result.per_lab[result.per_lab["what"] == analysis.SUBSETS]
    labs = list(dict.fromkeys(per["lab"]))
    lines = ["| predictor | " + " | ".join(labs) + " |", "|---|" + "---|" * len(labs)]
    for predictor, rows in per.groupby("predictor", sort=False):
        cells = []
        for r in rows.set_index("lab").reindex(labs).itertuples():
            before = quoted.per_lab.get(predictor, {}).get(r.Index, "?")
            cells.append(f"{before} -> {r.diff:+.2f} [{r.low:+.2f}, {r.high:+.2f}]")
        lines.append(f"| {predictor} | " + " | ".join(cells) + " |")
    return lines


def _changes(quoted: Quoted, first: pd.DataFrame, second: pd.DataFrame, result: pooled.PooledResult) -> list[str]:
    """Say what each change does, counted from the figures."""
    widths = []
    for a in first.itertuples():
        old = quoted.pooled.get(a.predictor)
        if old:
            low, high = (float(v) for v in old[1].strip("[]").split(","))
            widths.append((a.high - a.low) / (high - low))
    findings = lambda t: ", ".join(f"{r.predictor} {r.said}" for r in t.itertuples() if r.said != "no clear difference")
    d = result.design
    tested = sum(j.result is not None for j in result.judged)
    return [
        f"- **Seeds drawn jointly across subsets** (a seed fixes the split and the batch order of every subset): the "
        f"pooled adjusted intervals change width by a factor {min(widths):.2f} to {max(widths):.2f} (median "
        f"{np.median(widths):.2f}); the findings of the old family become: {findings(first) or 'none'}.",
        "- **Test images drawn jointly**: not possible on these records, which keep final values only (no per-image "
        "outcomes); the pre-registered labs keep them (`test_correct.csv`) and their intervals carry the test set's "
        "sampling error.",
        f"- **{d.resamples} resamples, each p with its Monte Carlo error**, a corrected p within {d.undecided_mc_se:g} "
        f"errors of alpha undecided: the old family's findings become: {findings(second) or 'none'}.",
        f"- **The pre-registered family** ({tested} claims: superiority, equivalence within ±{d.margin:g} by two "
        "one-sided tests, and the narrower claim against the baseline instead of against 0), one correction over all: "
        "see the last column and the printout below.",
    ]


def _results_page(
    root: Path, folders: list[Path], design_path: Path, old_page: Path, images: Path, *, date: str
) -> Page:
    """Generate the dated page for the kept labs in ``folders`` and write its forest plots into ``images``."""
    design = report.design_for(folders, design_path)
    records = [read_kept(f) for f in folders]
    labs = [analysis.analyze_lab(r, design) for r in records]
    result = pooled.pool(labs, design)
    predictors = [c.predictor for c in design.claims("better")]
    first = _two_sided_family([analysis.analyze_lab(r, design, n_boot=4000) for r in records], predictors, design.alpha)
    second = _two_sided_family(labs, predictors, design.alpha)
    quoted = read_quoted(old_page.read_text())
    plots = forest.forest_plots(result, images)
    text = report.describe_pooled(result)
    rel = lambda p: Path(p).resolve().relative_to(root.resolve()).as_posix()
    where = {"folders": [rel(f) for f in folders], "design": rel(design_path), "old": Path(old_page).name}
    lines = _markdown(where, quoted, (first, second), result, text, plots, date)
    return Page("\n".join(lines), result, plots)


DATE = "2026-12-02"
PAGE = f"docs/results/lab-{DATE}.md"  # then the kept labs it reads, their design and the page quoted before
KEPT, DESIGN = f"docs/results/data/lab-{DATE}", "docs/results/data/lab-v2/preregistration.yaml"
OLD_PAGE, IMAGES = "docs/results/lab-2026-12-01.md", f"docs/results/img/lab-{DATE}"


def generate(root: Path, images: Path | None = None) -> Page:
    """Generate the page for the repository at ``root``, writing its forest plots into ``images``."""
    folders = sorted((root / KEPT).glob("lab.*"))
    return _results_page(root, folders, root / DESIGN, root / OLD_PAGE, images or root / IMAGES, date=DATE)


def write_page(root: Path) -> str:
    """Write the page and its plots into the repository at ``root`` and say what was written."""
    page = generate(root)
    (root / PAGE).write_text(page.text)
    return f"wrote {PAGE} and {len(page.plots)} forest plots in {IMAGES}"


def _printout_and_plots(command: str, text: str) -> list[str]:
    """Return a results page's section of the command's printout and the heading of its forest plots."""
    return [
        "## The verdict, as the command prints it",
        "",
        f"`{command}`:",
        "",
        "```",
        text,
        "```",
        "",
        "## Forest plots",
        "",
    ]


def _markdown(
    where: dict, quoted: Quoted, families: tuple[pd.DataFrame, pd.DataFrame], result: pooled.PooledResult,
    text: str, plots: list[Path], date: str,
) -> list[str]:  # fmt: skip
    """Write the page's lines: the changes, their tables, the printout, the plots and the one-lab command."""
    design = result.design
    command = f"vitplast lab pooled --from {' '.join(where['folders'])} --design {where['design']} --out pooled-s1"
    return [
        f"# The kept labs re-analysed under the pre-registered design, {date}",
        "",
        f"Generated by `python scripts/lab_results_page.py` from the kept records alone ({len(where['folders'])} labs in "
        f"`{Path(where['folders'][0]).parent.as_posix()}`, final values only) under the pre-registration `{where['design']}` (registered "
        f"{design.registered}); a test generates it again and fails when a figure here differs. The figures the "
        f"[page of 2026-12-01]({where['old']}) printed for these labs are read from its quoted printout.",
        "",
        "## What each change does to every quoted figure",
        "",
        *_changes(quoted, *families, result),
        "",
        "The pooled figures (difference to log(#trainable parameters), interval at its level, p, Holm p, verdict):",
        "",
        *_pooled_rows(quoted, *families, result),
        _narrower_row(quoted, *families, result),
        "",
        f"Each lab's difference with its 95% interval, printed 2026-12-01 -> seeds jointly, {design.resamples} "
        "resamples:",
        "",
        *_per_lab_rows(quoted, result),
        "",
        *_printout_and_plots(command, text),
        *[f"![{p.stem}](img/lab-{date}/{p.name})\n" for p in plots],
        "## One lab from its folder alone",
        "",
        f"`vitplast lab analyze --from {where['folders'][0]} --design {where['design']}` prints that lab's table and "
        "differences (figures only: the family is judged pooled).",
        "",
    ]
