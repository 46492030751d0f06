"""Test helpers: a one-machine SLURM cluster, configured and started by the test and stopped by its own pids.

``LocalSlurm(root)`` runs munged, slurmctld and slurmd (Debian's ``munge`` and ``slurm-wlm``) on 127.0.0.1 with a
configuration of its own in a fresh directory: a munge key and socket, ``slurm.conf`` (free ports, the machine's CPUs as
``slurmd -C`` reports them, one partition) and ``gres.conf`` (one GPU as SLURM counts it: the job's steps see
``SLURM_GPUS_ON_NODE=1``; no device is behind it, so trials asking for no GPU run on the CPU). Every command it runs
gets ``SLURM_CONF`` pointing there, so nothing reads or changes a SLURM the machine may have. Accounting is off: a
job's state and exit code are read with ``scontrol show job`` (kept for ``MinJobAge`` seconds after it ends).

The daemons run as root (slurmd starts jobs as their submitter), so the cluster needs root: ``unavailable()`` says
why it cannot run here (a test skips with it, which ``VITPLAST_STRICT_SKIPS=1`` turns into a failure in CI, where
``.ci/run`` installs both packages and runs as root). ``stop()`` cancels this cluster's jobs, stops its daemons by pid,
then ends any process left whose environment names this cluster's ``SLURM_CONF`` (the jobs' processes carry it).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _raycluster import Owned, alive, clean_env, cmdline, descendants, free_ports, terminate

COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "squeue", "sinfo")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}


def unavailable() -> str | None:
    """Why a local SLURM cannot run here (None when it can)."""
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return (
            f"SLURM is not installed ({', '.join(missing)} missing; apt-get install slurm-wlm munge, as .ci/run does)"
        )
    if os.geteuid() != 0:
        return "a local SLURM cluster runs its daemons as root (slurmd starts jobs as their user)"
    return None


def hardware_line() -> str:
    """``slurmd -C``'s node line (NodeName=... CPUs=... RealMemory=...): this machine as SLURM sees it."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=60, check=True).stdout
    return next(line for line in out.splitlines() if line.startswith("NodeName="))


def slurm_conf(directory: Path, node: str, ports: tuple[int, int], hardware: str) -> str:
    """A one-node slurm.conf: everything in ``directory``, munge's socket there, the node's ``hardware`` (``slurmd
    -C``'s words) and one GPU."""
    d = directory
    return f"""ClusterName=vitplast-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.socket
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
MinJobAge=3600
KillWait=10
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
GresTypes=gpu
SlurmdParameters=config_overrides
NodeName={node} NodeAddr=127.0.0.1 {hardware} Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class LocalSlurm:
    """munged, slurmctld and slurmd of this test's own on 127.0.0.1 (see the module's docstring)."""

    def __init__(self, root: Path, timeout_s: float = 90.0):
        self.root = root
        self.dir = Path(tempfile.mkdtemp(prefix="vsl", dir="/tmp"))  # short: munge's socket path
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.dir / "slurm.conf"
        self.daemons: list[Owned] = []
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir()
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        hardware = [w for w in hardware_line().split() if not w.startswith(("NodeName=", "UpTime="))]
        self.cpus = int(next(w for w in hardware if w.startswith("CPUs=")).split("=")[1])  # the node's, as SLURM has it
        self.conf.write_text(slurm_conf(self.dir, self.node, tuple(free_ports(2)), " ".join(hardware)))
        (self.dir / "nvidia0").touch()  # the GPU's "device": SLURM counts it (and logs that it is no real device)
        (self.dir / "gres.conf").write_text(f"NodeName={self.node} Name=gpu File={self.dir / 'nvidia0'}\n")
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout_s: float) -> None:
        d = self.dir
        munged = ["munged", "--foreground", "--force", f"--socket={d}/munge.socket", f"--key-file={d}/munge.key"]
        munged += [f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed", f"--log-file={d}/munged.log"]
        self._daemon(munged, "munged")
        self._wait(lambda: (d / "munge.socket").exists(), timeout_s, "munged's socket")
        self._daemon(["slurmctld", "-D", "-i"], "slurmctld")
        self._daemon(["slurmd", "-D", "-N", self.node], "slurmd")
        self._wait(self._node_idle, timeout_s, f"node {self.node} to be idle")

    def _daemon(self, cmd: list[str], name: str) -> None:
        self.daemons.append(Owned(cmd, self.env(), self.root / f"{name}.log"))

    def _node_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.split()
        return out == ["idle"]

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [d for d in self.daemons if not d.running()]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {' '.join(d.cmd)}\n{d.tail()}" for d in self.daemons)
                raise RuntimeError(f"the local SLURM cluster did not start: no {what}\n{logs}")
            time.sleep(0.5)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a SLURM command for this cluster: SLURM_CONF, and no Ray address or auth settings."""
        return clean_env(SLURM_CONF=str(self.conf), **extra)

    def run(self, *cmd: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=env or self.env(), capture_output=True, text=True, timeout=60, check=check)

    def python_path(self) -> str:
        """A PATH whose ``python`` is this test's Python (the job's script runs ``python``), then this one's PATH."""
        wrapper = self.dir / "bin" / "python"
        if not wrapper.exists():  # a script, not a link: a link to a virtualenv's python would start without the env
            wrapper.parent.mkdir()
            wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
            wrapper.chmod(0o755)
        return f"{wrapper.parent}{os.pathsep}{os.environ.get('PATH', '')}"

    def submit(self, script: Path, flags: list[str], args: list[str], env: dict[str, str]) -> str:
        """``sbatch --parsable FLAGS SCRIPT ARGS`` in ``env``; the job's id."""
        out = self.run("sbatch", "--parsable", *flags, str(script), *args, env=env)
        return out.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields of a job (JobState, ExitCode, ...)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(w.split("=", 1) for w in out.split() if "=" in w)

    def wait(self, job_id: str, timeout_s: float, log: Path | None = None) -> dict[str, str]:
        """Wait up to ``timeout_s`` for a job to end; its fields (AssertionError with its output when it does not)."""
        deadline = time.monotonic() + timeout_s
        while (job := self.job(job_id))["JobState"] not in ENDED:
            if time.monotonic() > deadline:
                text = log.read_text(errors="replace")[-6000:] if log and log.exists() else ""
                raise AssertionError(f"job {job_id} still {job['JobState']} after {timeout_s:g} s:\n{text}")
            time.sleep(1)
        return job

    def signal_batch(self, job_id: str, sig: str = "TERM") -> None:
        """Send ``sig`` to the job's batch shell only, as ``#SBATCH --signal=B:TERM@...`` does before the time limit."""
        self.run("scancel", f"--signal={sig}", "--batch", job_id)

    def job_pids(self) -> set[int]:
        """Live processes, other than the daemons and their helpers, whose environment names this cluster's
        SLURM_CONF: what its jobs started (the environment a job was submitted with reaches everything it starts)."""
        marker = f"SLURM_CONF={self.conf}".encode()
        daemons = {pid for d in self.daemons for pid in {d.proc.pid, *descendants(d.proc.pid)}}
        found = set()
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in daemons | {os.getpid()}:
                with contextlib.suppress(OSError):
                    if marker in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0") and alive(int(entry)):
                        found.add(int(entry))
        return found

    def describe(self, pids: set[int]) -> str:
        return "\n".join(f"{pid}: {cmdline(pid)}" for pid in sorted(pids))

    def stop(self) -> None:
        """Cancel this cluster's jobs, stop its daemons, end what is left of them and their jobs, remove its files."""
        if any(d.running() for d in self.daemons if "slurmctld" in d.cmd):
            jobs = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
            if jobs:
                self.run("scancel", *jobs, check=False)
                with contextlib.suppress(AssertionError, subprocess.SubprocessError, KeyError):
                    for job in jobs:
                        self.wait(job, 60)
        for daemon in reversed(self.daemons):
            daemon.stop(grace_s=15)
        terminate(self.job_pids(), grace_s=10)
        shutil.rmtree(self.dir, ignore_errors=True)
