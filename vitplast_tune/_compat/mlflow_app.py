"""MLflow's tracking server as an app plugin (the ``mlflow.app`` entry point ``vitplast``: ``mlflow server --app-name
vitplast``, which ``vitplast ui`` starts): MLflow's own app, whose UI page opens in model-training mode in a browser
that has not chosen a mode.

MLflow 3.17's and 3.18's UI takes its mode from the URL's ``workflowType``, else from the browser's own setting (local
storage ``mlflow.workflowType_v1``, the JSON of "machine_learning" or "genai", written when a user clicks a mode),
else GenAI; the experiment's ``mlflow.experimentKind`` tag is not read. So the page the server sends for every UI URL
(its ``index.html``, served by the Flask view ``serve``) gains one script, run before the UI's bundle, that writes
that setting where it is unset: the same as a user's one click on "Model training", never over a user's choice.
Read from MLflow 3.17.2's server (``mlflow/server/__init__.py``, ``fastapi_app.py``) and UI bundle (its
``useLocalStorage`` hook: key ``f"{key}_v{version}"``, value ``JSON.stringify``); tested in Chromium against the
installed version (``tests/records/test_mlflow_modes.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

from vitplast_tune import environment

MODE_KEY = "mlflow.workflowType_v1"  # the UI's useLocalStorage({key: "mlflow.workflowType", version: 1})
MODEL_TRAINING = "machine_learning"  # its value for "Model training" (the other: "genai")
INDEX_VIEW = "serve"  # the Flask view that sends index.html for every UI URL
SEED = (
    f"<script>try{{if(localStorage.getItem({json.dumps(MODE_KEY)})===null)"
    f"localStorage.setItem({json.dumps(MODE_KEY)},{json.dumps(json.dumps(MODEL_TRAINING))})}}catch(e){{}}</script>"
)


def seeded(index_html: str) -> str:
    """The UI page ``index_html`` with the mode's seed as the first thing its head runs.

    Args:
        index_html: the text of MLflow's ``index.html``.

    Returns:
        The page with ``SEED`` right after ``<head>`` (before it when the page has no head tag).
    """
    head = index_html.find("<head>")
    if head < 0:
        return SEED + index_html
    return index_html[: head + len("<head>")] + SEED + index_html[head + len("<head>") :]


def create_app():
    """MLflow's server app with the seeded UI page: the FastAPI app under uvicorn (MLflow's default), else Flask's.

    Returns:
        The app for the server ``mlflow server --app-name vitplast`` runs (a factory: MLflow calls it).
    """
    from mlflow.server import app

    index = Path(app.static_folder or "") / "index.html"
    plain = app.view_functions[INDEX_VIEW]

    def serve():
        if not index.is_file():  # a source install of MLflow without its built UI: MLflow's own message
            return plain()
        answer = app.response_class(seeded(index.read_text()), mimetype="text/html")
        answer.headers["Cache-Control"] = "no-cache"
        return answer

    app.view_functions[INDEX_VIEW] = serve
    if environment.read("_MLFLOW_SGI_NAME", "uvicorn") != "uvicorn":  # waitress or gunicorn serve Flask's app
        return app
    from mlflow.server.fastapi_app import app as fastapi_app  # MLflow's own, around the same Flask app

    return fastapi_app
