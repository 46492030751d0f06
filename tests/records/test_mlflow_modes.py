"""In a real browser: the MLflow UI that ``vitplast ui`` starts (``records.ui.start_ui``: MLflow's server with the app
``vitplast``, ``_compat/mlflow_app.py``) opens every URL a user reaches in model-training mode when the browser has
made no choice (a fresh profile: no local storage), and keeps a user's own choice of GenAI.

The pages: the plain experiment URL, the experiments list (and the experiment clicked there), a run's page, none of
them carrying ``workflowType``. Model-training mode shows the runs table and the sidebar's "Model registry"; GenAI's
shows its overview, "Prompts" and "Evaluation runs". Screenshots are kept under the test's ``tmp_path``. Needs
Chromium (``/usr/bin/chromium``, Debian's package; ``.ci/run`` installs it) and ``playwright``.
"""

from __future__ import annotations

import json
import re
import shutil
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from _raycluster import free_ports
from mlflow.tracking import MlflowClient

from vitplast_tune._compat.mlflow_app import MODE_KEY
from vitplast_tune.records import ui
from vitplast_tune.records.tracking import experiment_id

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WAIT_MS = 180_000  # the UI's first page on a busy machine


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A store with one experiment (made as a search makes it) and two runs, and the UI ``vitplast ui`` starts on it:
    (base URL, experiment id, a run's id)."""
    assert entry_points(group="mlflow.app", name=ui.APP), (
        "the mlflow.app entry point is not installed: pip install -e ."
    )
    folder = tmp_path_factory.mktemp("modes")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = experiment_id(client, "modes", str(folder / "mlartifacts"))
    runs = []
    for name, acc in (("fc1 lr=0.05", 0.9), ("mha lr=0.05", 0.8)):
        run = client.create_run(experiment, run_name=name)
        client.log_metric(run.info.run_id, "val_acc_common", acc)
        client.set_terminated(run.info.run_id)
        runs.append(run.info.run_id)
    (port,) = free_ports(1)
    server = ui.start_ui(uri, port)
    try:
        yield f"http://{ui.HOST}:{port}", experiment, runs[0]
    finally:
        ui.stop(server)


@pytest.fixture(scope="module")
def browser():
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    if not Path(CHROMIUM).exists():
        pytest.skip("no Chromium (apt-get install chromium)")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


def fresh_page(browser):
    """A page in a fresh browser profile: no local storage, so no mode chosen."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(WAIT_MS)  # its first loads and screenshots, on a busy machine
    return context.new_page()


def stored_mode(page) -> str | None:
    raw = page.evaluate(f"localStorage.getItem({json.dumps(MODE_KEY)})")
    return None if raw is None else json.loads(raw)


def assert_model_training(page) -> None:
    """The sidebar of model-training mode (Model registry), not GenAI's (Prompts, Evaluation runs)."""
    page.get_by_text("Model registry").first.wait_for(timeout=WAIT_MS)
    text = page.inner_text("body")
    assert "Prompts" not in text and "Evaluation runs" not in text, text[:600]
    assert stored_mode(page) == "machine_learning"


def test_the_plain_experiment_url_opens_its_runs_table(served, browser, tmp_path):
    base, experiment, _ = served
    page = fresh_page(browser)
    page.goto(f"{base}/#/experiments/{experiment}")
    page.get_by_text("2 matching runs").wait_for(timeout=WAIT_MS)  # the runs table, not the GenAI overview
    page.screenshot(path=str(tmp_path / "experiment.png"))
    assert_model_training(page)
    assert f"/experiments/{experiment}/runs" in page.url and "/overview" not in page.url, page.url
    page.get_by_text("fc1 lr=0.05").first.wait_for()  # a run's row
    page.context.close()


def test_the_experiments_list_and_the_experiment_clicked_there(served, browser, tmp_path):
    base, experiment, _ = served
    page = fresh_page(browser)
    page.goto(f"{base}/#/experiments")
    page.get_by_role("link", name="modes").wait_for(timeout=WAIT_MS)
    page.screenshot(path=str(tmp_path / "list.png"))
    assert_model_training(page)
    page.get_by_role("link", name="modes").click()  # what a user does next
    page.get_by_text("2 matching runs").wait_for(timeout=WAIT_MS)
    assert f"/experiments/{experiment}/runs" in page.url, page.url
    assert_model_training(page)
    page.context.close()


def test_a_run_page(served, browser, tmp_path):
    base, experiment, run = served
    page = fresh_page(browser)
    page.goto(f"{base}/#/experiments/{experiment}/runs/{run}")
    page.get_by_text("fc1 lr=0.05").first.wait_for(timeout=WAIT_MS)
    page.screenshot(path=str(tmp_path / "run.png"))
    assert_model_training(page)
    page.context.close()


def test_a_users_choice_of_genai_is_kept(served, browser, tmp_path):
    """A user who clicks "GenAI" keeps it: the seed writes only where nothing is stored."""
    base, experiment, _ = served
    page = fresh_page(browser)
    page.goto(f"{base}/#/experiments")
    page.get_by_role("link", name="modes").wait_for(timeout=WAIT_MS)
    page.get_by_text("GenAI", exact=True).first.click()  # the user's choice, stored by the UI itself
    page.wait_for_function(f"localStorage.getItem({json.dumps(MODE_KEY)}) === {json.dumps(json.dumps('genai'))}")
    page.goto(f"{base}/#/experiments/{experiment}")
    page.reload()  # the page (and its seed) loaded again
    page.get_by_text("Evaluation runs").first.wait_for(timeout=WAIT_MS)  # GenAI's sidebar
    page.wait_for_url(re.compile(r"/overview"), timeout=WAIT_MS)  # GenAI's landing page: the UI moves there after
    page.screenshot(path=str(tmp_path / "genai_kept.png"))
    assert "/overview" in page.url and stored_mode(page) == "genai", page.url
    page.context.close()
