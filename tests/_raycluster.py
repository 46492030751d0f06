"""Test helpers: Ray nodes, a fake autoscaling cluster and an ``mlflow server``, each started as a
subprocess this test owns and stopped by its own pids (never ``ray stop``, which would stop every
Ray instance on the machine, including other people's).

Each node gets its own ``--temp-dir`` (a short path: Ray's socket paths must stay under 108 bytes; a worker
without one would use the head's) and explicit free ports, so that it never collides with another Ray instance
on the same machine. Nodes run this test's own Python (``python -m ray.scripts.scripts``, not the ``ray`` on the
PATH), so their workers import the package under test. A node is stopped with SIGTERM to its ``ray start --block``
process (which stops its own children), then any descendant or any process whose command line names the node's
temp dir that is still alive gets SIGTERM and, after a grace period, SIGKILL.

A worker started with ``isolated=True`` shares no disk with the test: it runs in its own mount namespace
(``unshare --mount`` and tests/_nsexec.py) where the home directory and /tmp (the test's data, results, caches
and the head's temp dir) are empty tmpfs mounts; only the Python install, the repository and its own temp dir
stay visible. ``MotoS3`` is an S3 server on 127.0.0.1 (moto's server mode), the one store such nodes share.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` command of this test's Python
REPO = Path(__file__).resolve().parents[1]
NSEXEC = Path(__file__).resolve().parent / "_nsexec.py"
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports (held open together so that they differ); skip the test when none."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    except OSError as exc:
        pytest.skip(f"no free TCP ports for a local Ray cluster: {exc}")
    finally:
        for s in socks:
            s.close()


def node_ip() -> str:
    import ray._private.services

    return ray._private.services.get_node_ip_address()


def clean_env(auth_token: str | None = None, **extra: str) -> dict[str, str]:
    """The environment for a Ray node or a driver: no inherited RAY_ADDRESS or auth settings.

    A token in ~/.ray/auth_token (left by any earlier ``ray.init()``) would silently switch a head
    to token mode, so the mode is always explicit: ``token`` with ``auth_token``, else ``disabled``.
    """
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARS and k != "RAY_ADDRESS"}
    env.update(RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1", RAY_AUTH_MODE="disabled")
    if auth_token:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=auth_token)
    env.update(extra)
    return env


# ----------------------------------------------------------------------------- processes


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> set[int]:
    children, found, todo = _children_map(), set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def pids_naming(text: str) -> set[int]:
    """Processes whose command line contains ``text`` (a temp dir unique to this test)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if text in Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.add(int(entry))
            except OSError:
                pass
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def terminate(pids: set[int], grace_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s`` for those still alive; only the given pids."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        live = {p for p in pids if alive(p)}
        if not live:
            return
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        deadline = time.time() + wait
        while time.time() < deadline and any(alive(p) for p in live):
            time.sleep(0.2)


class Owned:
    """A subprocess this test started, stopped with everything it started (by pid)."""

    def __init__(
        self, cmd: list[str], env: dict[str, str], log: Path, marker: str | None = None, user: str | None = None
    ):
        self.cmd, self.log, self.marker = cmd, log, marker
        self._log = open(log, "ab")  # noqa: SIM115 - held open while the process runs, closed in stop()
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, user=user
        )
        self._seen: set[int] = set()
        self.stopped = False

    def remember(self) -> None:
        """Note the current descendants (call before they might be orphaned)."""
        self._seen |= descendants(self.proc.pid)

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 20.0, group: bool = False) -> None:
        """SIGTERM (to its own process group with ``group``: started with start_new_session), wait, clean up."""
        self.stopped = True
        self.remember()
        if self.marker:
            self._seen |= pids_naming(self.marker)
        if self.running():
            if group:
                os.killpg(self.proc.pid, signal.SIGTERM)
            else:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        leftovers = self._seen | (pids_naming(self.marker) if self.marker else set())
        terminate(leftovers, grace_s=5.0)
        if not self._log.closed:
            self._log.close()

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


# ----------------------------------------------------------------------------- Ray clusters


def isolation_available() -> bool:
    """Whether this process may make a mount namespace and mount in it (root, or a user namespace that allows it)."""
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--mount", "--propagation", "private", "--", "mount", "-t", "tmpfs", "tmpfs", "/mnt"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def isolate_command(cmd: list[str], keep: list[str]) -> list[str]:
    """``cmd`` run in its own mount namespace where the home directory and /tmp are empty, but for ``keep``, the
    Python install and the repository (see tests/_nsexec.py)."""
    kept = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, REPO, *keep)}
    hidden = [str(Path.home()), "/tmp"]
    launcher = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, str(NSEXEC)]
    for path in hidden:
        launcher += ["--hide", path]
    for path in sorted(kept):
        launcher += ["--keep", path]
    return [*launcher, "--", *cmd]


class LocalCluster:
    """A head (and optionally workers) started with ``ray start --block`` on this machine.

    ``address`` is ``ip:port`` of the head's GCS; every node and the driver run with the same
    authentication mode (``disabled`` or ``token``), and a worker has its own resources and temp dir.
    """

    def __init__(
        self,
        root: Path,
        auth_token: str | None = None,
        head_cpus: int = 1,
        head_resources: dict | None = None,
        autoscaling_config: Path | None = None,
        extra_env: dict[str, str] | None = None,
        port: int | None = None,
        temp_dir: Path | None = None,
        head_gpus: int = 0,
    ):
        self.root = root
        # short: socket paths; a given one (e.g. $RAY_TMPDIR/ray, where `ray start` leaves ray_current_cluster for
        # every ray.init() of that RAY_TMPDIR) is removed on stop like an own one
        self.temp_dir = Path(temp_dir or tempfile.mkdtemp(prefix="vtr", dir="/tmp"))
        self.temp_dirs = [self.temp_dir]
        self.auth_token = auth_token
        self.extra_env = dict(extra_env or {})
        self.ip = node_ip()
        self.port, agent_port = (port, *free_ports(1)) if port else free_ports(2)
        self.address = f"{self.ip}:{self.port}"
        self.nodes: list[Owned] = []
        self.node_temp: dict[int, Path] = {}  # id(Owned) -> its node's temp dir
        cmd = [
            *RAY,
            "start",
            "--head",
            "--block",
            f"--port={self.port}",
            f"--dashboard-agent-listen-port={agent_port}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
            f"--num-cpus={head_cpus}",
            f"--num-gpus={head_gpus}",
            "--min-worker-port=0",
            "--max-worker-port=0",
        ]
        if head_resources:
            cmd.append(f"--resources={json.dumps(head_resources)}")
        if autoscaling_config is not None:
            cmd.append(f"--autoscaling-config={autoscaling_config}")
        self.head = self._start(cmd, "head", self.temp_dir)
        self.wait_for_nodes(1)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a driver for this cluster (same auth mode and token as the nodes)."""
        return clean_env(self.auth_token, **extra)

    def _start(self, cmd: list[str], name: str, temp_dir: Path, env: dict[str, str] | None = None) -> Owned:
        env = clean_env(self.auth_token, **self.extra_env, **(env or {}))
        node = Owned(cmd, env, self.root / f"ray-{name}.log", marker=str(temp_dir))
        self.nodes.append(node)
        self.node_temp[id(node)] = temp_dir
        return node

    def add_worker(
        self,
        cpus: int = 1,
        resources: dict | None = None,
        name: str = "worker",
        gpus: int = 0,
        isolated: bool = False,
        env: dict[str, str] | None = None,
    ) -> Owned:
        """Start a worker node with its own temp dir and wait until it is alive; ``isolated``: sharing no disk
        with this test (its own mount namespace, see ``isolate_command``); ``env``: extra environment of its processes."""
        (agent_port,) = free_ports(1)
        temp_dir = Path(tempfile.mkdtemp(prefix="vtw", dir="/tmp"))
        self.temp_dirs.append(temp_dir)
        cmd = [
            *RAY,
            "start",
            "--block",
            f"--address={self.address}",
            f"--num-cpus={cpus}",
            f"--num-gpus={gpus}",
            f"--temp-dir={temp_dir}",
            f"--dashboard-agent-listen-port={agent_port}",
            "--disable-usage-stats",
            "--min-worker-port=0",
            "--max-worker-port=0",
        ]
        if resources:
            cmd.append(f"--resources={json.dumps(resources)}")
        if isolated:
            cmd = isolate_command(cmd, keep=[str(temp_dir)])
        node = self._start(cmd, name, temp_dir, env)
        self.wait_for_nodes(sum(not n.stopped for n in self.nodes))
        return node

    def node_id(self, node: Owned) -> str:
        """The Ray node id of a node this cluster started (its raylet's socket lies in its own temp dir)."""
        temp_dir = str(self.node_temp[id(node)])
        for info in self.alive_nodes():
            if str(info.get("RayletSocketName", "")).startswith(temp_dir):
                return info["NodeID"]
        raise RuntimeError(f"no alive node has its temp dir in {temp_dir}")

    def kill(self, node: Owned) -> None:
        """SIGKILL the node's raylet (a machine lost), then stop what is left of it by pid."""
        node.remember()
        raylets = [p for p in descendants(node.proc.pid) if "/raylet/raylet" in cmdline(p)]
        assert len(raylets) == 1, f"raylets of {node.cmd}: {raylets}"
        os.kill(raylets[0], signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.proc.wait(60)  # `ray start --block` exits when its raylet dies
        node.stop(grace_s=10)

    def query(self, code: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
        """Run ``code`` in a fresh Python connected to this cluster (``ray`` and ``json`` imported)."""
        script = f"import json, ray\nray.init(address={self.address!r}, log_to_driver=False)\n{code}\n"
        return subprocess.run(
            [sys.executable, "-c", script], env=self.env(**env), capture_output=True, text=True, timeout=timeout
        )

    def alive_nodes(self) -> list[dict]:
        out = self.query("print('NODES=' + json.dumps([n for n in ray.nodes() if n['Alive']]))")
        for line in out.stdout.splitlines():
            if line.startswith("NODES="):
                return json.loads(line[6:])
        raise RuntimeError(f"cannot list the nodes of {self.address}:\n{out.stdout}\n{out.stderr}")

    def wait_for_nodes(self, n: int, timeout: float = 120, exact: bool = False) -> list[dict]:
        deadline, nodes = time.time() + timeout, []
        while time.time() < deadline:
            for node in self.nodes:
                node.remember()
                if not node.stopped and not node.running():
                    self.stop()
                    text = node.tail()
                    if "address already in use" in text.lower() or "port" in text.lower() and "in use" in text.lower():
                        pytest.skip(f"ports for a local Ray cluster could not be had:\n{text}")
                    raise RuntimeError(f"{' '.join(node.cmd)} exited with {node.proc.returncode}:\n{text}")
            try:
                nodes = self.alive_nodes()
            except (RuntimeError, subprocess.TimeoutExpired):
                nodes = []
            if len(nodes) == n or (not exact and len(nodes) > n):
                return nodes
            time.sleep(1)
        raise TimeoutError(f"expected {n} alive nodes at {self.address}, found {len(nodes)}")

    def stop(self) -> None:
        for node in self.nodes:  # SIGTERM to every node at once (each `ray start --block` stops its own processes)
            node.remember()
            if node.running():
                node.proc.send_signal(signal.SIGTERM)
        for node in reversed(self.nodes):  # then wait, and clean up what is left, workers first
            node.stop()
        for temp_dir in self.temp_dirs:
            terminate(pids_naming(str(temp_dir)))
            shutil.rmtree(temp_dir, ignore_errors=True)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# ----------------------------------------------------------------------------- S3 (moto's server on 127.0.0.1)


class MotoS3:
    """An S3 server on 127.0.0.1 (``python -m moto.server``) with one bucket; stopped by pid.

    ``uri(prefix)`` is an ``s3://`` URI that carries the endpoint (pyarrow's ``endpoint_override`` and
    ``scheme`` query), so every process that gets it reaches this server; ``S3_CREDENTIALS`` are the
    (ignored) credentials a client still needs.
    """

    def __init__(self, root: Path, bucket: str = "vitplast"):
        import boto3

        root.mkdir(parents=True, exist_ok=True)
        self.bucket = bucket
        for _ in range(3):  # a port taken between free_ports and the server's bind: try another
            (self.port,) = free_ports(1)
            self.url = f"http://127.0.0.1:{self.port}"
            cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
            self.server = Owned(cmd, clean_env(), root / "moto.log")
            if self._wait():
                break
            self.server.stop(grace_s=5)
        else:
            raise RuntimeError(f"moto's S3 server did not start:\n{self.server.tail()}")
        self.client = boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=S3_CREDENTIALS["AWS_DEFAULT_REGION"],
        )
        self.client.create_bucket(Bucket=bucket)

    def _wait(self, timeout: float = 60) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline and self.server.running():
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=2):
                    return True
            except OSError:
                time.sleep(0.2)
        return False

    def uri(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}?endpoint_override=127.0.0.1:{self.port}&scheme=http"

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under ``prefix``."""
        keys, token = [], None
        while True:
            page = self.client.list_objects_v2(
                Bucket=self.bucket, Prefix=prefix, **({"ContinuationToken": token} if token else {})
            )
            keys += [o["Key"] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return keys
            token = page["NextContinuationToken"]

    def stop(self) -> None:
        self.server.stop(grace_s=5)


# ----------------------------------------------------------------------------- mlflow server


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 with a SQLite store and local artifacts."""

    def __init__(self, root: Path):
        from vitplast_tune._compat.mlflow import JOB_EXECUTION_ENV  # MLflow's GenAI job runner: off, as `vitplast ui`

        (port,) = free_ports(1)
        self.uri = f"http://127.0.0.1:{port}"
        root.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ]
        self.server = Owned(cmd, {**clean_env(), JOB_EXECUTION_ENV: "false"}, root / "mlflow-server.log")
        deadline = time.time() + 120
        while time.time() < deadline:
            self.server.remember()
            if not self.server.running():
                text = self.server.tail()
                self.stop()
                if "in use" in text.lower():
                    pytest.skip(f"port {port} for mlflow server could not be had:\n{text}")
                raise RuntimeError(f"mlflow server exited:\n{text}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"mlflow server at {self.uri} did not answer:\n{self.server.tail()}")

    def stop(self) -> None:
        self.server.stop(grace_s=10, group=True)


class OwnedRay:
    """Processes started under one RAY_TMPDIR: everything a search subprocess spawned, and only that."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="vtr", dir="/tmp")
        self.env = {**os.environ, "RAY_TMPDIR": self.tmp, "PYTHONUNBUFFERED": "1"}

    def pids(self, title: str = "") -> list[int]:
        mine = []
        for environ in glob.glob("/proc/[0-9]*/environ"):
            pid = int(environ.split("/")[2])
            try:
                if f"RAY_TMPDIR={self.tmp}".encode() not in Path(environ).read_bytes().split(b"\0"):
                    continue
                if title and title not in Path(f"/proc/{pid}/cmdline").read_text():
                    continue
            except OSError:
                continue
            mine.append(pid)
        return [p for p in mine if p != os.getpid()]

    def kill_all(self) -> None:
        for _ in range(50):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
