"""Figures held to the data: the lab's results page and the README's quoted verdict, generated again from the kept
records by the script the docs name (scripts/lab_results_page.py), must be what is committed, to the character."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from vitplast_tune.lab import page, report, verdict_page

pytestmark = pytest.mark.slow  # each page regenerated from the kept labs, bootstraps and all

NUMBER = re.compile(r"[-+]?\d+\.\d+|[-+]?\d+")


def same_to_the_printed_digit(a: str, b: str) -> bool:
    """Two printouts the same but for numbers that differ by at most one unit of their last printed digit (and the
    same words around them)."""
    if NUMBER.sub("#", a) != NUMBER.sub("#", b):
        return False
    for x, y in zip(NUMBER.findall(a), NUMBER.findall(b)):
        digits = max(len(x.split(".")[1]) if "." in x else 0, len(y.split(".")[1]) if "." in y else 0)
        if abs(float(x) - float(y)) > 10.0**-digits + 1e-12:
            return False
    return True


def judged_and_said(text: str) -> str:
    """A pooled printout's family (every claim's figures, p-values and decision) and its sentences."""
    family = text.split("The pre-registered family, pooled")[1].split("\nHeadline:")[0]
    return family + text.split("What it says (generated from the figures above):")[1].split("\nfiles:")[0]


ROOT = Path(__file__).resolve().parents[2]
MACHINE_PATHS = re.compile(r"(?<![\w.])/(root|work|tmp|home)/")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    return page.generate(ROOT, tmp_path_factory.mktemp("img"))


def test_the_results_page_is_what_the_kept_labs_say(generated):
    """Every figure on the dated page (the changes, both tables, the printout) recomputed from the kept records."""
    committed = (ROOT / page.PAGE).read_text().splitlines()
    differing = [(a, b) for a, b in zip(committed, generated.text.splitlines()) if a != b]
    assert not differing and len(committed) == len(generated.text.splitlines()), (
        f"run python scripts/lab_results_page.py; first difference: {differing[:1]}"
    )
    assert sorted(p.name for p in generated.plots) == sorted(p.name for p in (ROOT / page.IMAGES).glob("forest-*.png"))


@pytest.fixture(scope="module")
def verdict(tmp_path_factory):
    return verdict_page.generate(ROOT, tmp_path_factory.mktemp("img"))


def test_the_verdict_page_is_what_the_kept_labs_of_lab_v2_say(verdict):
    """The pre-registered verdict's page, every figure recomputed from the whole labs kept in lab-v2."""
    committed = (ROOT / verdict_page.PAGE).read_text()
    differing = [(a, b) for a, b in zip(committed.splitlines(), verdict.text.splitlines()) if a != b]
    assert committed == verdict.text, f"run python scripts/lab_results_page.py; first difference: {differing[:1]}"
    kept = verdict_page.kept_labs(ROOT)
    assert [a.records.name for a in verdict.result.labs] == [f.name for f in kept] and len(kept) >= 2
    assert sorted(p.name for p in verdict.plots) == sorted(p.name for p in (ROOT / verdict_page.IMAGES).glob("*.png"))
    table = verdict_page.labs_table(verdict.result.labs).set_index("lab")
    trials = pd.read_csv(kept[0] / "trials.csv")
    assert table.loc[kept[0].name, "trials"] == len(trials) and table.loc[kept[0].name, "seeds"] == 5


def test_the_readme_quotes_the_verdict_the_analysis_prints(verdict):
    readme = (ROOT / verdict_page.README).read_text()
    assert verdict_page.README_START in readme and verdict_page.readme_with(readme, verdict.readme) == readme
    said = verdict.text.split(report.SAYS)[1].split("```")[0].strip().splitlines()
    assert said and all(f"> {line.strip()}" in readme for line in said)
    finding = verdict.readme.splitlines()[-2]  # the single components' finding, a line of the page quoted whole
    assert finding.startswith("> Exploratory, outside the pre-registered family:") and finding in readme
    assert finding[2:] in verdict.text.splitlines() and "positive in 8 of 8 labs" in finding
    if verdict.result.interim:  # fewer labs than the design judges: figures, and no words
        assert "Interim, figures only" in verdict.readme and "rank the subsets" not in verdict.readme


def test_every_figure_the_old_page_quoted_is_read_as_before(generated):
    """The page of 2026-12-01's pooled-s1 printout is parsed whole: each predictor's row, each lab's cell, the
    narrower claim; so a figure changed there changes the generated page, and the test above fails."""
    quoted = page.read_quoted((ROOT / page.OLD_PAGE).read_text())
    predictors = [c.predictor for c in generated.result.design.claims("better")]
    assert sorted(quoted.pooled) == sorted(predictors) and sorted(quoted.per_lab) == sorted(predictors)
    assert all(len(cells) == 4 for cells in quoted.per_lab.values()) and all(quoted.narrower)


def test_the_kept_figures_hold_under_another_bootstrap_seed_and_lab_order(generated, tmp_path):
    folders = sorted((ROOT / page.KEPT).glob("lab.*"))
    shown = report.describe_pooled(generated.result)
    reordered = report.pool_folders(folders[::-1], tmp_path / "a", design=ROOT / page.DESIGN)[1]
    assert reordered.split("\nfiles:")[0] == shown
    design = yaml.safe_load((ROOT / page.DESIGN).read_text())
    design["resampling"]["bootstrap_seed"] = 1
    (tmp_path / "seed1").mkdir()
    (tmp_path / "seed1" / "preregistration.yaml").write_text(yaml.safe_dump(design))
    moved = report.pool_folders(folders, tmp_path / "b", design=tmp_path / "seed1" / "preregistration.yaml")[1]
    assert judged_and_said(moved) != judged_and_said(shown)
    assert same_to_the_printed_digit(judged_and_said(shown), judged_and_said(moved))


def test_the_lab_docs_name_no_machine_paths():
    pages = [ROOT / "README.md", ROOT / "docs/results/data/README.md", *(ROOT / "docs/results").glob("lab-*.md")]
    found = [f"{p.name}: {m.group(0)}" for p in pages for m in MACHINE_PATHS.finditer(p.read_text())]
    assert not found, found


def test_a_kept_lab_is_re_analysed_from_its_folder_alone(generated, capsys):
    """``vitplast lab analyze --from``: the lab's figures from its folder, what the folder lacks said, and its
    differences the ones the pooled verdict used."""
    from vitplast_tune.cli.lab import lab_main

    folder = sorted((ROOT / page.KEPT).glob("lab.*"))[0]
    assert lab_main(["analyze", "--from", str(folder), "--design", str(ROOT / page.DESIGN)]) == 0
    out = capsys.readouterr().out
    assert "Note: kept as final values only (the first kept labs): no per-image test outcomes" in out
    assert "Note: 3 seeds per configuration, fewer than the design's 5." in out
    per = generated.result.per_lab.set_index(["lab", "predictor", "what"])
    grad = per.loc[(folder.name, "grad_norm", "subsets")]
    assert "grad_norm              n=31  Spearman" in out and f"diff {grad['diff']:+.2f}" in out
