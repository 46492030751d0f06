"""Serve MLflow's app with its UI opening in model-training mode; read from MLflow 3.17.2 and tested in Chromium."""

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
    """Put the mode's ``SEED`` right after ``<head>`` of MLflow's ``index.html`` (before the page without one)."""
    head = index_html.find("<head>")
    if head < 0:
        return SEED + index_html
    return index_html[: head + len("<head>")] + SEED + index_html[head + len("<head>") :]


def create_app():
    """Build MLflow's server app with the seeded UI page: FastAPI's under uvicorn, else Flask's.

    Returns:
        The app that ``mlflow server --app-name vitplast`` runs.
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
