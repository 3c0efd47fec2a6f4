"""Two nodes on one host, both launchers writing one ``launcher.log`` (real runs,
tests/data/windows/cpu-two-launchers): node 1's launcher records its rank's SIGKILL, node 0's
launcher records its own rank's exit 1 (its collective broke), each launcher one record before
its workers restart. NVRx's lines name no node there (``infra:?``); only the pid of the launcher
that wrote each torch elastic line tells the two records apart. Before f2c989d the
one-record-per-failure check read them as one launcher's two records and failed both runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.evidence.launcher_log import LauncherEventKind
from pytest_nvrx.evidence.rundir import load_run
from tests.helpers.doctor import LAUNCHER, copy_run

RUNS = Path(__file__).parents[1] / "data" / "windows" / "cpu-two-launchers"
NAMES = ("tn2-reference-kill-save", "tn3-reference-kill-save")


def _records(run_dir: Path) -> list[tuple[int | None, str]]:
    """Each worker-failure record: the pid of the launcher that wrote it, its line."""
    run = load_run(run_dir)
    return [
        (e.launcher_pid, e.ref.text)
        for e in run.launcher.events
        if e.kind is LauncherEventKind.WORKER_FAILED
    ]


@pytest.mark.parametrize("name", NAMES)
def test_the_run_is_what_it_is_kept_for(name: str) -> None:
    """Two nodes of one rank each; two records in one log, by two launchers: the faulted
    rank's SIGKILL first, then the peer's exit 1."""
    run = load_run(RUNS / name)
    assert run.manifest is not None and run.marker is not None
    assert (RUNS / name / "run.node1.json").is_file()
    assert run.marker.rank == 1 and run.marker.rank_process is not None
    records = _records(RUNS / name)
    assert len(records) == 2, records
    own = f"failed (exitcode: -9) local_rank: 0 (pid: {run.marker.rank_process})"
    assert own in records[0][1]
    assert "failed (exitcode: 1) local_rank: 0 " in records[1][1]
    pids = [pid for pid, _ in records]
    assert None not in pids and len(set(pids)) == 2, pids


@pytest.mark.parametrize("name", NAMES)
def test_two_launchers_records_in_one_log_pass(name: str) -> None:
    judgement = judge_run_dir(RUNS / name)
    failed = [v.render() for v in judgement.verdicts if not v.passed]
    assert failed == [], failed
    assert judgement.first_cause is None


@pytest.mark.parametrize("name", NAMES)
def test_both_records_by_one_launcher_fail(tmp_path: Path, name: str) -> None:
    """The same two records written by the faulted rank's launcher: one launcher records one
    failure before it stops its group, so the second contradicts the first."""
    (first_pid, _), (second_pid, second) = _records(RUNS / name)
    doc = copy_run(RUNS / name, tmp_path / "run")
    doc.replace(LAUNCHER, second, second.replace(f" {second_pid} ", f" {first_pid} ", 1))
    v = judge_run_dir(doc.root).verdict("replaced_cycle")
    assert not v.passed and not v.not_applicable, v.reason
    assert "a second worker failure" in v.reason, v.reason
