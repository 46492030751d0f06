"""Distributed searches on real local Ray clusters, an autoscaling fake cluster and an mlflow server.

Every cluster here is started by the test with ``ray start --block`` (its own temp dir and ports)
and stopped by pid (tests/_raycluster.py); the search runs as ``scripts/search.py --address ...``
in a subprocess, as a user would run it. Trials are tiny (a random testbed ViT, a few steps), and
each node has one CPU. Runs and node tags are read back with MlflowClient. The two-node cluster takes a token
(a driver without it is refused); on it, a
trial of two data-parallel workers (``--workers-per-trial 2 --placement spread``) trains on both nodes.
"""

from __future__ import annotations

import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
import ray
import yaml
from _commands import search_command
from _raycluster import LocalCluster, MlflowServer, free_ports, node_ip
from _spaces import space_text
from mlflow.tracking import MlflowClient

from vitplast_tune import storage
from vitplast_tune.plan import EXPERIMENT, ray_request
from vitplast_tune.plan.resources import fits
from vitplast_tune.records import tracking
from vitplast_tune.records.tracking import find_search_run
from vitplast_tune.run.cluster import CONFIG_ENV, node_types

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = ROOT / "scripts" / "cluster"
SPREAD_STEPS = 200  # a few seconds per trial
DDP_STEPS = {"max_steps": 8, "eval_every": 2}  # the data-parallel trial: four evaluations to compare
FAKE_HEAD_NODE_ID = "f" * 51 + "00000"  # the fake provider's head; its workers are f...f00001, f...f00002


OPTUNA_SPACE = """
description: tiny optuna search for the autoscaler
metric: val_acc
mode: max
algorithm: optuna
num_samples: 4
scheduler: fifo
parameters:
  components: {subsets: any}
  lr: {loguniform: [0.01, 0.1]}
defaults: {model: vit_testbed_patch8_32, pretrained: false, max_steps: 20, eval_every: 10, warmup_steps: 1, batch_size: 16}
"""


def write_space(path: Path, components: list[str], steps: int = 6) -> Path:
    path.write_text(
        space_text(
            description="tiny cluster search",
            parameters={"components": {"choice": components}},
            defaults={"max_steps": steps, "eval_every": steps // 2, "warmup_steps": 1, "batch_size": 16},
        )
    )
    return path


def run_search(
    env: dict,
    root: Path,
    name: str,
    address: str,
    tracking_uri: str,
    components: list[str],
    *extra: str,
    timeout: float = 300,
    steps: int = 6,
) -> subprocess.CompletedProcess:
    """``scripts/search.py --address`` in a subprocess; returns it finished (output captured)."""
    space = write_space(root / f"{name}.yaml", components, steps)
    cmd = search_command(space, name, root / "results", "--tracking-uri", tracking_uri, "--address", address)
    cmd += ["--max-failures", "0", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=root)


def local_search(root: Path, env: dict, name: str) -> subprocess.CompletedProcess:
    """A tiny search without --address, as a user runs it, in ``env`` (its RAY_TMPDIR is where Ray looks for clusters)."""
    space = write_space(root / f"{name}.yaml", ["mha"])
    cmd = [sys.executable, str(ROOT / "scripts" / "search.py"), "--space", str(space), "--name", name]
    cmd += ["--storage", str(root / "results"), "--no-plasticity", "--cpus-per-trial", "1"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=root)


def child_runs(tracking_uri: str, name: str) -> tuple[object, list]:
    client = MlflowClient(tracking_uri)
    parent = find_search_run(client, EXPERIMENT, name)
    assert parent, f"no parent run for {name}"
    return client.get_run(parent), tracking.child_runs(client, parent)


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


# ----------------------------------------------------------------------------- cluster definitions (fast)


def test_launcher_yaml_validates_against_rays_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((CLUSTER_DIR / "aws.yaml").read_text())
    validate_config(prepare_config(config))  # what `ray up` does before it talks to the cloud
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    workers = [t for name, t in types.items() if name != config["head_node_type"]]
    assert any(t["resources"].get("GPU", 0) >= 1 and t["min_workers"] < t["max_workers"] for t in workers)
    assert any("vitplast_tune" in c and "pip install" in c for c in config["setup_commands"])
    assert "~/.ray/auth_token" in config["file_mounts"]  # token authentication: the token on every node
    # Every Ray process in Ray's GPU image of the tested Ray version (the package installed in it by setup_commands),
    # on an AMI named on purpose (Ray's latest_dlami is an old CUDA and Python); workers may write the bucket.
    assert config["docker"]["image"] == f"rayproject/ray:{ray.__version__}-py311-gpu"
    assert all(t["node_config"]["ImageId"] != "latest_dlami" for t in types.values())
    assert all("instance-profile/" in t["node_config"]["IamInstanceProfile"]["Arn"] for t in workers)
    starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
    assert all("RAY_AUTH_MODE=token" in c for c in starts if "ray start" in c)


def test_fake_autoscaler_yaml_is_a_complete_autoscaler_config():
    from ray.autoscaler._private.util import validate_config

    config = yaml.safe_load((CLUSTER_DIR / "fake_autoscaler.yaml").read_text())
    validate_config(config)  # no defaults file is merged in for fake_multinode: the file must be complete
    assert config["provider"]["type"] == "fake_multinode" and config["provider"]["gcs_address"]
    worker = config["available_node_types"]["ray.worker.trainer"]
    assert worker["resources"]["trainer"] == 1 and worker["resources"]["GPU"] == 1 and worker["min_workers"] == 0
    assert "GPU" not in config["available_node_types"]["ray.head.default"]["resources"]


def test_kuberay_manifest_autoscales_with_token_auth_and_storage_credentials():
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    account, manifest = yaml.safe_load_all((CLUSTER_DIR / "kuberay.yaml").read_text())
    assert manifest["kind"] == "RayCluster" and manifest["spec"]["enableInTreeAutoscaling"] is True
    assert account["kind"] == "ServiceAccount" and "eks.amazonaws.com/role-arn" in account["metadata"]["annotations"]
    spec = manifest["spec"]
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:  # every pod reaches the bucket as that account
        assert group["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    containers = [
        c for g in [spec["headGroupSpec"], *spec["workerGroupSpecs"]] for c in g["template"]["spec"]["containers"]
    ]
    for env in [spec["autoscalerOptions"]["env"]] + [
        c["env"] for c in containers
    ]:  # the token reaches every Ray process
        values = {e["name"]: e.get("value") or e["valueFrom"]["secretKeyRef"]["name"] for e in env}
        assert values == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "vitplast-ray-token"}
    config = _derive_autoscaling_config_from_ray_cr(manifest)  # what the KubeRay autoscaler derives and validates
    head = config["available_node_types"]["headgroup"]
    assert head["resources"]["GPU"] == 0 and head["resources"]["CPU"] == 0
    gpu = config["available_node_types"]["gpu"]
    assert gpu["resources"]["GPU"] == 1 and gpu["min_workers"] == 0 and gpu["max_workers"] == 4


def dockerfile_copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY of scripts/cluster/Dockerfile."""
    copies = []
    for line in (CLUSTER_DIR / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            words = [w for w in shlex.split(line)[1:] if not w.startswith("--")]
            copies.append((words[:-1], words[-1]))
    return copies


def test_dockerfile_copies_what_exists_and_installs_the_package_from_it():
    text = (CLUSTER_DIR / "Dockerfile").read_text()
    assert f"FROM rayproject/ray:{ray.__version__}-py311-gpu" in text
    copies = dockerfile_copies()
    sources = [source for sources, _ in copies for source in sources]
    missing = [source for source in sources if not (ROOT / source).exists()]
    assert not missing, f"the Dockerfile copies paths the repository lacks: {missing}"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", pyproject["project"]["readme"], "vitplast_tune"}
    needed |= set(pyproject["tool"]["setuptools"]["package-dir"].values())  # search_spaces, at the repository's top
    assert needed <= set(sources), f"the package needs {sorted(needed - set(sources))} in the image"
    assert "pip install --no-cache-dir /home/ray/vitplast_tune" in text


@pytest.mark.slow
def test_the_package_builds_from_exactly_what_the_dockerfile_copies(tmp_path):
    image = tmp_path / "image"
    for sources, destination in dockerfile_copies():  # as `docker build` lays them out, under /home/ray
        target = image / Path(destination).relative_to("/home/ray")
        for source in sources:
            into = target / Path(source).name if destination.endswith("/") else target
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, into, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
            else:
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / source, into)
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp_path)]
    subprocess.run([*build, str(image / "vitplast_tune")], check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("vitplast_tune-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "vitplast_tune/search_spaces/component_subsets.yaml" in names
    assert any(n.startswith("vitplast_tune/weights/") and n.endswith(".safetensors") for n in names)


def test_request_checks_without_ray(tmp_path, monkeypatch):
    assert ray_request({"cpu": 4, "gpu": 0.5, "x": 1, "y": 0}) == {"CPU": 4.0, "GPU": 0.5, "x": 1.0}
    assert fits({"CPU": 8, "GPU": 1}, {"CPU": 4, "GPU": 0.5})
    assert not fits({"CPU": 8, "GPU": 1}, {"CPU": 4, "x": 1})
    monkeypatch.setenv(CONFIG_ENV, str(CLUSTER_DIR / "aws.yaml"))
    source, types = node_types()
    assert types["gpu_worker"] == {"CPU": 8, "GPU": 1} and "head" in types
    assert storage.storage_uri("file:///tmp/x") == "/tmp/x"
    assert storage.storage_uri("s3://bucket/dir/") == "s3://bucket/dir"
    with pytest.raises(Exception, match="unknown scheme"):
        storage.storage_uri("ftp://host/dir")


# ----------------------------------------------------------------------------- a real two-node cluster


@pytest.fixture(scope="class")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    yield server
    server.stop()


@pytest.fixture(scope="class")
def two_nodes(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-nodes")
    # The head's temp dir is $RAY_TMPDIR/ray of a RAY_TMPDIR of its own: `ray start` leaves ray_current_cluster there,
    # where a local search run with that RAY_TMPDIR looks (TestTwoNodeCluster.test_a_local_search_...). The path is
    # short, for Ray's socket paths.
    ray_tmpdir = Path(tempfile.mkdtemp(prefix="vtr", dir="/tmp"))
    # The worker joins with the token.
    c = LocalCluster(root, head_cpus=1, auth_token=secrets.token_hex(32), temp_dir=ray_tmpdir / "ray")
    try:
        c.add_worker(cpus=1, resources={"worker_node": 1})
        yield c
    finally:
        c.stop()
        shutil.rmtree(ray_tmpdir, ignore_errors=True)


@pytest.mark.slow
class TestTwoNodeCluster:
    """Head (1 CPU) + worker (1 CPU, custom resource), token authentication, a search logging to an mlflow server."""

    @pytest.fixture(scope="class")
    def searched(self, two_nodes, mlflow_server, tmp_path_factory):
        """The spread search, with the token; beside it, the same driver without the token (refused)."""
        root = tmp_path_factory.mktemp("two-node-search")
        # Without the mode and token (RAY_AUTH_MODE=disabled) the driver is refused. Ray retries for about 20 s
        # before it gives up, so this driver runs alongside the one with the token.
        refused: dict[str, subprocess.CompletedProcess] = {}
        no_token = two_nodes.env(RAY_AUTH_MODE="disabled", RAY_AUTH_TOKEN="")
        uri = f"sqlite:///{root / 'refused.db'}"
        thread = threading.Thread(
            target=lambda: refused.update(
                proc=run_search(no_token, root, "no-token", two_nodes.address, uri, ["head"], timeout=180)
            )
        )
        thread.start()
        started = time.time()
        # Two trials, both pending from the start, one for each node's CPU; long enough (a few seconds) that the
        # second node's trial actor is up before the first node's actor, reused from trial to trial, could run both.
        proc = run_search(
            two_nodes.env(),
            root,
            "spread",
            two_nodes.address,
            mlflow_server.uri,
            ["mha", "head"],
            steps=SPREAD_STEPS,
        )
        elapsed = time.time() - started
        thread.join()
        assert proc.returncode == 0, explain(proc)
        return proc, elapsed, refused["proc"], uri

    def test_trials_land_on_both_nodes(self, two_nodes, mlflow_server, searched):
        parent, children = child_runs(mlflow_server.uri, "spread")
        assert parent.info.status == "FINISHED" and len(children) == 2
        assert all(r.info.status == "FINISHED" for r in children)
        node_ids = {n["NodeID"] for n in two_nodes.alive_nodes()}
        assert len(node_ids) == 2
        used = {r.data.tags["ray.node_id"] for r in children}
        assert used == node_ids, f"trials ran on {used}, nodes are {node_ids}"
        assert {r.data.tags["ray.node_ip"] for r in children} == {node_ip()}

    def test_runs_read_back_from_mlflow_server(self, mlflow_server, searched):
        assert mlflow_server.uri.startswith("http://127.0.0.1:")
        client = MlflowClient(mlflow_server.uri)
        _, children = child_runs(mlflow_server.uri, "spread")
        for run in children:
            history = client.get_metric_history(run.info.run_id, "val_acc")
            assert sorted(m.step for m in history) == [SPREAD_STEPS // 2, SPREAD_STEPS]
            assert 0 <= run.data.metrics["final_val_acc"] <= 1

    def test_request_no_node_can_hold_fails_at_once(self, two_nodes, mlflow_server, tmp_path):
        # 2 CPUs exist in total, but no single node has 2; and no node has a GPU-like custom resource.
        # (A custom resource no node type has is checked in the autoscaler test.)
        started = time.time()
        proc = run_search(
            two_nodes.env(),
            tmp_path,
            "two-cpus",
            two_nodes.address,
            mlflow_server.uri,
            ["head"],
            "--cpus-per-trial",
            "2",
            timeout=120,
        )
        assert proc.returncode == 2, explain(proc)
        assert "no node of the cluster has" in proc.stderr and "does not autoscale" in proc.stderr, explain(proc)
        assert "{CPU: 2}" in proc.stderr, explain(proc)
        assert time.time() - started < 90
        assert find_search_run(MlflowClient(mlflow_server.uri), EXPERIMENT, "two-cpus") is None  # nothing recorded

    def test_joining_is_said(self, two_nodes, searched):
        proc = searched[0]
        assert f"Joining the Ray cluster at {two_nodes.address} (--address)" in proc.stderr, explain(proc)

    def test_a_driver_without_the_token_is_refused_with_what_to_set(self, searched):
        proc, uri = searched[2:]
        assert proc.returncode == 2, explain(proc)
        assert "refused this driver" in proc.stderr and "RAY_AUTH_MODE=token" in proc.stderr, explain(proc)
        assert find_search_run(MlflowClient(uri), EXPERIMENT, "no-token") is None

    def test_dry_run_counts_trials_at_once_from_the_clusters_nodes(self, two_nodes, mlflow_server, tmp_path):
        """--dry-run with --address joins the cluster to read its nodes (and leaves it), records nothing."""
        components = ["mha", "ln1", "fc1"]
        proc = run_search(
            two_nodes.env(), tmp_path, "dry", two_nodes.address, mlflow_server.uri, components, "--dry-run"
        )
        assert proc.returncode == 0, explain(proc)
        assert f"resources:  {{CPU: 1}} per trial; the cluster at {two_nodes.address}:" in proc.stdout, explain(proc)
        assert "{CPU: 1, worker_node: 1}" in proc.stdout and "at once:    2 trial(s)" in proc.stdout, explain(proc)
        assert find_search_run(MlflowClient(mlflow_server.uri), EXPERIMENT, "dry") is None

    def test_fixed_cluster_does_not_autoscale(self, two_nodes):
        out = two_nodes.query("from vitplast_tune.run import cluster\nprint('AUTOSCALES', cluster.autoscales())")
        assert "AUTOSCALES False" in out.stdout, out.stdout + out.stderr

    def test_a_local_search_starts_its_own_ray_beside_the_cluster(self, two_nodes, tmp_path):
        """A live cluster on the machine (its ray_current_cluster where the search's Ray looks): a search without
        --address neither joins it nor fails; its trials run on a node of its own. (A stale ray_current_cluster, its
        head gone, takes the same path: the search's ``ray.init(address="local")`` reads no such file, or this search
        would join.)"""
        ray_dir = two_nodes.temp_dir
        assert (ray_dir / "ray_current_cluster").read_text().strip() == two_nodes.address  # what ray.init() would join
        foreign = {n["NodeID"] for n in two_nodes.alive_nodes()}
        proc = local_search(tmp_path, two_nodes.env(RAY_TMPDIR=str(ray_dir.parent)), "beside")
        assert proc.returncode == 0, explain(proc)
        assert "Joining" not in proc.stdout + proc.stderr, explain(proc)
        _, children = child_runs(f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}", "beside")
        used = {r.data.tags["ray.node_id"] for r in children}
        assert len(children) == 1 and used.isdisjoint(foreign), f"trials ran on {used}, the cluster's nodes: {foreign}"
        assert {n["NodeID"] for n in two_nodes.alive_nodes()} == foreign  # the cluster carries on, untouched

    @pytest.fixture(scope="class")
    def data_parallel(self, two_nodes, mlflow_server, tmp_path_factory):
        """A one-trial search on two workers spread over the two nodes (half a CPU each), and the same trial's
        settings finetuned here, in this process, as one worker trains them."""
        import json

        from ray.tune import ExperimentAnalysis

        from vitplast_tune.config import FinetuneConfig, trial_config
        from vitplast_tune.vit.training import finetune

        root = tmp_path_factory.mktemp("two-worker-search")
        space = root / "space.yaml"
        exact = dict(augment="none", precision="fp32", batch_size=16, warmup_steps=2, grad_clip=0.0)
        space.write_text(space_text(parameters={"components": {"choice": ["fc1"]}}, defaults={**exact, **DDP_STEPS}))
        cmd = search_command(space, "two", root / "results", "--address", two_nodes.address)
        cmd += ["--tracking-uri", mlflow_server.uri, "--workers-per-trial", "2", "--placement", "spread"]
        proc = subprocess.run(cmd, env=two_nodes.env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, explain(proc)
        directory = root / "results" / "two"
        settings = FinetuneConfig.from_dict(json.loads((directory / "vitplast_search.json").read_text())["settings"])
        (trial,) = ExperimentAnalysis(str(directory)).trials
        curves: dict[str, list[tuple[int, float]]] = {"train_loss": [], "val_loss": []}

        def report(metrics, state):
            for metric, curve in curves.items():
                curve.append((metrics["step"], metrics[metric]))

        model, _ = finetune(trial_config(trial.config, settings), report=report)
        return child_runs(mlflow_server.uri, "two")[1], directory, curves, model

    def test_two_workers_on_two_nodes_follow_the_loss_curve_of_one_worker(
        self, two_nodes, mlflow_server, searched, data_parallel
    ):
        """A Ray Train run of two gloo ranks, one on each node, the model in DDP, against one worker at the same batch:
        the same loss curve (within 1e-6 at every evaluation: only the order of float sums differs) and best model;
        the run recorded as a one-worker trial is (the spread search's)."""
        (two,), results, one_curves, one_model = data_parallel
        client = MlflowClient(mlflow_server.uri)
        assert two.info.status == "FINISHED"
        nodes = {n["NodeID"] for n in two_nodes.alive_nodes()}
        worker_nodes = two.data.tags[tracking.WORKER_NODES_TAG].split(",")
        assert two.data.tags[tracking.WORKERS_TAG] == "2" and len(worker_nodes) == 2
        assert set(worker_nodes) == nodes  # one worker on each node
        assert two.data.tags["ray.node_id"] == worker_nodes[0]  # the run's node: rank 0's
        steps = list(range(DDP_STEPS["eval_every"], DDP_STEPS["max_steps"] + 1, DDP_STEPS["eval_every"]))
        for metric, one in one_curves.items():
            two_curve = sorted((m.step, m.value) for m in client.get_metric_history(two.info.run_id, metric))
            assert [s for s, _ in one] == [s for s, _ in two_curve] == steps  # one value a step: rank 0's
            assert [v for _, v in two_curve] == pytest.approx([v for _, v in one], rel=0, abs=1e-6), metric
        one_worker = child_runs(mlflow_server.uri, "spread")[1][0]
        assert set(two.data.metrics) == set(one_worker.data.metrics)
        assert set(two.data.params) == set(one_worker.data.params) and two.data.params["components"] == "fc1"
        assert len(list(results.rglob("state.pt"))) == 2  # the two latest checkpoints, in the search's storage
        import torch

        from vitplast_tune.vit import best_model

        model = best_model.load_best_model("two", results.parent)
        x = torch.randn(3, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(model(x), one_model(x), rtol=1e-3, atol=1e-4)


# ----------------------------------------------------------------------------- autoscaling (fake provider)


@pytest.mark.slow
def test_fake_autoscaler_adds_workers_for_trials_and_removes_them(tmp_path):
    """Head only; each trial needs a whole "trainer", a resource only the worker type has (as a GPU would be):
    workers come, both at once, run the trials and go."""
    port = free_ports(1)[0]
    config = yaml.safe_load((CLUSTER_DIR / "fake_autoscaler.yaml").read_text())
    config["provider"]["gcs_address"] = f"{node_ip()}:{port}"
    config_path = tmp_path / "fake_autoscaler.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
    c = LocalCluster(tmp_path, head_cpus=1, autoscaling_config=config_path, extra_env=env, port=port)
    try:
        nodes = c.alive_nodes()
        assert [n["NodeID"] for n in nodes] == [FAKE_HEAD_NODE_ID]
        probe = c.query(  # the autoscaler's state, once it has reported (a loaded machine may take a while)
            "from vitplast_tune.run import cluster\nimport time\ndeadline = time.time() + 60\n"
            "while not cluster.autoscales() and time.time() < deadline:\n    time.sleep(0.2)\n"
            "print('AUTOSCALES', cluster.autoscales())",
            timeout=120,
        )
        assert "AUTOSCALES True" in probe.stdout, probe.stdout + probe.stderr
        tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        driver_env = c.env(VITPLAST_CLUSTER_CONFIG=str(config_path))

        # A request that no node type has fails at once, with the node types named.
        proc = run_search(
            driver_env,
            tmp_path,
            "too-big",
            c.address,
            tracking_uri,
            ["head"],
            "--resources-per-trial",
            '{"trainer": 2}',
            timeout=120,
        )
        assert (
            proc.returncode == 2 and "no node and no node type" in proc.stderr and "ray.worker.trainer" in proc.stderr
        ), explain(proc)

        # Optuna, 4 trials of a whole worker each ("trainer" exists only on the worker type, as its GPU does; a fake
        # GPU that torch cannot see would fail the trial, so the request names the custom resource instead). Tune
        # keeps them all pending (searchers.tune_environment), so the autoscaler's first launch asks for two
        # workers at once; with Tune's default of one pending trial it would queue one node, then another once the
        # first trial left the queue.
        space = tmp_path / "optuna.yaml"
        space.write_text(OPTUNA_SPACE)
        monitor = next(c.temp_dir.glob("session_*/logs/monitor.log"))
        seen = len(monitor.read_text())
        cmd = search_command(space, "optuna-scaled", tmp_path / "results", "--tracking-uri", tracking_uri)
        cmd += ["--address", c.address, "--resources-per-trial", '{"trainer": 1}', "--max-failures", "0"]
        proc = subprocess.run(cmd, env=driver_env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, explain(proc)
        assert "autoscaler can add node type(s) ray.worker.trainer" in proc.stderr, explain(proc)
        parent, children = child_runs(tracking_uri, "optuna-scaled")
        assert parent.info.status == "FINISHED" and len(children) == 4
        assert all(r.info.status == "FINISHED" for r in children)
        used = {r.data.tags["ray.node_id"] for r in children}
        assert used and FAKE_HEAD_NODE_ID not in used and all(u.startswith("f" * 51) for u in used), used
        launches = [int(n) for n in re.findall(r"Queue (\d+) new nodes for launch", monitor.read_text()[seen:])]
        assert launches and launches[0] == 2, f"the autoscaler's launches during the search: {launches}"

        deadline = time.time() + 120  # idle_timeout_minutes 0.1: idle workers go within seconds
        while time.time() < deadline and len(nodes := c.alive_nodes()) > 1:
            time.sleep(2)
        assert [n["NodeID"] for n in nodes] == [FAKE_HEAD_NODE_ID], "idle workers were not removed"
    finally:
        c.stop()
