"""The Slurm launch backend: one ft_launcher per node through one srun step.

Pure parts (argv, the node shim, parsers) are tested everywhere; the real runs need a Slurm of at
least two idle nodes (``scripts/slurm_local.sh up`` starts one on this host: SLURM_CONF names it,
or its default /tmp/nvrx-slurm) and are skipped with that reason otherwise, except where
NVRX_REQUIRE_SLURM=1 (``./check`` brings a cluster up and sets it): then a missing cluster fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_nvrx.launch.ports import ephemeral_range
from pytest_nvrx.launch.slurm import (
    IS_HOST_PLACEHOLDER,
    NODE_SHIM,
    node_launcher_argv,
    parse_job_id,
    parse_node_addr,
    shared_hosts,
    srun_argv,
)
from pytest_nvrx.layout import node_console_log_name

LOCAL_CONF = Path(os.environ.get("NVRX_SLURM_DIR", "/tmp/nvrx-slurm")) / "etc" / "slurm.conf"
SBATCH_RECIPE = Path(__file__).resolve().parents[2] / "docs" / "ci" / "slurm-qualify.sbatch"
#: set by ./check after it brought up the local cluster: the real Slurm runs must not skip
REQUIRE_VAR = "NVRX_REQUIRE_SLURM"


# --- pure parts ---------------------------------------------------------------------------------


def test_parsers() -> None:
    assert parse_job_id("salloc: Granted job allocation 12\n") == "12"
    assert parse_job_id("salloc: Pending job allocation 7\nsalloc: job 7 queued") == "7"
    assert parse_job_id("salloc: error: Job submit/allocate failed") is None
    line = "NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 NodeHostName=vm Port=1"
    assert parse_node_addr(line) == "127.0.0.1"
    assert parse_node_addr("NodeName=n1 State=IDLE") is None
    assert shared_hosts(["127.0.0.1", "127.0.0.1"]) and not shared_hosts(["a", "b"])


def test_node_argv_and_srun_step(tmp_path: Path) -> None:
    launcher = [
        "ft_launcher",
        "--nnodes=2",
        "--rdzv-endpoint=localhost:0",
        "--rdzv-id=r",
        "--ft-log-server-port=50051",
    ]
    node = node_launcher_argv(launcher, "10.0.0.1:2345", 2346)
    assert node == [
        "ft_launcher",
        "--nnodes=2",
        "--rdzv-endpoint=10.0.0.1:2345",
        "--rdzv-id=r",
        "--ft-log-server-port=2346",
        f"--rdzv-conf=is_host={IS_HOST_PLACEHOLDER}",
    ]
    argv = srun_argv(
        srun="srun",
        job_id="9",
        nodes=["a1", "a2"],
        step_name="nvrx-r",
        console_dir=tmp_path,
        node_argv=[*node, "w.py"],
        extra=["--partition=p"],
    )
    shim_at = argv.index("bash")
    assert argv[:shim_at] == [
        "srun",
        "--jobid=9",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--nodelist=a1,a2",
        "--job-name=nvrx-r",
        "--kill-on-bad-exit=1",
        "--cpu-bind=none",
        f"--output={tmp_path / 'launcher.console.node%n.log'}",
        "--partition=p",
    ]
    assert argv[shim_at:] == ["bash", "-c", NODE_SHIM, "nvrx-node", *node, "w.py"]
    assert node_console_log_name(1) == "launcher.console.node1.log"


@pytest.mark.parametrize(("node", "is_host"), [("a1", "true"), ("a2", "false")])
def test_node_shim(tmp_path: Path, node: str, is_host: str) -> None:
    """What each task runs: its own TMPDIR below the launch's, the rendezvous-host flag set by
    node name, every argument passed through unchanged otherwise (spaces included)."""
    probe = (
        "import os, sys; print(os.environ['TMPDIR']); print(os.path.isdir(os.environ['TMPDIR']));"
        " print(repr(sys.argv[1:]))"
    )
    args = [f"--rdzv-conf=is_host={IS_HOST_PLACEHOLDER}", "two words"]
    out = subprocess.run(
        ["bash", "-c", NODE_SHIM, "nvrx-node", sys.executable, "-c", probe, *args],
        env={
            **os.environ,
            "SLURMD_NODENAME": node,
            "NVRX_RDZV_NODE": "a1",
            "TMPDIR": str(tmp_path),
        },
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == [
        str(tmp_path / node),
        "True",
        repr([f"--rdzv-conf=is_host={is_host}", "two words"]),
    ]


def test_node_shim_refuses_outside_a_step(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SLURMD_NODENAME"}
    done = subprocess.run(
        ["bash", "-c", NODE_SHIM, "nvrx-node", "true"],
        env={**env, "NVRX_RDZV_NODE": "a1", "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and "not a task of a Slurm step" in done.stderr


# --- real runs on a Slurm -----------------------------------------------------------------------


def _slurm_env() -> dict[str, str]:
    env = dict(os.environ)
    if "SLURM_CONF" not in env and LOCAL_CONF.is_file():
        env["SLURM_CONF"] = str(LOCAL_CONF)
    # this test session is not a Slurm job: the launch must make its own allocation
    for var in [v for v in env if v.startswith("SLURM_") and v != "SLURM_CONF"]:
        del env[var]
    return env


def _idle_nodes(env: dict[str, str]) -> int:
    if shutil.which("sinfo") is None or shutil.which("srun") is None:
        return 0
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"],
            env=env,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 0
    return len(set(out.stdout.split())) if out.returncode == 0 else 0


@pytest.fixture
def slurm_env() -> dict[str, str]:
    env = _slurm_env()
    if _idle_nodes(env) < 2:
        why = (
            "no Slurm with 2 idle nodes here (start one: scripts/slurm_local.sh up; then "
            "SLURM_CONF or the default /tmp/nvrx-slurm names it)"
        )
        if os.environ.get(REQUIRE_VAR) == "1":
            pytest.fail(f"{REQUIRE_VAR}=1 but {why}", pytrace=False)
        pytest.skip(why)
    return env


def _node_cpus(env: dict[str, str]) -> int:
    """The CPUs the local cluster's node n1 declares."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "node", "n1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    m = re.search(r"\bCPUTot=(\d+)", out.stdout)
    assert m is not None, out.stdout
    return int(m[1])


def _our_jobs(env: dict[str, str], name: str) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-n", name, "-o", "%i %T"],
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    return out.stdout.splitlines()


@pytest.mark.real_run
def test_reference_kill_on_two_nodes_through_srun(
    tmp_path: Path, slurm_env: dict[str, str]
) -> None:
    """The shipped reference kill scenario, NNODES=2, one ft_launcher per Slurm node: all six
    criteria pass on the combined run directory, and the fault's node is in the evidence."""
    work = tmp_path / "work"
    run_id = f"slurm{os.getpid()}"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "pytest_nvrx.suite",
        "-p",
        "no:cacheprovider",
        "-k",
        "reference-kill-save",
        "--nvrx-workload=reference",
        "--nvrx-nnodes=2",
        "--nvrx-gpus-per-node=1",
        "--nvrx-launcher=slurm",
        f"--nvrx-work-dir={work}",
        "-q",
    ]
    t0 = time.monotonic()
    done = subprocess.run(
        cmd,
        env={**slurm_env, "NVRX_RUN_ID": run_id},
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
        cwd=tmp_path,
    )
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    # the six criteria and the suite's own checks of the scenario, none failed or skipped
    summary = done.stdout.strip().splitlines()[-1]
    # pytest appends "(H:MM:SS)" to a session of a minute or more (a loaded machine)
    counts = re.fullmatch(r"(\d+) passed, \d+ deselected in [\d.]+s( \(\d+:\d\d:\d\d\))?", summary)
    assert counts is not None and int(counts.group(1)) >= 6, summary
    (run_dir,) = (work / "runs").iterdir()
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["config"]["launcher"] == "slurm"
    assert manifest["config"]["nnodes"] == 2 and manifest["config"]["world_size"] == 2
    slurm = manifest["slurm"]
    assert slurm["allocated_here"] is True and len(slurm["nodes"]) == 2
    assert manifest["config"]["rdzv_endpoint"] == slurm["rdzv_endpoint"] != "localhost:0"
    # the first node chose both ports (pytest_nvrx/launch/ports.py run there): outside its ephemeral
    # range, and the launchers ran with them
    low, high = ephemeral_range()
    rdzv_port = int(slurm["rdzv_endpoint"].rsplit(":", 1)[1])
    log_port = manifest["log_server_port"]
    assert log_port == rdzv_port + 1, (log_port, slurm)
    assert not any(low <= port <= high for port in (rdzv_port, log_port)), slurm
    assert f"--ft-log-server-port={log_port}" in slurm["srun_argv"], slurm["srun_argv"]
    # fault rank 1 ran on the second node (one process per node): its launcher (infra rank 1)
    # saw the failure, and its lines reached the one launcher log NVRx's log server writes
    log = (run_dir / "logs" / "launcher.log").read_text().splitlines()
    failure = [line for line in log if "Event: failure_detected" in line and "Rank: 1" in line]
    assert any("infra:1(" in line for line in failure), failure
    assert any("infra:0(" in line for line in log) and any("infra:1(" in line for line in log)
    for node in (0, 1):
        assert (run_dir / "logs" / node_console_log_name(node)).is_file()
    # the allocation made for the run is gone
    assert _our_jobs(slurm_env, slurm["step_name"]) == []
    print(f"slurm reference kill, 2 nodes: {wall:.1f} s")


def _cli_run(work: Path, run_id: str, *, nnodes: int, timeout: int) -> list[str]:
    return [
        *(sys.executable, "-m", "pytest_nvrx", "run", "--workload=reference"),
        *(f"--nnodes={nnodes}", "--gpus-per-node=1", "--launcher=slurm"),
        *(f"--work-dir={work}", f"--run-id={run_id}", f"--timeout={timeout}"),
    ]


@pytest.mark.real_run
def test_timeout_cancels_the_allocation_and_the_tree(
    tmp_path: Path, slurm_env: dict[str, str]
) -> None:
    """A run killed by its deadline leaves no job and no process: srun's tasks are stopped and
    the allocation made for it is cancelled."""
    run_id = f"slurmto{os.getpid()}"
    done = subprocess.run(
        _cli_run(tmp_path, run_id, nnodes=2, timeout=12),
        env={**slurm_env, "NVRX_TEST_MARK": run_id},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 124, done.stdout + done.stderr
    assert "Slurm job" in done.stdout and "allocated here" in done.stdout, done.stdout
    assert _our_jobs(slurm_env, f"nvrx-{run_id}") == []
    from tests.helpers.processes import marked

    assert marked(run_id) == {}
    result = json.loads((tmp_path / "runs" / run_id / "result.json").read_text())
    assert result["timed_out"] is True


def test_allocation_too_small_is_refused_and_leaves_no_job(
    tmp_path: Path, slurm_env: dict[str, str]
) -> None:
    run_id = f"slurmbig{os.getpid()}"
    done = subprocess.run(
        _cli_run(tmp_path, run_id, nnodes=64, timeout=60),
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the run needs 64 (NNODES): lower --nnodes" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert _our_jobs(slurm_env, f"nvrx-{run_id}") == []


@pytest.mark.real_run
def test_the_sbatch_recipe_qualifies_kill_and_hang_on_two_nodes(
    tmp_path: Path, slurm_env: dict[str, str]
) -> None:
    """docs/ci/slurm-qualify.sbatch, submitted as a user would (``sbatch --wait``) with the
    reference kill and hang scenarios, NNODES=2: the batch job runs pytest on its first node,
    the plugin starts one ft_launcher per node through srun inside the job's allocation, the
    fault lands on rank 1 (the second node), and everything the job leaves is judged again here:
    JUnit XML (every criterion of both scenarios passed) and each run dir through ``verify``."""
    out = tmp_path / "qual"
    env = {
        **slurm_env,
        "NVRX_QUAL_OUT": str(out),
        "NVRX_PYTEST": f"{sys.executable} -m pytest",
        "NVRX_QUAL_MARKERS": "(kill or hang) and not schedule",
    }
    done = subprocess.run(
        ["sbatch", "--wait", "--parsable", f"--output={tmp_path}/job-%j.out", str(SBATCH_RECIPE)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    job_id = done.stdout.strip().split(";")[0]
    job_out = tmp_path / f"job-{job_id}.out"
    log = job_out.read_text() if job_out.is_file() else "(no job output)"
    assert done.returncode == 0, f"sbatch: {done.stderr}\n{log[-8000:]}"
    assert job_id.isdigit(), done.stdout

    cases = list(ET.parse(out / "junit.xml").iter("testcase"))
    for scenario in ("reference-kill-save", "reference-hang-finalize"):
        mine = [c for c in cases if f"[{scenario}" in c.get("name", "")]
        assert len(mine) == 7, [c.get("name") for c in cases]  # run_finished + six criteria
        bad = [c.get("name") for c in mine for e in c if e.tag in ("failure", "error", "skipped")]
        assert not bad, bad

    # the recovery report of the session, both scenarios in it, and no shard left behind
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    report = json.loads((out / "report.json").read_text())
    assert sorted(s["name"] for s in report["scenarios"]) == [
        "reference-hang-finalize",
        "reference-kill-save",
    ], report["scenarios"]
    assert not [p for p in (out / "work").rglob("*.distcp")]

    runs = sorted((out / "work" / "runs").iterdir())
    assert [r.name.rsplit("-", 2)[0] for r in runs] == [
        "reference-hang-finalize",
        "reference-kill-save",
    ]
    for run_dir in runs:
        manifest = json.loads((run_dir / "run.json").read_text())
        assert manifest["config"]["launcher"] == "slurm"
        assert (manifest["config"]["nnodes"], manifest["config"]["fault_rank"]) == (2, 1)
        slurm = manifest["slurm"]
        # the batch job's own allocation, not one made by the plugin
        assert (slurm["job_id"], slurm["allocated_here"]) == (job_id, False)
        marker = json.loads((run_dir / "fault_injected.json").read_text())
        assert marker["rank"] == 1
        launcher_log = (run_dir / "logs" / "launcher.log").read_text().splitlines()
        detected = [line for line in launcher_log if "Event: failure_detected" in line]
        assert any("infra:1(" in line for line in detected), detected
        # the local Slurm binds tasks (task/affinity, CpuBind=cores): each node's launcher and
        # its rank kept every CPU of the node (without --cpu-bind=none: 1 each)
        started = [
            line
            for log in (run_dir / "logs").glob("train_cycle*.log")
            for line in log.read_text().splitlines()
            if " started pid " in line
        ]
        assert len(started) >= 4, started  # 2 ranks x 2 cycles
        assert all(line.endswith(f" cpus {_node_cpus(slurm_env)}") for line in started), started
        verify = subprocess.run(
            [sys.executable, "-m", "pytest_nvrx", "verify", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert verify.stdout.count("PASS ") == 6, verify.stdout
    # the batch job is over and left no step behind
    assert _our_jobs(slurm_env, "nvrx-qualify") == []
