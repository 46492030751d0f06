"""Other projects' internals, each checked against the installed version (``vitplast_tune._compat``): an upgrade
that moves one fails here, in one place. The versions they were read from: ``_compat.versions.READ_FROM``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import optuna
from ray import tune
from ray.tune.search.optuna import OptunaSearch

from vitplast_tune._compat import mlflow as mlflow_internals
from vitplast_tune._compat import ray as ray_internals
from vitplast_tune._compat import ray_tune


def test_local_resources_are_this_machines_before_ray_starts():
    found = ray_internals.local_resources()
    cpus = len(os.sched_getaffinity(0))
    assert found is not None and found["CPU"] == cpus and "GPU" in found


def test_this_process_started_its_ray_and_tasks_run_in_workers(ray_local):
    assert ray_internals.started_here() and not ray_internals.in_worker()
    assert ray_local.get(ray_local.remote(num_cpus=0)(ray_internals.in_worker).remote())


def test_the_autoscalers_report_names_a_fixed_instances_node_by_its_id(ray_local):
    deadline, mapping = time.monotonic() + 30, None
    while mapping is None and time.monotonic() < deadline:  # the monitor reports every few seconds
        mapping = ray_internals.autoscaler_node_types()
        time.sleep(0.5)
    node_id = ray_local.get_runtime_context().get_node_id()
    assert mapping is not None and mapping.get(node_id) == f"node_{node_id}"
    assert ray_internals.cluster_node_groups() is None  # no autoscaler v2 config on a local instance


def test_ray_tunes_optuna_search_keeps_its_study_and_trials_where_read():
    searcher = OptunaSearch(
        space={"x": tune.uniform(0.0, 1.0)}, metric="m", mode="max", sampler=optuna.samplers.RandomSampler(seed=0)
    )
    assert searcher.suggest("t1") is not None
    live = ray_tune.optuna_trials(searcher)
    assert isinstance(ray_tune.optuna_study(searcher), optuna.Study) and isinstance(live["t1"], optuna.trial.Trial)
    searcher.on_trial_complete("t1", result={"m": 0.5, "training_iteration": 1})
    assert "t1" in ray_tune.completed_trials(searcher)


def test_a_tuners_run_config_is_renewed_in_place(tmp_path):
    tuner = tune.Tuner(lambda config: None, run_config=tune.RunConfig(name="t", storage_path=str(tmp_path)))

    def renew(run_config):
        run_config.callbacks = ["marker"]
        return run_config

    ray_tune.renew_run_config(tuner, renew)
    assert tuner._local_tuner.get_run_config().callbacks == ["marker"]


def test_the_installed_mlflow_is_one_whose_ui_reads_the_saved_view():
    assert mlflow_internals.view_supported(mlflow_internals.installed_version())
    assert mlflow_internals.view_supported("3.18.0") and not mlflow_internals.view_supported("3.16.2")
    assert not mlflow_internals.view_supported("4.0.0")


def test_mlflows_tracking_schemes_and_a_servers_answer_are_read_where_they_live():
    from _servers import MLFLOW_API, http_server

    schemes = mlflow_internals.tracking_schemes()
    assert {"", "file", "http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks"} <= set(schemes)
    with http_server({MLFLOW_API: 200}) as url:
        assert mlflow_internals.ask_server(url, MLFLOW_API, 5, {"max_results": 1}).status_code == 200
        assert mlflow_internals.ask_server(url, "/elsewhere", 5).status_code == 404


def test_mlflows_job_runner_switch_is_where_read_and_off_for_our_servers_unless_set(monkeypatch):
    from mlflow import environment_variables

    key = mlflow_internals.JOB_EXECUTION_ENV
    assert environment_variables.MLFLOW_SERVER_ENABLE_JOB_EXECUTION.name == key
    monkeypatch.delenv(key, raising=False)
    assert environment_variables.MLFLOW_SERVER_ENABLE_JOB_EXECUTION.get() is True  # MLflow's default: on
    assert mlflow_internals.server_env()[key] == "false"
    monkeypatch.setenv(key, "true")  # a team that uses MLflow's GenAI jobs keeps them
    assert mlflow_internals.server_env()[key] == "true"


def test_tunes_failure_loggers_are_the_modules_own():
    import importlib
    import logging

    for name in (*ray_tune.FAILURE_LOGGERS, ray_tune.EXPERIMENT_ANALYSIS_LOGGER):  # each module's own logger
        assert importlib.import_module(name).logger is logging.getLogger(name)


def test_tunes_temporary_state_files_are_named_as_read(tmp_path, monkeypatch):
    """The names Tune's own saves give their temporary files are those ``renamed_while_uploaded`` knows."""
    from ray.tune.search.basic_variant import BasicVariantGenerator

    renamed, replace = [], os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (renamed.append(src), replace(src, dst)))
    BasicVariantGenerator().save_to_dir(str(tmp_path), session_str="x")
    assert renamed and all(Path(src).parent == tmp_path for src in renamed)
    for src in renamed:
        error = FileNotFoundError(2, f"[Errno 2] Failed to open local file '{src}'. Detail: [errno 2] No such file")
        assert ray_tune.renamed_while_uploaded(error) and not ray_tune.renamed_while_uploaded(OSError(str(error)))
    assert not ray_tune.renamed_while_uploaded(FileNotFoundError(f"Failed to open local file '{tmp_path}/state.json'"))


def test_a_trials_experiment_paths_and_error_text_are_where_read(tmp_path):
    from ray.train._internal.storage import StorageContext
    from ray.tune.experiment import Trial

    storage = StorageContext(str(tmp_path), "exp", trial_dir_name="trial_x")
    trial = Trial("f", config={}, storage=storage, stub=True)  # stub: no registered trainable needed
    staging, (fs, path) = ray_tune.experiment_paths(trial)
    assert staging.name == "driver_artifacts" and path == str(tmp_path / "exp") and fs.type_name == "local"
    assert ray_tune.trial_error_text(trial) == ""
    trial.init_local_path()
    trial.handle_error(RuntimeError("first"))
    trial.handle_error(OSError(28, "No space left on device"))
    assert "No space left on device" in ray_tune.trial_error_text(trial) and "first" not in ray_tune.trial_error_text(
        trial
    )


def test_mlflows_ui_page_and_its_mode_setting_are_where_the_app_reads_and_seeds_them():
    """The Flask view that sends the UI's page, the page's head, and the UI bundle's mode setting (its local storage
    key, JSON values) as ``_compat/mlflow_app.py`` read them; the entry point that names the app."""
    from importlib.metadata import entry_points

    from mlflow.server import app

    from vitplast_tune._compat import mlflow_app

    index = Path(app.static_folder or "") / "index.html"
    assert mlflow_app.INDEX_VIEW in app.view_functions and "<head>" in index.read_text()
    seeded = mlflow_app.seeded(index.read_text())
    assert seeded.index(mlflow_app.SEED) < seeded.index("<script defer")  # before the UI's bundle runs
    bundle = "".join(p.read_text(errors="replace") for p in (index.parent / "static" / "js").glob("main.*.js"))
    key, version = mlflow_app.MODE_KEY.rsplit("_v", 1)  # the hook stores under f"{key}_v{version}", values as JSON
    assert f'key:"{key}",version:{version}' in bundle and "`${e}_v${t}`" in bundle and "JSON.stringify" in bundle
    assert f'MACHINE_LEARNING="{mlflow_app.MODEL_TRAINING}"' in bundle
    declared = {point.value for point in entry_points(group="mlflow.app", name="vitplast")}
    assert declared == {"vitplast_tune._compat.mlflow_app:create_app"}


def test_a_newer_version_than_an_internal_was_read_from_is_named_in_a_note_before_the_search(tmp_path, monkeypatch):
    """The installed versions are those the internals were read from (no note); a newer major or minor version of
    Ray, MLflow or timm is named among the plan's notes (the dry run and the search print them), a patch release is
    not."""
    from importlib import metadata

    from _spaces import space_text

    from vitplast_tune._compat import versions
    from vitplast_tune.plan import SearchOptions
    from vitplast_tune.plan.planner import prepare

    installed = {project: metadata.version(project) for project in versions.READ_FROM}
    assert versions.untested() == versions.untested(installed) == []
    (note,) = versions.untested({**installed, "ray": "2.61.0"})
    assert note.startswith("ray 2.61.0 is newer than 2.60, whose internals this version of vitplast_tune reads")
    assert versions.untested({**installed, "mlflow": "3.17.9", "timm": "1.0.99"}) == []
    assert [n.split()[0] for n in versions.untested({**installed, "mlflow": "4.0.0rc1", "timm": "1.1"})] == [
        "mlflow",
        "timm",
    ]

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda project: "3.0.0" if project == "ray" else real(project))
    (tmp_path / "space.yaml").write_text(space_text(parameters={"components": {"choice": ["mha"]}}))
    plan = prepare(SearchOptions(space=str(tmp_path / "space.yaml"), storage=str(tmp_path / "results")))
    assert [n for n in plan.notes if n.startswith("ray 3.0.0 is newer than 2.60")], plan.notes


def test_the_placement_group_of_a_dead_train_controller_is_found_and_released(ray_local):
    """A Train run's controller that dies with its trial leaves its workers' placement group, and the CPUs in it,
    while the driver lives (Ray frees a placement group when both the actor and the job that made it have ended):
    ``orphaned_train_placement_groups`` finds it (and no other: a live controller's, another dead actor's, the
    driver's own) and ``run.parallel.release_orphans`` gives its CPUs back."""
    import ray
    from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

    from vitplast_tune.run import parallel

    class Maker:
        """An actor that reserves a placement group of 0.3 CPU and keeps it."""

        def make(self):
            group = placement_group([{"CPU": 0.3}])
            ray.get(group.ready())
            return group.id.hex()

    TrainController = type("TrainController", (Maker,), {})  # the class Ray Train's controllers have
    dead, alive = (ray_local.remote(num_cpus=0)(TrainController).remote() for _ in range(2))
    other = ray_local.remote(num_cpus=0)(type("Other", (Maker,), {})).remote()
    made = {name: ray.get(actor.make.remote()) for name, actor in [("dead", dead), ("alive", alive), ("other", other)]}
    own = placement_group([{"CPU": 0.1}])  # the driver's, as Tune's trials have
    ray.get(own.ready())
    ray.kill(dead, no_restart=True)  # the trial's process ended: its controller with it
    ray.kill(other, no_restart=True)
    try:
        deadline = time.time() + 60
        while not (found := ray_internals.orphaned_train_placement_groups()) and time.time() < deadline:
            time.sleep(0.2)  # the GCS learns of the death
        assert found is not None and [group.id.hex() for group in found] == [made["dead"]]
        assert placement_group_table()[made["dead"]]["state"] == "CREATED"  # Ray keeps it while the job lives
        assert parallel.release_orphans() == 1
        assert placement_group_table()[made["dead"]]["state"] == "REMOVED"
        assert {placement_group_table()[made[k]]["state"] for k in ("alive", "other")} == {"CREATED"}
        assert ray_internals.orphaned_train_placement_groups() == [] and parallel.release_orphans() == 0
    finally:
        ray.kill(alive, no_restart=True)
        for group_id in (made["alive"], made["other"], own.id.hex()):
            if placement_group_table()[group_id]["state"] != "REMOVED":
                remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(group_id)))
