"""Serve a search's MLflow UI on 127.0.0.1 and print the link to its view (``vitplast ui NAME``)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
import webbrowser
from importlib.metadata import entry_points

from vitplast_tune._compat.mlflow import server_env
from vitplast_tune.errors import UserError
from vitplast_tune.records import view as mlflow_view
from vitplast_tune.records.tracking import ARTIFACTS_DIR, BEST_RUN_TAG, client, sqlite_file
from vitplast_tune.storage import read_record, search_dir

HOST = "127.0.0.1"
READY_TIMEOUT_S = 300.0  # mlflow ui takes a minute or more to start on a busy machine
APP = "vitplast"  # MLflow's server whose UI opens in model-training mode (pyproject's mlflow.app entry point)


def links(name: str, record: dict, base_url: str | None = None) -> list[str]:
    """Return the links to a search's view and to its best trial's run, asked through ``base_url`` when given."""
    uri = record["tracking_uri"]
    mlflow = client(base_url or uri)
    try:
        parent = mlflow.get_run(record["parent_run_id"])
    except Exception as exc:  # the store moved, or the server is not running
        raise UserError(
            f'search "{name}": its MLflow run {record["parent_run_id"]} is not in {uri} ({str(exc).splitlines()[0]})'
        ) from None
    base = base_url or mlflow_view.ui_base_url(uri)
    experiment = parent.info.experiment_id
    found = [mlflow_view.view_link(mlflow, experiment, name, base)]
    if best := parent.data.tags.get(BEST_RUN_TAG):
        found.append(mlflow_view.run_link(base, experiment, best))
    return found


def compared(names: list[str], records: list[dict], base_url: str | None = None) -> str:
    """Save one view of several searches' trials on their shared experiment, and return its link."""
    uri = records[0]["tracking_uri"]
    mlflow = client(base_url or uri)
    try:
        experiment = mlflow.get_run(records[0]["parent_run_id"]).info.experiment_id
    except Exception as exc:  # the store moved, or the server is not running
        raise UserError(f'search "{names[0]}": its MLflow run is not in {uri} ({str(exc).splitlines()[0]})') from None
    run_ids = []
    for name in names:
        found = mlflow.search_runs([experiment], mlflow_view.search_filter(name), max_results=50_000)
        run_ids += [run.info.run_id for run in found]
    base = base_url or mlflow_view.ui_base_url(uri)
    return mlflow_view.publish_comparison(mlflow, experiment, names, run_ids, base)


def _same_store(names: list[str], records: list[dict]) -> None:
    """Refuse searches that do not record to one tracking store and experiment."""
    for key, what in (("tracking_uri", "MLflow tracking stores"), ("experiment", "MLflow experiments")):
        values = {n: r.get(key, "vitplast_tune") for n, r in zip(names, records)}
        if len(set(values.values())) > 1:
            said = ", ".join(f"{n}: {v}" for n, v in values.items())
            raise UserError(f"the searches record to different {what} ({said}); open each with vitplast ui NAME")


def serve(name: str | list[str], storage: str | None = None, port: int = 5000, open_browser: bool = False) -> int:
    """Start the MLflow UI on a search's store, print its links, and serve until Ctrl-C or SIGTERM.

    A search that records to a server gets its links and no new UI.

    Args:
        name: The search's name, or several searches of one store to show in one view.
        storage: The storage folder the searches are in (None: the default).
        port: The port the UI serves on, at 127.0.0.1.
        open_browser: Open the view in a browser.

    Returns:
        The exit code, 0.

    Raises:
        UserError: A search is named twice or not recorded, the stores differ, or the port is taken.
    """
    names = [name] if isinstance(name, str) else list(name)
    if len(set(names)) < len(names):
        raise UserError(f"a search is named twice ({', '.join(names)}); name each once")
    records = [read_record(search_dir(n, storage), purpose="recorded") for n in names]
    _same_store(names, records)
    record, name = records[0], names[0]
    record_uri, server = record["tracking_uri"], None
    previous = signal.signal(signal.SIGTERM, _exit)  # a terminated command stops its UI too
    try:
        if not record_uri.startswith(("http://", "https://")):
            server = start_ui(record_uri, port)
        base_url = None if server is None else f"http://{HOST}:{port}"
        if len(names) > 1:
            found = [compared(names, records, base_url)]
            print(f"MLflow view of {', '.join(names)}: {found[0]}", flush=True)
        else:
            found = links(name, record, base_url)
            print(f"MLflow view:      {found[0]}", flush=True)
        if len(found) > 1:
            print(f"Best trial's run: {found[1]}", flush=True)
        if open_browser:
            webbrowser.open(found[0])
        if server is not None:
            print(f"MLflow UI on http://{HOST}:{port} ({record_uri}); Ctrl-C stops it", flush=True)
            server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if server is not None:
            stop(server)
    return 0


def _exit(signum, frame) -> None:
    raise SystemExit(0)


def start_ui(tracking_uri: str, port: int) -> subprocess.Popen:
    """Start ``mlflow ui --app-name vitplast`` on ``tracking_uri`` at 127.0.0.1 and wait until it answers.

    MLflow's job runner stays off (``server_env``): the UI needs none of its processes.

    Raises UserError when the port is taken or the UI does not start.
    """
    with socket.socket() as probe:
        if probe.connect_ex((HOST, port)) == 0:
            raise UserError(f"port {port} on {HOST} is in use (another MLflow UI?); pass --port N")
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri]
    cmd += ["--host", HOST, "--port", str(port), "--workers", "1"]
    if entry_points(group="mlflow.app", name=APP):  # absent only from an install made before it was declared
        cmd += ["--app-name", APP]
    else:
        print(
            f"note: MLflow's app {APP!r} is not installed (pip install -e . again): the UI opens in the mode the "
            "browser last chose (GenAI by default)",
            file=sys.stderr,
            flush=True,
        )
    if (database := sqlite_file(tracking_uri)) is not None:  # what the UI makes goes beside the store too
        cmd += ["--artifacts-destination", str(database.resolve().parent / ARTIFACTS_DIR)]
    server = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=server_env())
    try:
        _wait_ready(server, f"http://{HOST}:{port}/health")
    except BaseException:  # not ready, Ctrl-C or SIGTERM: stopped here, as nobody else holds it yet
        stop(server)
        raise
    return server


def _wait_ready(server: subprocess.Popen, health: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise UserError(f"the MLflow UI exited (code {server.returncode}); see its messages above")
        try:
            with urllib.request.urlopen(health, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise UserError(f"the MLflow UI did not answer at {health} within {READY_TIMEOUT_S:.0f} s")


def stop(server: subprocess.Popen) -> None:
    """Stop the UI this command started, by its pid."""
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
