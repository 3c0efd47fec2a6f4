"""Two nodes through Slurm (issue #23 item 1), re-judged: tests/data/slurm (README there).

On several nodes every node has a local rank 0. In a two-node hang the peer blocked in the
same checkpointing section may time out first; its node's launcher then records its own local
rank 0 as failed. Only the faulted rank's node's records are the faulted rank's.
"""

from __future__ import annotations

from pathlib import Path

from pytest_nvrx.criteria.judgement import judge_run_dir
from pytest_nvrx.evidence.launcher_log import LauncherEventKind, parse_launcher_log
from tests.helpers.doctor import LAUNCHER, Doctor, copy_run

HANG = Path(__file__).resolve().parents[1] / "data" / "slurm" / "two-nodes-hang-finalize"


def test_the_other_nodes_timeout_first_is_not_the_faulted_ranks() -> None:
    judgement = judge_run_dir(HANG)
    assert [v.id for v in judgement.verdicts if not v.passed] == []
    replaced = next(v for v in judgement.verdicts if v.id == "replaced_cycle")
    quoted = [ref.location for ref in replaced.evidence]
    # the stopped rank's own monitor (node 1), not node 0's earlier timeout and failure
    assert "logs/launcher.log:90" in quoted and "logs/launcher.log:80" not in quoted, quoted


def test_every_launcher_line_says_its_node() -> None:
    log = parse_launcher_log(HANG / "logs" / "launcher.log")
    failed = [e for e in log.events if e.kind is LauncherEventKind.WORKER_FAILED]
    # a glog line: its launcher pid (28275) is node 0's, from node 0's profiling events
    assert [(e.pid, e.rank, e.node) for e in failed] == [(28331, 0, 0)]
    timeouts = [e for e in log.events if e.kind is LauncherEventKind.SECTION_TIMEOUT]
    assert [(e.rank, e.node) for e in timeouts] == [(0, 0), (0, 1)]
    profiling = [e for e in log.events if e.kind is LauncherEventKind.PROFILING]
    assert {e.node for e in profiling} == {0, 1}


def test_without_the_faulted_nodes_own_timeout_the_hang_was_not_detected(tmp_path: Path) -> None:
    """Node 0's timeout and failure alone do not prove that rank 1's hang was detected."""
    run: Doctor = copy_run(HANG, tmp_path / "run")
    run.delete(LAUNCHER, "[workload:?(0) infra:1(0)] rank_monitor_server.py:522")
    judgement = judge_run_dir(run.root)
    replaced = next(v for v in judgement.verdicts if v.id == "replaced_cycle")
    assert not replaced.passed
    assert "no section-timeout message for rank 1 (local 0)" in replaced.reason, replaced.reason
