"""scripts/slurm_local.sh: a real Slurm on this host, brought up and down in a private directory.

Runs its own small cluster (own directory, own ports, own munge socket) beside the one CI brings
up, so it proves the script itself: up is idempotent, two slurmd serve two nodes, srun and sbatch
run jobs on both, down stops everything it started (jobs included) and removes its directory.
Skipped where the Slurm binaries are not installed (`scripts/slurm_local.sh up` installs them).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_nvrx.launch.ports import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm_local.sh"
DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "mungekey")


def _unavailable() -> str | None:
    if any(shutil.which(b) is None for b in DAEMONS):
        return "Slurm is not installed here (scripts/slurm_local.sh up installs slurm-wlm, munge)"
    if os.geteuid() != 0:
        return "the local Slurm's daemons run as root"
    return None


def _tagged(tag: str) -> list[int]:
    needle = tag.encode()
    found = []
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            env = (pid_dir / "environ").read_bytes().split(b"\0")
            state = (pid_dir / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in env and state != b"Z":
            found.append(int(pid_dir.name))
    return found


class Cluster:
    def __init__(self, root: Path) -> None:
        self.dir = root / "slurm"
        self.env = {
            **os.environ,
            "NVRX_SLURM_DIR": str(self.dir),
            "NVRX_SLURM_PORT": str(free_port(count=3)),
            "NVRX_SLURM_NO_APT": "1",
            "SLURM_CONF": str(self.dir / "etc" / "slurm.conf"),
        }
        self.tag = f"NVRX_SLURM_LOCAL={self.dir}"

    def script(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.run(str(SCRIPT), *args, timeout=timeout)

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = _unavailable()
    if why is not None:
        if os.environ.get("NVRX_REQUIRE_SLURM") == "1":  # ./check: CI must not skip it
            pytest.fail(f"NVRX_REQUIRE_SLURM=1 but {why}", pytrace=False)
        pytest.skip(why)
    # short path: the munge socket lives under it
    c = Cluster(Path(tmp_path_factory.mktemp("sl", numbered=True)))
    try:
        yield c
    finally:
        c.script("down")


def test_up_jobs_on_two_nodes_down_leaves_nothing(cluster: Cluster) -> None:
    t0 = time.monotonic()
    up = cluster.script("up")
    up_s = time.monotonic() - t0
    assert up.returncode == 0, up.stderr
    assert up_s < 20, f"up took {up_s:.1f} s"
    again = cluster.script("up")
    assert again.returncode == 0 and "already up" in again.stderr, again.stderr

    status = cluster.script("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "n1 idle" in status.stdout and "n2 idle" in status.stdout, status.stdout

    one_node = cluster.run("srun", "-N1", "-n2", "hostname")
    assert one_node.returncode == 0, one_node.stderr
    assert one_node.stdout.splitlines() == [socket.gethostname()] * 2

    per_node = cluster.run(
        "srun", "-N2", "--ntasks-per-node=1", "bash", "-c", 'echo "$SLURMD_NODENAME $SLURM_PROCID"'
    )
    assert per_node.returncode == 0, per_node.stderr
    assert sorted(per_node.stdout.splitlines()) == ["n1 0", "n2 1"]

    out = cluster.dir.parent / "job.out"
    batch = cluster.run(
        "sbatch", "--parsable", "-N2", f"--output={out}", "--wrap", "srun hostname; echo done"
    )
    assert batch.returncode == 0, batch.stderr
    job_id = batch.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 30
    state = ""
    while time.monotonic() < deadline:
        show = cluster.run("scontrol", "show", "job", job_id)
        state = next((w for w in show.stdout.split() if w.startswith("JobState=")), "")
        if state in ("JobState=COMPLETED", "JobState=FAILED"):
            break
        time.sleep(0.2)
    assert state == "JobState=COMPLETED", state
    assert out.read_text().splitlines() == [socket.gethostname()] * 2 + ["done"]

    # a job still running when the cluster goes down is ended with it
    running = subprocess.Popen(
        ["srun", "-N2", "--ntasks-per-node=1", "sleep", "300"],
        env=cluster.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if cluster.run("squeue", "-h", "-t", "R", "-o", "%i").stdout.strip():
                break
            time.sleep(0.2)
        assert _tagged(cluster.tag), "no daemon carries the cluster's tag"
        down = cluster.script("down")
        assert down.returncode == 0, down.stderr
        running.wait(timeout=30)
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()
    assert not cluster.dir.exists()
    assert _tagged(cluster.tag) == []
    assert cluster.script("status").returncode == 1
