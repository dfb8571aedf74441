"""A real one-node Slurm on this machine, for the cluster tests.

Debian's ``slurm-wlm`` + ``munge``, configured without cgroups
(``proctrack/linuxproc``, ``task/none``) and without accounting, one node with
the machine's CPUs and memory in one partition.  The fixture installs the
packages when they are missing (root with apt-get only; anywhere else it skips
and says why), starts exactly the daemons it needs, waits for the node to be
idle, and on teardown cancels its jobs, stops the daemons it started (never
one it found running) and restores any ``/etc/slurm/slurm.conf`` it replaced.

The cluster is up for the whole session of the worker that runs the cluster
tests (they are queued first): every snakemake start imports the Slurm
executor plugin, which asks ``scontrol`` and waits 10 s for a controller
that is not there, so Slurm is never left installed without its controller
while another worker may still start snakemake (``conftest.py``, the
snakemake lock).

The config must live at ``/etc/slurm/slurm.conf``: the Snakemake jobstep
plugin drops ``SLURM_CONF`` from the job environment, so ``srun`` inside a job
would not find a config anywhere else.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGES = ["slurm-wlm", "munge"]
BINARIES = ["slurmctld", "slurmd", "munged", "sbatch", "squeue", "sinfo", "scancel", "srun"]
CONF = Path("/etc/slurm/slurm.conf")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
PARTITION = "pairaudit"


@dataclass
class SlurmCluster:
    node: str
    partition: str
    cpus: int
    workdir: Path
    munge_dir: Path | None = None
    started: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def run(self, *cmd: str, timeout: float = 30) -> str:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=True).stdout

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-N", "-n", self.node, "-o", "%T").strip()

    def logs(self) -> str:
        out = []
        for p in (self.workdir / "slurmctld.log", self.workdir / "slurmd.log",
                  (self.munge_dir or self.workdir) / "munged.log"):
            name = p.name
            if p.exists():
                out.append(f"--- {name} (tail)\n" + "\n".join(p.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(out)


def _missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def _apt_install() -> str | None:
    """Install the packages; None on success, else why not."""
    if os.geteuid() != 0:
        return "not root: cannot install slurm-wlm/munge or write /etc/slurm/slurm.conf"
    if shutil.which("apt-get") is None:
        return "no apt-get on this machine: cannot install slurm-wlm/munge"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # beside the other worker's tests (one may install chromium): wait for dpkg's lock, never fail on it
    lock = ["-o", "DPkg::Lock::Timeout=600"]
    cmd = ["apt-get", *lock, "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", *lock, "update", "-q"], capture_output=True, text=True, env=env, timeout=900)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        return f"apt-get install {' '.join(PACKAGES)} failed: {proc.stderr.strip()[-500:]}"
    return None


def _pids(name: str) -> list[int]:
    out = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _node_line() -> tuple[str, int, int]:
    """(node name, CPUs, RealMemory MB) as slurmd itself detects them."""
    first = subprocess.run([_bin("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    kv = dict(tok.split("=", 1) for tok in first.split())
    return kv["NodeName"], int(kv["CPUs"]), int(kv["RealMemory"])


def _bin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def slurm_conf(node: str, cpus: int, memory_mb: int, workdir: Path) -> str:
    return "\n".join([
        "# Written by pairaudit's tests/slurm_cluster.py; restored on teardown.",
        "ClusterName=pairaudit-test",
        f"SlurmctldHost={node}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "MpiDefault=none",
        # no cgroups: this may run in a container without a delegated cgroup tree
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        # memory is not a consumable: a job without --mem must not take the whole node
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        # squeue must still list a finished job when asked (no accounting): status checks, and the test's count
        "MinJobAge=3600",
        "SchedulerParameters=sched_interval=2",
        f"StateSaveLocation={workdir}/state",
        f"SlurmdSpoolDir={workdir}/spool",
        f"SlurmctldPidFile={workdir}/slurmctld.pid",
        f"SlurmdPidFile={workdir}/slurmd.pid",
        f"SlurmctldLogFile={workdir}/slurmctld.log",
        f"SlurmdLogFile={workdir}/slurmd.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def _start(cluster: SlurmCluster, name: str, cmd: list[str], **kw) -> None:
    log = open(cluster.workdir / f"{name}.stdout", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kw)
    cluster.started.append((name, proc))
    time.sleep(0.5)
    if proc.poll() is not None:
        raise RuntimeError(f"{name} exited at start ({proc.returncode}):\n"
                           f"{(cluster.workdir / f'{name}.stdout').read_text()}\n{cluster.logs()}")


def _stop(cluster: SlurmCluster) -> None:
    for name, proc in reversed(cluster.started):
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    cluster.started.clear()


def start_cluster(workdir: Path):
    """Bring the cluster up; returns (cluster, restore) or raises pytest.skip.Exception."""
    if _missing_binaries():
        why = _apt_install()
        if why:
            pytest.skip(f"no Slurm for the cluster test: {why}")
        if _missing_binaries():
            pytest.skip(f"no Slurm for the cluster test: still missing {_missing_binaries()} after install")
    if os.geteuid() != 0:
        pytest.skip("no Slurm for the cluster test: not root, cannot write /etc/slurm/slurm.conf")
    if _pids("slurmctld") or _pids("slurmd"):
        pytest.skip("a Slurm daemon already runs on this machine; the test does not take over a live cluster")

    node, cpus, memory_mb = _node_line()
    cluster = SlurmCluster(node=node, partition=PARTITION, cpus=cpus, workdir=workdir)
    for sub in ("state", "spool"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)

    cleanup = []
    backup = None
    if CONF.exists():
        backup = workdir / "slurm.conf.orig"
        shutil.copy2(CONF, backup)
    CONF.parent.mkdir(parents=True, exist_ok=True)
    CONF.write_text(slurm_conf(node, cpus, memory_mb, workdir))

    def restore():
        try:
            try:  # no job of ours may outlive the daemons
                subprocess.run(["scancel", "--full", "-p", PARTITION], capture_output=True, timeout=15)
            except Exception:
                pass
            _stop(cluster)
        finally:
            for undo in cleanup:
                undo()
            if backup is not None:
                shutil.copy2(backup, CONF)
            else:
                CONF.unlink(missing_ok=True)

    try:
        if not MUNGE_SOCKET.exists() or not _pids("munged"):
            if not MUNGE_KEY.exists():
                subprocess.run(["mungekey", "--create", "--keyfile", str(MUNGE_KEY)], check=True, capture_output=True)
                shutil.chown(MUNGE_KEY, "munge", "munge")
                MUNGE_KEY.chmod(0o600)
            MUNGE_SOCKET.parent.mkdir(parents=True, exist_ok=True)
            shutil.chown(MUNGE_SOCKET.parent, "munge", "munge")
            # as its own user (munged refuses root), in a directory it owns (pytest's are root-only),
            # and as our direct child so we stop exactly it
            munge_dir = Path(tempfile.mkdtemp(prefix="pairaudit-munge-"))
            shutil.chown(munge_dir, "munge", "munge")
            cleanup.append(lambda: shutil.rmtree(munge_dir, ignore_errors=True))
            cluster.munge_dir = munge_dir
            _start(cluster, "munged", [_bin("munged"), "--foreground", "--force", f"--log-file={munge_dir}/munged.log",
                                       f"--pid-file={munge_dir}/munged.pid", f"--seed-file={munge_dir}/munged.seed"],
                   user="munge", group="munge")
            _wait(lambda: MUNGE_SOCKET.exists(), 15, "munged socket", cluster)
        _start(cluster, "slurmctld", [_bin("slurmctld"), "-D", "-i"])
        _wait(lambda: _responds("scontrol", "ping"), 30, "slurmctld to answer", cluster)
        _start(cluster, "slurmd", [_bin("slurmd"), "-D"])
        _wait(lambda: _idle(cluster), 60, f"node {node} idle in sinfo", cluster)
    except BaseException:
        restore()
        raise
    return cluster, restore


def _responds(*cmd: str) -> bool:
    return subprocess.run(list(cmd), capture_output=True, timeout=15).returncode == 0


def _idle(cluster: SlurmCluster) -> bool:
    try:
        return cluster.node_state() == "idle"
    except subprocess.SubprocessError:
        return False


def _wait(ok, timeout_s: float, what: str, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ok():
            return
        for name, proc in cluster.started:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} died ({proc.returncode}) while waiting for {what}\n{cluster.logs()}")
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{cluster.logs()}")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A running one-node Slurm (see the module docstring); skips where it cannot be had.

    Stopped at the end of this worker's session, once no other worker will start snakemake.
    """
    from conftest import until_no_other_worker_starts_snakemake

    cluster, restore = start_cluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        until_no_other_worker_starts_snakemake()
        restore()


__all__ = ["SlurmCluster", "slurm_cluster", "start_cluster"]
