"""In a real browser: a tiny search logged to a real ``mlflow server``, its printed link opened in headless
Chromium, the saved view checked as a user sees it (the trials, not the parent; the view's charts; the
Dataset column filled).

Screenshots are kept under the test's ``tmp_path`` (printed when it fails). Needs Chromium
(``/usr/bin/chromium``, Debian's package; ``.ci/run`` installs it) and the ``playwright`` package.
"""

import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from _raycluster import MlflowServer
from _spaces import space_text
from test_reliability import OwnedRay

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

SPACE = space_text(
    parameters={"components": {"choice": ["mha", "fc1", "ln1+fc2"]}},
    defaults={"max_steps": 400},
)


@pytest.fixture
def server(tmp_path):
    started = MlflowServer(tmp_path / "mlflow")
    yield started
    started.stop()


@pytest.fixture
def owned_ray():
    owned = OwnedRay()
    yield owned
    owned.kill_all()


def test_printed_link_opens_the_trials_view(tmp_path, server, owned_ray):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    if not Path(CHROMIUM).exists():
        pytest.skip("no Chromium (apt-get install chromium)")
    space = tmp_path / "ui.yaml"
    space.write_text(SPACE)
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "search.py"),
        "--space",
        str(space),
        "--name",
        "ui-check",
        "--storage",
        str(tmp_path / "results"),
        "--tracking-uri",
        server.uri,
        "--max-steps",
        "16",
        "--plasticity-pairs",
        "64",
        "--cpus-per-trial",
        "1",
        "--quiet",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=owned_ray.env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (link,) = re.findall(r"^MLflow view:\s+(\S+)$", done.stdout, re.M)
    assert link.startswith(f"{server.uri}/#/experiments/") and "viewStateShareKey=" in link

    shots = tmp_path / "screenshots"
    shots.mkdir()
    print(f"screenshots: {shots}")  # shown by pytest when the test fails
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1300})
            page.goto(link)
            trials = ("mha lr=0.05", "fc1 lr=0.05", "ln1+fc2 lr=0.05")
            for name in trials:
                page.get_by_text(name).first.wait_for(timeout=60_000)
            page.get_by_text("val_acc_common", exact=False).first.wait_for(timeout=60_000)
            for axis in ("train_mha", "log10_lr"):  # the parallel coordinates draw last (slowly on a busy machine)
                page.get_by_text(axis, exact=False).first.wait_for(timeout=60_000)
            text = page.inner_text("body")
            assert "Model training" in text and "3 matching runs" in text
            assert "ui-check" not in _run_names(text), "the parent run is listed"
            for title in (
                "plasticity_mean vs. val_acc_common",
                "log10_trainable_params vs. val_acc_common",
                "Parallel Coordinates",
                "train_mha",
                "log10_lr",
            ):
                assert title in text, title
            drawn = page.locator("canvas, svg.main-svg")
            assert drawn.count() >= 4  # the charts drew
            widths = [box["width"] for box in (drawn.nth(i).bounding_box() for i in range(drawn.count())) if box]
            assert max(widths) > 2.5 * statistics.median(widths), widths  # the parallel coordinates span the row
            page.screenshot(path=str(shots / "charts.png"))

            page.goto(link.replace("compareRunsMode=CHART", "compareRunsMode=TABLE"))
            page.get_by_text("digits-train").first.wait_for(timeout=60_000)  # the Dataset column is filled
            page.screenshot(path=str(shots / "table.png"))
            table = page.inner_text("body")
            assert "Dataset" in table and "3 matching runs" in table
            assert all(name in table for name in trials)
        finally:
            browser.close()


def _run_names(text: str) -> list[str]:
    """The lines of the page that look like run names (a subset and a learning rate, or the search's name)."""
    return [line for line in text.splitlines() if " lr=" in line or line.strip() == "ui-check"]
