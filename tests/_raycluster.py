"""Test helpers: Ray nodes, a fake autoscaling cluster and an ``mlflow server``, each started as a
subprocess this test owns and stopped by its own pids (never ``ray stop``, which would stop every
Ray instance on the machine, including other people's).

Each head gets its own ``--temp-dir`` (a short path: Ray's socket paths must stay under 108 bytes)
and explicit free ports, so that it never collides with another Ray instance on the same machine.
A node is stopped with SIGTERM to its ``ray start --block`` process (which stops its own
children), then any descendant or any process whose command line names the node's temp dir that
is still alive gets SIGTERM and, after a grace period, SIGKILL.
"""

from __future__ import annotations

import contextlib
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

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path, marker: str | None = None):
        self.cmd, self.log, self.marker = cmd, log, marker
        self._log = open(log, "ab")  # noqa: SIM115 - held open while the process runs, closed in stop()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self._seen: set[int] = set()

    def remember(self) -> None:
        """Note the current descendants (call before they might be orphaned)."""
        self._seen |= descendants(self.proc.pid)

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 20.0, group: bool = False) -> None:
        """SIGTERM (to its own process group with ``group``: started with start_new_session), wait, clean up."""
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
        self._log.close()

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


# ----------------------------------------------------------------------------- Ray clusters


class LocalCluster:
    """A head (and optionally workers) started with ``ray start --block`` on this machine.

    ``address`` is ``ip:port`` of the head's GCS; every node and the driver run with the same
    authentication mode (``disabled`` or ``token``), and a worker has its own resources.
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
    ):
        self.root = root
        # short: socket paths; a given one (e.g. $RAY_TMPDIR/ray, where `ray start` leaves ray_current_cluster for
        # every ray.init() of that RAY_TMPDIR) is removed on stop like an own one
        self.temp_dir = Path(temp_dir or tempfile.mkdtemp(prefix="vtr", dir="/tmp"))
        self.auth_token = auth_token
        self.extra_env = dict(extra_env or {})
        self.ip = node_ip()
        self.port, agent_port = (port, *free_ports(1)) if port else free_ports(2)
        self.address = f"{self.ip}:{self.port}"
        self.nodes: list[Owned] = []
        cmd = [
            "ray",
            "start",
            "--head",
            "--block",
            f"--port={self.port}",
            f"--dashboard-agent-listen-port={agent_port}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
            f"--num-cpus={head_cpus}",
            "--num-gpus=0",
            "--min-worker-port=0",
            "--max-worker-port=0",
        ]
        if head_resources:
            cmd.append(f"--resources={json.dumps(head_resources)}")
        if autoscaling_config is not None:
            cmd.append(f"--autoscaling-config={autoscaling_config}")
        self._start(cmd, "head")
        self.wait_for_nodes(1)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a driver for this cluster (same auth mode and token as the nodes)."""
        return clean_env(self.auth_token, **extra)

    def _start(self, cmd: list[str], name: str) -> Owned:
        env = clean_env(self.auth_token, **self.extra_env)
        node = Owned(cmd, env, self.root / f"ray-{name}.log", marker=str(self.temp_dir))
        self.nodes.append(node)
        return node

    def add_worker(self, cpus: int = 1, resources: dict | None = None, name: str = "worker") -> Owned:
        (agent_port,) = free_ports(1)
        cmd = [
            "ray",
            "start",
            "--block",
            f"--address={self.address}",
            f"--num-cpus={cpus}",
            "--num-gpus=0",
            f"--dashboard-agent-listen-port={agent_port}",
            "--disable-usage-stats",
            "--min-worker-port=0",
            "--max-worker-port=0",
        ]
        if resources:
            cmd.append(f"--resources={json.dumps(resources)}")
        node = self._start(cmd, name)
        self.wait_for_nodes(len(self.nodes))
        return node

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

    def wait_for_nodes(self, n: int, timeout: float = 90, exact: bool = False) -> list[dict]:
        deadline, nodes = time.time() + timeout, []
        while time.time() < deadline:
            for node in self.nodes:
                node.remember()
                if not node.running():
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
        terminate(pids_naming(str(self.temp_dir)))
        shutil.rmtree(self.temp_dir, ignore_errors=True)


# ----------------------------------------------------------------------------- mlflow server


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 with a SQLite store and local artifacts."""

    def __init__(self, root: Path):
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
        self.server = Owned(cmd, clean_env(), root / "mlflow-server.log")
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
