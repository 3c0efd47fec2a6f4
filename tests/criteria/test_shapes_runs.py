"""Parallel shapes on the GPU (issue #11): real 2x H200 runs through the plugin, re-judged.

``tests/data/shapes``: ``pytest -m "gpu and (kill or hang)" --nvrx-gpus-per-node 2`` with
``--nvrx-tp 2`` or ``--nvrx-pp 2`` (20 iterations), no environment variable set by hand: the
recipe sets ``CUDA_DEVICE_MAX_CONNECTIONS=1`` for TP=2 from the checkout's own assertion and
records it in run.json. With the distributed optimizer (the plugin's default) TP=2 trains but
cannot resume on this TE-less stack (docs/gpu.md, the distributed-optimizer finding); without
it TP=2 and PP=2 kill and hang pass all six criteria.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.criteria.judgement import judge_run_dir

SHAPES = Path(__file__).resolve().parents[1] / "data" / "shapes"
PASSING = ["tp2-kill-save", "tp2-hang-finalize", "pp2-kill-save", "pp2-hang-finalize"]
DISTOPT = ["tp2-distopt-kill-save", "tp2-distopt-hang-finalize"]


def _manifest(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SHAPES / name / "run.json").read_text())
    return data


def _logs(name: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in (SHAPES / name / "logs").glob("*.log"))


@pytest.mark.parametrize("name", PASSING + DISTOPT)
def test_the_shape_is_what_the_name_says(name: str) -> None:
    config = _manifest(name)["config"]
    tp, pp = (2, 1) if name.startswith("tp2") else (1, 2)
    assert (config["tp"], config["pp"], config["world_size"]) == (tp, pp, 2)
    assert config["distributed_optimizer"] is (name in DISTOPT)
    fault, window = name.rsplit("-", 2)[-2:]
    assert (config["fault"], config["window"]) == (fault, window)


@pytest.mark.parametrize("name", PASSING)
def test_tp2_and_pp2_recover_and_pass_all_six(name: str) -> None:
    judgement = judge_run_dir(SHAPES / name)
    assert [v.id for v in judgement.verdicts if not v.passed] == []
    assert judgement.first_cause is None


@pytest.mark.parametrize("name", PASSING + DISTOPT)
def test_the_worker_env_came_from_the_checkout_not_by_hand(name: str) -> None:
    """TP=2: CUDA_DEVICE_MAX_CONNECTIONS=1 set by us from Megatron's own assertion (its line
    recorded); PP=2 alone does not demand it, so nothing is set. Megatron never refused it."""
    env = _manifest(name)["worker_env"]
    if name.startswith("tp2"):
        assert [(e["name"], e["value"], e["origin"]) for e in env] == [
            ("CUDA_DEVICE_MAX_CONNECTIONS", "1", "pytest-nvrx")
        ]
        assert env[0]["where"] == "megatron/training/arguments.py:1437"
        assert "tensor_model_parallel_size > 1" in env[0]["condition"]
    else:
        assert env == []
    logs = _logs(name)
    refused = [
        line
        for line in logs.splitlines()
        if "AssertionError" in line and "CUDA_DEVICE_MAX_CONNECTIONS" in line
    ]
    assert refused == []
    assert " iteration        5/" in logs  # the workers trained past setup


@pytest.mark.parametrize("name", DISTOPT)
def test_tp2_with_the_distributed_optimizer_cannot_resume(name: str) -> None:
    """The distributed-optimizer finding, now at TP=2: training and the fault are fine, every
    replacement dies loading the checkpoint (distrib_optimizer.py:839), the launcher stops on
    no progress. The qualification says so."""
    judgement = judge_run_dir(SHAPES / name)
    failed = [v.id for v in judgement.verdicts if not v.passed]
    assert failed == [
        "optimizer_state_load",
        "progress_past_restore",
        "no_repeat_injection",
        "training_continuity",
    ]
    load = judgement.verdict("optimizer_state_load")
    assert "distrib_optimizer.py:839 (assert len(steps) == 1)" in load.reason
    assert "no-progress stop" in judgement.verdict("no_repeat_injection").reason


TWO_NODES = SHAPES / "two-nodes-tp2-kill-save"


def test_two_nodes_on_one_host_tp2_across_them_recover() -> None:
    """Two ft_launchers on one 2-GPU host (NNODES=2, GPUS_PER_NODE=1, TP=2 across the nodes,
    rendezvous on localhost), started by hand with --node-index 0 / 1 and one GPU each; the
    kill on rank 1 hits node 1. The combined run dir passes all six, and the failure line in the
    one launcher.log comes from node 1's launcher, not node 0's."""
    config = json.loads((TWO_NODES / "run.json").read_text())["config"]
    assert (config["nnodes"], config["gpus_per_node"], config["tp"]) == (2, 1, 2)
    assert config["node_index"] == 0  # run.json is node 0's
    judgement = judge_run_dir(TWO_NODES)
    assert [v.id for v in judgement.verdicts if not v.passed] == []
    marker = json.loads((TWO_NODES / "fault_injected.json").read_text())
    assert (marker["rank"], marker["local_rank"]) == (1, 0)
    node0 = json.loads((TWO_NODES / "result.json").read_text())["launcher_pid"]
    failed = [
        line
        for line in (TWO_NODES / "logs" / "launcher.log").read_text().splitlines()
        if "failed (exitcode: -9)" in line
    ]
    assert len(failed) == 1 and f"(pid: {marker['pid']})" in failed[0]
    assert f" {node0} torch/distributed" not in failed[0]  # logged by the other launcher


PLUGIN_NODES = {
    "plugin-nodes-tp2-kill-save": False,  # name -> distributed optimizer
    "plugin-nodes-tp2-distopt-kill-save": True,
}
SESSIONS = SHAPES / "plugin-nodes-sessions"


@pytest.mark.parametrize("name", sorted(PLUGIN_NODES))
def test_two_nodes_on_one_host_through_the_plugin(name: str) -> None:
    """The same two nodes as two pytest sessions of the shipped suite (``device_gpu_suite.sh
    --nodes 2``: CUDA_VISIBLE_DEVICES=i, --nvrx-node-index i, one NVRX_RUN_ID, -m "gpu and
    kill" --nvrx-tp 2), nothing set by hand: the recipe set CUDA_DEVICE_MAX_CONNECTIONS, node 1
    wrote its own manifest, rank 1 (node 1) was killed. Without the distributed optimizer all six
    pass; with it (the plugin's default) every replacement dies on distrib_optimizer.py:839 and
    both sessions fail with that cause, as the one-node TP=2 runs above."""
    run_dir = SHAPES / name
    distopt = PLUGIN_NODES[name]
    manifests = [json.loads((run_dir / n).read_text()) for n in ("run.json", "run.node1.json")]
    for index, manifest in enumerate(manifests):
        config = manifest["config"]
        assert (config["nnodes"], config["gpus_per_node"], config["tp"]) == (2, 1, 2)
        assert (config["node_index"], config["fault_rank"]) == (index, 1)
        assert config["distributed_optimizer"] is distopt
        assert [(e["name"], e["origin"]) for e in manifest["worker_env"]] == [
            ("CUDA_DEVICE_MAX_CONNECTIONS", "pytest-nvrx")
        ]
    marker = json.loads((run_dir / "fault_injected.json").read_text())
    assert (marker["rank"], marker["local_rank"], marker["window"]) == (1, 0, "save")
    judgement = judge_run_dir(run_dir)
    failed = [v.id for v in judgement.verdicts if not v.passed]
    sessions = [
        (SESSIONS / f"{'distopt' if distopt else 'nodistopt'}.node{i}.log").read_text()
        for i in (0, 1)
    ]
    if distopt:
        assert failed == [
            "optimizer_state_load",
            "progress_past_restore",
            "no_repeat_injection",
            "training_continuity",
        ]
        assert "distrib_optimizer.py:839" in judgement.verdict("optimizer_state_load").reason
        assert all("4 failed, 3 passed" in text for text in sessions)
    else:
        assert failed == []
        assert all(re.search(r"= 7 passed, \d+ deselected in ", text) for text in sessions)
