"""Two "nodes" on one host, started by hand: two ``run --node-index`` starts of one run (#11).

The device test of issue #11 (NNODES=2, GPUS_PER_NODE=1, rendezvous on localhost, the fault on
the second node) as the CLI runs it: node 0 hosts the rendezvous (``is_host=true``), node 1 does
not, both may share the host (NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE=1), each claims and writes
its own files, NVRx's log server on node 0 writes the one launcher.log and cycle logs, and the
combined run dir is judged once. Here on the CPU reference workload, for real.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_nvrx.launch.ports import free_port
from pytest_nvrx.launch.recipe import (
    INFRA_RANK_VAR,
    MULTI_LAUNCHERS_VAR,
    build_recipe,
    endpoint_host,
    is_this_host,
    node_env,
    node_options,
    rdzv_host_option,
)
from pytest_nvrx.launch.run_dir_setup import claim_file, prepare_run_dir
from pytest_nvrx.launch.run_dir_setup import validate_run as validate
from pytest_nvrx.settings import ConfigError, PartialRunConfig, RunConfig, resolve
from tests.helpers.processes import kill_marked, marked_env, new_mark

# --------------------------------------------------------------------------------------------
# the node options (pure)


def _config(tmp_path: Path, **kw: object) -> RunConfig:
    values: dict[str, object] = {
        "work_dir": tmp_path,
        "run_id": "nodes",
        "workload": "reference",
        "nnodes": 2,
        "gpus_per_node": 1,
        "rdzv_endpoint": "localhost:29510",
        **kw,
    }
    return RunConfig(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("index", "is_host"), [(0, "true"), (1, "false"), (3, "false")])
def test_node_0_hosts_the_rendezvous_and_shares_the_host(
    tmp_path: Path, index: int, is_host: str
) -> None:
    recipe = build_recipe(_config(tmp_path, nnodes=4, node_index=index), port=40000)
    assert recipe.launcher_argv[-1] == f"--rdzv-conf=is_host={is_host}"
    assert [a for a in recipe.argv if a.startswith("--rdzv-conf")] == [
        f"--rdzv-conf=is_host={is_host}"
    ]
    assert recipe.env[MULTI_LAUNCHERS_VAR] == "1"
    # NVRx orders the nodes by their infrastructure rank: node I's workers are ranks I..
    assert recipe.env[INFRA_RANK_VAR] == str(index)


def test_without_a_node_index_nvrx_guesses_as_before(tmp_path: Path) -> None:
    recipe = build_recipe(_config(tmp_path), port=40000)
    assert not any(a.startswith("--rdzv-conf") for a in recipe.argv)
    assert MULTI_LAUNCHERS_VAR not in recipe.env and INFRA_RANK_VAR not in recipe.env
    assert node_options(_config(tmp_path)) == []


def test_nodes_with_a_rendezvous_elsewhere_need_no_permission(tmp_path: Path) -> None:
    config = _config(tmp_path, node_index=1, rdzv_endpoint="node001.example.org:29510")
    assert node_env(config) == {INFRA_RANK_VAR: "1"}
    assert node_options(config) == ["--rdzv-conf=is_host=false"]
    # one node: nothing to share
    assert node_env(_config(tmp_path, nnodes=1, node_index=0)) == {INFRA_RANK_VAR: "0"}


@pytest.mark.parametrize(
    ("endpoint", "local"),
    [
        ("localhost:29510", True),
        ("127.0.0.1:29510", True),
        ("[::1]:29510", True),
        (f"{socket.gethostname()}:29510", True),
        (f"{socket.gethostname().upper()}:1", True),
        ("node001.example.org:29510", False),
        ("10.255.255.1:29510", False),
    ],
)
def test_which_endpoints_are_this_host(endpoint: str, local: bool) -> None:
    assert is_this_host(endpoint_host(endpoint)) is local


def test_the_slurm_shim_uses_the_same_option() -> None:
    from pytest_nvrx.launch.slurm import IS_HOST_PLACEHOLDER, node_launcher_argv

    argv = node_launcher_argv(["ft_launcher", "--rdzv-endpoint=x:1"], "h:2", 3)
    assert argv == ["ft_launcher", "--rdzv-endpoint=h:2", rdzv_host_option(IS_HOST_PLACEHOLDER)]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"node_index": 2}, "node index 2 is not below NNODES 2"),
        ({"node_index": -1}, "node index must be >= 0"),
        ({"node_index": 0, "launcher": "slurm"}, "drop --node-index"),
    ],
)
def test_bad_node_indexes_are_refused(tmp_path: Path, kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(_config(tmp_path, **kw))


def test_node_index_from_the_environment(tmp_path: Path) -> None:
    env = {"NVRX_WORK_DIR": str(tmp_path), "NVRX_RUN_ID": "r", "NVRX_NODE_INDEX": "1"}
    assert resolve(PartialRunConfig(), env).node_index == 1
    assert resolve(PartialRunConfig(node_index=0), env).node_index == 0  # the option wins
    with pytest.raises(ConfigError, match="NVRX_NODE_INDEX"):
        resolve(PartialRunConfig(), {**env, "NVRX_NODE_INDEX": "one"})


def test_each_node_claims_its_own_index_once(tmp_path: Path) -> None:
    layout0 = prepare_run_dir(_config(tmp_path, node_index=0))
    prepare_run_dir(_config(tmp_path, node_index=1))  # the other node, same host: allowed
    assert claim_file(layout0, nnodes=2, host="any", node_index=1).name == "run.node1.claim"
    assert sorted(p.name for p in layout0.run_dir.glob("*.claim")) == [
        "run.node0.claim",
        "run.node1.claim",
    ]
    with pytest.raises(ConfigError, match=r"already claimed .*run\.node1\.claim"):
        prepare_run_dir(_config(tmp_path, node_index=1))  # node 1 started twice


# --------------------------------------------------------------------------------------------
# two real launchers on this host


def _joined_as(launcher_log: str, launcher_pid: int) -> int:
    """The rank the node of this launcher got in the first rendezvous (NVRx names a node
    ``<host>_<launcher pid>_<n>``)."""
    m = re.search(rf"The node '[^']*_{launcher_pid}_\d+' has joined .* as rank (\d+)", launcher_log)
    assert m, f"no rendezvous join of launcher {launcher_pid} in launcher.log"
    return int(m.group(1))


def _run_nodes(
    tmp_path: Path, commands: list[list[str]], envs: list[dict[str, str]], cwd: Path | None = None
) -> list[str]:
    """Start every node's command at once, each in its own session with ``envs[i]`` on top of
    this test's marked environment and its output in ``node<i>.out``; wait up to 300 s, then
    kill whatever is left (the mark finds strays). Both must exit 0; their outputs returned."""
    mark = new_mark()
    procs: list[subprocess.Popen[bytes]] = []
    outs = [tmp_path / f"node{i}.out" for i in range(len(commands))]
    try:
        for argv, extra, out in zip(commands, envs, outs, strict=True):
            with out.open("wb") as fh:
                procs.append(
                    subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                        env={**marked_env(mark), **extra},
                        cwd=cwd,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + 300
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.5)
        codes = [p.poll() for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
        kill_marked(mark)
    texts = [out.read_text(errors="replace") for out in outs]
    assert codes == [0] * len(procs), "\n".join(
        f"--- node {i} ---\n{t[-3000:]}" for i, t in enumerate(texts)
    )
    return texts


@pytest.mark.real_run
@pytest.mark.timeout(400)
def test_two_nodes_on_one_host_kill_on_the_second_node(tmp_path: Path) -> None:
    work = tmp_path / "work"
    endpoint = f"localhost:{free_port()}"
    common = [
        sys.executable, "-m", "pytest_nvrx", "run",
        "--workload", "reference", "--work-dir", str(work), "--run-id", "two-nodes",
        "--nnodes", "2", "--gpus-per-node", "1", "--rdzv-endpoint", endpoint,
        "--fault", "kill", "--fault-rank", "1", "--train-iters", "20", "--save-interval", "5",
        "--section-timeouts", "setup:120,step:30,checkpointing:60",
        "--workload-check-interval", "1", "--timeout", "240",
    ]  # fmt: skip
    _run_nodes(tmp_path, [[*common, "--node-index", str(i)] for i in range(2)], [{}, {}])

    run_dir = work / "runs" / "two-nodes"
    # node 0's files are the run's; node 1 has its own beside them
    manifests = [json.loads((run_dir / n).read_text()) for n in ("run.json", "run.node1.json")]
    results = [json.loads((run_dir / n).read_text()) for n in ("result.json", "result.node1.json")]
    for i, (man, res) in enumerate(zip(manifests, results, strict=True)):
        assert man["node_index"] == i
        assert man["config"]["node_index"] == i
        assert man["launcher_argv"][-1] == f"--rdzv-conf=is_host={'true' if i == 0 else 'false'}"
        assert man["env"][MULTI_LAUNCHERS_VAR] == "1"
        assert man["env"][INFRA_RANK_VAR] == str(i)
        assert res["exit_code"] == 0
    assert manifests[0]["env"]["TMPDIR"] != manifests[1]["env"]["TMPDIR"]
    assert sorted(p.name for p in run_dir.glob("run.*claim")) == [
        "run.node0.claim",
        "run.node1.claim",
    ]
    logs = run_dir / "logs"
    assert {p.name for p in logs.glob("launcher.console*")} == {
        "launcher.console.node0.log",
        "launcher.console.node1.log",
    }
    # one launcher.log, written by node 0's log server, holds both nodes' rendezvous; the fault
    # hit rank 1, which is node 1's
    launcher_log = (logs / "launcher.log").read_text(errors="replace")
    ranks = [_joined_as(launcher_log, r["launcher_pid"]) for r in results]
    assert sorted(ranks) == [0, 1]
    marker = json.loads((run_dir / "fault_injected.json").read_text())
    assert marker["rank"] == 1 and marker["fault"] == "kill"
    assert ranks[1] == 1, f"rank 1 ran on node {ranks.index(1)}, not on the second node"
    assert sorted(p.name for p in logs.glob("*.log") if "console" not in p.name) == [
        "launcher.log",
        "launcher_grpc_root.log",
        "train_cycle0.log",
        "train_cycle1.log",
    ]

    verify = subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", "verify", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "verify: PASSED (6 of 6)" in verify.stdout


@pytest.mark.real_run
@pytest.mark.timeout(400)
def test_two_nodes_on_one_host_through_the_plugin(tmp_path: Path) -> None:
    """The same two nodes as two pytest sessions of the shipped suite, one per node, sharing
    NVRX_RUN_ID, the work dir and the endpoint: node 0 by ``--nvrx-node-index``, node 1 by
    ``NVRX_NODE_INDEX``. Each session judges the one combined run dir and passes it."""
    work = tmp_path / "work"
    endpoint = f"localhost:{free_port()}"
    common = [
        sys.executable, "-m", "pytest", "--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider",
        "-q", "-k", "reference-kill-save", "--nvrx-nnodes=2", "--nvrx-gpus-per-node=1",
        f"--nvrx-rdzv-endpoint={endpoint}", f"--nvrx-work-dir={work}",
    ]  # fmt: skip
    # node 0 by option, node 1 by environment
    texts = _run_nodes(
        tmp_path,
        [[*common, "--nvrx-node-index=0"], common],
        [{"NVRX_RUN_ID": "plugin-nodes"}, {"NVRX_RUN_ID": "plugin-nodes", "NVRX_NODE_INDEX": "1"}],
        cwd=tmp_path,
    )
    for text in texts:
        # run_finished + six criteria, none failed or skipped, in each node's session
        assert re.search(r"^7 passed, \d+ deselected", text, re.MULTILINE), text[-2000:]
    run_dir = work / "runs" / "plugin-nodes-reference-kill-save"
    manifests = [json.loads((run_dir / n).read_text()) for n in ("run.json", "run.node1.json")]
    assert [m["node_index"] for m in manifests] == [0, 1]
    marker = json.loads((run_dir / "fault_injected.json").read_text())
    assert marker["rank"] == 1 and marker["window"] == "save"
