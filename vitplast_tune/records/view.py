"""Save a search's MLflow UI view (its trials, columns, sort and charts) and make the link that opens it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

from vitplast_tune._compat import mlflow as mlflow_internals
from vitplast_tune.components import COMPONENT_FLAGS
from vitplast_tune.search_names import view_key
from vitplast_tune.storage import SearchPlace, spoken

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# The experiment's kind: model training, not GenAI. MLflow UIs 3.17 and 3.18 ignore it and read the mode from the
# link's ``workflowType=machine_learning``, which every link made here carries.
KIND_TAG = "mlflow.experimentKind"
KIND = "custom_model_development"
DEFAULT_UI = "http://127.0.0.1:5000"  # what ``mlflow ui --host 127.0.0.1`` serves
SORT_METRIC = "val_acc_common"
ROLE_TAG = "vitplast.role"
SEARCH_TAG = "vitplast.search"
PARALLEL_HEIGHT = 480  # px: the parallel coordinates chart spans the charts' width, one row of its own


@dataclass
class View:
    """A search's MLflow UI view and the link that opens it.

    Attributes:
        link: The link that opens the view (or the runs page, filtered and sorted).
        saved: Whether a view was saved (else the link is a plain one).
        note: Why no view could be saved ("" when one was).
        experiment_id: The MLflow experiment the view belongs to.
    """

    link: str
    saved: bool
    note: str = ""
    experiment_id: str = ""


def ui_base_url(tracking_uri: str) -> str:
    """Return the MLflow UI's address: the tracking server's, else what ``mlflow ui`` serves by default."""
    parts = urlsplit(tracking_uri)
    if parts.scheme in ("http", "https") and parts.netloc:
        return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
    return DEFAULT_UI


def ui_command(place: SearchPlace) -> str | None:
    """Write the command that starts the MLflow UI on a search's store.

    Args:
        place: Where the search keeps its records.

    Returns:
        ``vitplast ui NAME``, or ``mlflow ui`` for a search without a local record; None when a server records it.
    """
    if place.tracking_uri.startswith(("http://", "https://")):
        return None
    if place.local_dir is None:
        return f"mlflow ui --backend-store-uri {spoken(place.tracking_uri)} --host 127.0.0.1"
    return f"vitplast ui {place.name}" + ("" if place.in_default_storage() else f" --storage {spoken(place.storage)}")


def search_filter(search: str) -> str:
    """Write the runs filter that shows the trials of one search, not its parent run."""
    return f"tags.`{SEARCH_TAG}` = '{search}' and tags.`{ROLE_TAG}` = 'trial'"


SECTION, WIDE = "vitplast_tune", "vitplast_tune-parallel"  # the parallel coordinates get a row of their own


def view_state(search: str, plasticity: bool, cost: bool = False) -> dict[str, Any]:
    """Make the runs page state of a search's view: its trials by accuracy at the common step, columns and charts."""
    metrics = ["best_val_acc", SORT_METRIC, *(["plasticity_mean"] if plasticity else []), "trainable_params"]
    metrics += ["time_in_steps_s"] if cost else []
    columns = [
        _column("attributes", "Dataset"),
        _column("params", "components"),
        _column("params", "lr"),
        *(_column("metrics", m) for m in metrics),
    ]
    return {
        "searchFilter": search_filter(search),
        "orderByKey": _column("metrics", SORT_METRIC),
        "orderByAsc": False,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "datasetsFilter": [],
        "modelVersionFilter": "All Runs",
        "selectedColumns": columns,
        "columnOrder": [],
        "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": _charts(plasticity, cost),
        "compareRunSections": [
            _section(SECTION, "vitplast_tune"),
            _section(WIDE, "vitplast_tune: component flags and lr", columns=1, cardHeight=PARALLEL_HEIGHT),
        ],
        "isAccordionReordered": True,
        "hideEmptyCharts": True,
        "useGroupedValuesInCharts": True,
        "groupBy": None,
        "viewMaximized": False,
        "runListHidden": False,
    }


def _charts(plasticity: bool, cost: bool = False) -> list[dict[str, Any]]:
    """Make the view's charts: accuracy against each predictor and cost, the flags in parallel, the curves."""
    parallel = _chart(
        "PARALLEL",
        WIDE,
        displayName="component flags and log10 lr to accuracy",
        selectedParams=list(COMPONENT_FLAGS),
        selectedMetrics=["log10_lr", SORT_METRIC],
        showAllRuns=True,
    )
    curves = _chart(
        "LINE",
        SECTION,
        displayName="val_acc curves",
        metricKey="val_acc",
        selectedMetricKeys=["val_acc"],
        lineSmoothness=0,
        xAxisKey="step",
        xAxisScaleType="linear",
        scaleType="linear",
        selectedXAxisMetricKey="",
        range={},
        yAxisKey="metric",
        yAxisExpressions=[],
        ignoreOutliers=False,
        useGlobalXaxisKey=False,
        useGlobalLineSmoothing=False,
    )
    return [
        *([_scatter("plasticity_mean", "accuracy vs plasticity", SECTION)] if plasticity else []),
        _scatter("log10_trainable_params", "accuracy vs log10 trainable parameters", SECTION),
        *([_scatter("time_in_steps_s", "accuracy vs training GPU-seconds", SECTION)] if cost else []),
        parallel,
        curves,
    ]


def save_view(client, experiment_id: str, key: str, name: str, state: dict[str, Any]) -> None:
    """Store ``state`` as the experiment's shared view ``key``, the tag the UI reads for ``viewStateShareKey``."""
    now = int(time.time() * 1000)
    envelope = {"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    tag = (experiment_id, mlflow_internals.VIEW_TAG_PREFIX + key, json.dumps(envelope))
    try:
        client.set_experiment_tag(*tag)
    except Exception as exc:  # a search of the same name on one server saved it at the same moment: ours replaces it
        if not mlflow_internals.written_first_by_another(exc):
            raise
        client.set_experiment_tag(*tag)


def _runs_link(
    base_url: str,
    experiment_id: str,
    share_key: str | None = None,
    search: str | None = None,
    mode: str = "CHART",
    runs_filter: str | None = None,
) -> str:
    """Link the runs page in model-training mode: the saved view, else the runs filtered through the URL."""
    query: dict[str, str] = {"workflowType": "machine_learning", "compareRunsMode": mode}
    if share_key:
        query["viewStateShareKey"] = share_key
    elif search or runs_filter:
        said = runs_filter or search_filter(search or "")
        query.update(searchFilter=said, orderByKey=_column("metrics", SORT_METRIC), orderByAsc="false")
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(query)}"


def run_link(base_url: str, experiment_id: str, run_id: str) -> str:
    """Link a run's page in model-training mode."""
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


def _kind_chosen(kind: str | None) -> bool:
    """Tell whether someone set an experiment's kind, rather than leaving it unset or to the UI's guess."""
    return bool(kind) and not kind.endswith("_inferred") and kind != "no_inferred_type"


def mark_model_training(client, experiment_id: str, tries: int = 3) -> None:
    """Tag the experiment as model training unless a kind is set, trying again when another search set it at once."""
    from mlflow.exceptions import MlflowException

    for attempt in range(tries):
        if _kind_chosen(client.get_experiment(experiment_id).tags.get(KIND_TAG)):
            return
        try:
            client.set_experiment_tag(experiment_id, KIND_TAG, KIND)
            return
        except MlflowException:
            if attempt == tries - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


def publish(client, experiment_id: str, search: str, plasticity: bool, base_url: str, cost: bool = False) -> View:
    """Mark the experiment as model training and save the search's view where this MLflow's format is known."""
    mark_model_training(client, experiment_id)
    if not mlflow_internals.view_supported():
        note = (
            f"MLflow {mlflow_internals.installed_version()} is not supported for the saved view (supported: "
            f"{', '.join(mlflow_internals.VIEW_FORMAT_VERSIONS)}; its format is not one this knows): the link opens "
            "the trials without the saved columns and charts"
        )
        return View(_runs_link(base_url, experiment_id, search=search), False, note, experiment_id)
    key = view_key(search)
    save_view(client, experiment_id, key, f"vitplast_tune: {search}", view_state(search, plasticity, cost))
    return View(_runs_link(base_url, experiment_id, share_key=key), True, "", experiment_id)


def view_link(client, experiment_id: str, search: str, base_url: str) -> str:
    """Link a search's view as stored: the saved view when its tag is there, else the trials through the URL."""
    key = view_key(search)
    saved = mlflow_internals.VIEW_TAG_PREFIX + key in client.get_experiment(experiment_id).tags
    return _runs_link(base_url, experiment_id, share_key=key if saved else None, search=search)


def publish_comparison(
    client: MlflowClient, experiment_id: str, searches: list[str], run_ids: list[str], base_url: str
) -> str:
    """Save one view of several searches' trial runs, each run's search a column, and return its link.

    MLflow's filters have no OR, so the view names the runs. An unknown view format gets the filter in the URL.
    """
    runs = "attributes.run_id IN (" + ", ".join(f"'{r}'" for r in run_ids) + ")"
    if not mlflow_internals.view_supported():
        return _runs_link(base_url, experiment_id, runs_filter=runs)
    state = view_state(searches[0], plasticity=True)  # charts without a metric are hidden (hideEmptyCharts)
    state["searchFilter"] = runs
    state["selectedColumns"] = [_column("tags", SEARCH_TAG), *state["selectedColumns"]]
    key = view_key("compare-" + "-".join(searches))
    save_view(client, experiment_id, key, f"vitplast_tune: {', '.join(searches)}", state)
    return _runs_link(base_url, experiment_id, share_key=key)


def _column(group: str, name: str) -> str:
    return f"{group}.`{name}`"


def _section(uuid: str, name: str, **grid: Any) -> dict[str, Any]:
    """Make a chart section of the view; ``grid`` holds the UI's ``columns`` per row and ``cardHeight``."""
    return {
        "uuid": uuid,
        "name": name,
        "display": True,
        "isReordered": True,
        "deleted": False,
        "isGenerated": False,
        **grid,
    }


def _chart(kind: str, section: str, **fields: Any) -> dict[str, Any]:
    uuid = f"vitplast-{kind.lower()}-{fields.get('metricKey') or len(fields)}"
    return {
        "uuid": uuid,
        "type": kind,
        "runsCountToCompare": 1000,
        "metricSectionId": section,
        "deleted": False,
        "isGenerated": False,
        **fields,
    }


def _scatter(x_metric: str, title: str, section: str) -> dict[str, Any]:
    chart = _chart(
        "SCATTER",
        section,
        displayName=title,
        xaxis={"key": x_metric, "type": "METRIC"},
        yaxis={"key": SORT_METRIC, "type": "METRIC"},
    )
    chart["uuid"] = f"vitplast-scatter-{x_metric}"
    return chart
