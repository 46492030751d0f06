"""In a real browser: a tiny search recording to its default SQLite store, its MLflow UI started by ``vitplast-ui`` while
the search still runs, and the view checked as a user sees it in headless Chromium: the charts already drawn while the
trials train, then after the search the trials (not the parent), the view's charts and the Dataset column, and the
printed run link in model-training mode, all in a fresh browser (no mode remembered).

The search is held at a known point by a Ray Tune callback named in ``RAY_TUNE_CALLBACKS`` (it runs after the search's
own MLflow tracker): once two trials have reported, its driver waits until the test lets it go, so "while the search
runs" is a fact the test checks, not a race. Screenshots are kept under the test's ``tmp_path`` (printed when it
fails). Needs Chromium (``/usr/bin/chromium``, Debian's package; ``.ci/run`` installs it) and ``playwright``.
"""

import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _raycluster import OwnedRay, free_ports
from _spaces import space_text
from mlflow.tracking import MlflowClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TRIALS = ("mha lr=0.05", "fc1 lr=0.05", "ln1+fc2 lr=0.05")
SPACE = space_text(
    parameters={"components": {"choice": ["mha", "fc1", "ln1+fc2"]}},
    defaults={"max_steps": 400},
)
GATE = '''
import os, time
from pathlib import Path
from ray import tune


class Gate(tune.Callback):
    """Holds the search's driver, once two trials have reported, until the test lets it go (at most 20 minutes)."""

    def __init__(self):
        self.seen, self.held = set(), False

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.seen.add(trial.trial_id)
        if self.held or len(self.seen) < 2:
            return
        self.held = True
        gate = Path(os.environ["UI_GATE"])
        (gate / "held").write_text("")
        deadline = time.time() + 1200
        while not (gate / "release").exists() and time.time() < deadline:
            time.sleep(0.2)
'''
SCATTER_POINTS = "document.querySelectorAll('.scatterlayer .point').length"


@pytest.fixture
def owned_ray():
    owned = OwnedRay()
    yield owned
    owned.kill_all()  # also anything left of the UI: it runs with the same RAY_TMPDIR


def test_the_view_fills_in_while_the_search_runs_and_opens_in_model_training_mode(tmp_path, owned_ray):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    if not Path(CHROMIUM).exists():
        pytest.skip("no Chromium (apt-get install chromium)")
    (tmp_path / "ui.yaml").write_text(SPACE)
    (tmp_path / "ui_gate.py").write_text(GATE)
    gate, storage = tmp_path / "gate", tmp_path / "results"
    gate.mkdir()
    env = {**owned_ray.env, "RAY_TUNE_CALLBACKS": "ui_gate.Gate", "UI_GATE": str(gate)}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *sys.path])
    cmd = [sys.executable, str(ROOT / "scripts" / "search.py"), "--space", str(tmp_path / "ui.yaml"), "--name"]
    cmd += ["ui-check", "--storage", str(storage), "--max-steps", "16", "--plasticity-pairs", "64"]
    search_log, ui_log = tmp_path / "search.log", tmp_path / "ui.log"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    print(f"screenshots: {shots}\nsearch log: {search_log}\nui log: {ui_log}")  # shown by pytest when the test fails
    (port,) = free_ports(1)
    with open(search_log, "w") as out:
        search = subprocess.Popen([*cmd, "--cpus-per-trial", "1"], env=env, stdout=out, stderr=subprocess.STDOUT)
    ui = None
    try:
        _wait_for_file(gate / "held", search, 1200)
        with open(ui_log, "w") as out:  # vitplast-ui while the search runs: the store it serves is still being written
            ui_cmd = [sys.executable, "-m", "vitplast_tune", "ui", "ui-check", "--storage", str(storage)]
            ui = subprocess.Popen(
                [*ui_cmd, "--port", str(port)], env=owned_ray.env, stdout=out, stderr=subprocess.STDOUT
            )
        view = _printed(ui, ui_log, "MLflow view:", 600)
        assert view.startswith(f"http://127.0.0.1:{port}/#/experiments/") and "viewStateShareKey=" in view
        assert "workflowType=machine_learning" in view
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                _check_the_view_while_the_search_runs(browser, view, search, storage, shots)
                (gate / "release").write_text("")
                assert search.wait(1200) == 0, search_log.read_text()[-3000:]
                _check_the_finished_view(browser, view, shots)
                (run_link,) = re.findall(r"^Best trial's run:\s+(\S+)$", search_log.read_text(), re.M)
                _check_a_run_page_in_model_training_mode(browser, run_link.replace(":5000/", f":{port}/"), shots)
            finally:
                browser.close()
    finally:
        (gate / "release").write_text("")
        if search.poll() is None:
            search.terminate()
            search.wait(60)
        if ui is not None and ui.poll() is None:
            ui.send_signal(signal.SIGTERM)  # vitplast-ui stops the MLflow UI it started
            ui.wait(120)
    assert ui.returncode == 0, ui_log.read_text()[-3000:]
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, "the MLflow UI still listens after vitplast-ui ended"


def _check_the_view_while_the_search_runs(browser, view: str, search, storage: Path, shots: Path) -> None:
    """The saved view's scatter plots and parallel coordinates already hold the two trials that reported."""
    page = browser.new_context(viewport={"width": 1600, "height": 1300}).new_page()  # a fresh browser
    page.goto(view)
    for title in ("plasticity_mean vs. val_acc_common", "log10_trainable_params vs. val_acc_common", "train_mha"):
        page.get_by_text(title, exact=False).first.wait_for(timeout=180_000)  # the view hides empty charts
    page.wait_for_function(f"{SCATTER_POINTS} >= 4", timeout=180_000)  # both scatter plots show both trials
    text = page.inner_text("body")
    _assert_model_training_mode(text)
    assert re.search(r"\b[23] matching runs", text) and "Parallel Coordinates" in text
    page.screenshot(path=str(shots / "while_running.png"), timeout=120_000)
    record = json.loads((storage / "ui-check" / "vitplast_search.json").read_text())
    parent = MlflowClient(record["tracking_uri"]).get_run(record["parent_run_id"])
    assert search.poll() is None and parent.info.status == "RUNNING"  # all of this before the search ended
    page.close()


def _check_the_finished_view(browser, view: str, shots: Path) -> None:
    """The trials only (not the parent), sorted; the charts, the parallel coordinates across the row; the Dataset
    column in the table view."""
    page = browser.new_context(viewport={"width": 1600, "height": 1300}).new_page()
    page.goto(view)
    for name in TRIALS:
        page.get_by_text(name).first.wait_for(timeout=120_000)
    for axis in ("train_mha", "log10_lr"):  # the parallel coordinates draw last (slowly on a busy machine)
        page.get_by_text(axis, exact=False).first.wait_for(timeout=120_000)
    page.wait_for_function(f"{SCATTER_POINTS} >= 6", timeout=120_000)
    text = page.inner_text("body")
    _assert_model_training_mode(text)
    assert "3 matching runs" in text
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
    page.screenshot(path=str(shots / "charts.png"), timeout=120_000)

    page.goto(view.replace("compareRunsMode=CHART", "compareRunsMode=TABLE"))
    page.get_by_text("digits-train").first.wait_for(timeout=120_000)  # the Dataset column is filled
    page.screenshot(path=str(shots / "table.png"), timeout=120_000)
    table = page.inner_text("body")
    assert "Dataset" in table and "3 matching runs" in table
    assert all(name in table for name in TRIALS)
    page.close()


def _check_a_run_page_in_model_training_mode(browser, link: str, shots: Path) -> None:
    """The best trial's printed link, in a fresh browser: its run page, in model-training mode."""
    assert link.endswith("?workflowType=machine_learning"), link
    page = browser.new_context(viewport={"width": 1600, "height": 1300}).new_page()
    page.goto(link)
    page.get_by_text(re.compile(r" lr=0\.05 #\d")).first.wait_for(timeout=120_000)  # the run's name: the page loaded
    page.screenshot(path=str(shots / "best_run.png"), timeout=120_000)
    _assert_model_training_mode(page.inner_text("body"))
    page.close()


def _assert_model_training_mode(text: str) -> None:
    """The sidebar of model-training mode (Runs, Models, Model registry), not GenAI's (Evaluation runs, Prompts)."""
    assert "Model registry" in text and "Evaluation runs" not in text, text[:600]


def _wait_for_file(path: Path, process, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, f"the search ended (exit {process.returncode}) before {path.name}"
        assert time.monotonic() < deadline, f"no {path.name} within {timeout_s:.0f} s"
        time.sleep(0.5)


def _printed(process, log: Path, label: str, timeout_s: float) -> str:
    """The value a command printed after ``label`` on a line of its own, once it has."""
    deadline = time.monotonic() + timeout_s
    while not (found := re.findall(rf"^{re.escape(label)}\s+(\S+)$", log.read_text(), re.M)):
        assert process.poll() is None, f"exited {process.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {label} within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)
    return found[0]


def _run_names(text: str) -> list[str]:
    """The lines of the page that look like run names (a subset and a learning rate, or the search's name)."""
    return [line for line in text.splitlines() if " lr=" in line or line.strip() == "ui-check"]
