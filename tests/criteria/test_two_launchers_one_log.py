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
from tests.helpers.doctor import LAUNCHER, copy_run, on_two_hosts

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
    # (or, read first, its node's local rank is not the rank that printed that pid)
    said = ("a second worker failure", "printed at its start")
    assert any(x in v.reason for x in said), v.reason


# -- which launcher wrote a line, and which host it ran on (a fifth attack, adv9) --

DATA = RUNS.parents[1]
#: runs of two nodes, one launcher each, writing one log, both on one host (run.json's host
#: and the marker's, of the faulted node 1, agree)
TWO_NODES = (
    "windows/cpu-two-launchers/tn2-reference-kill-save",
    "shapes/plugin-nodes-tp2-kill-save",
    "shapes/two-nodes-tp2-kill-save",
)
ONE_NODE = (
    "windows/cpu-tie/ref-kill-step",
    "windows/cpu/ref-kill-save",
    "cpu-schedules/ref-kill-step+exception-restore",
)


def _glog(stamp: str, writer: int, message: str) -> str:
    return f"W{stamp} {writer} torch/distributed/elastic/multiprocessing/api.py:1012] {message}"


def _two_nodes(name: str) -> tuple[str, int, int, int]:
    """The faulted rank's own record, its launcher's pid, the other launcher's, the killed pid."""
    run = load_run(DATA / name)
    assert run.marker is not None and run.marker.rank_process is not None
    killed = run.marker.rank_process
    own = next(
        e
        for e in run.launcher.of_kind(LauncherEventKind.WORKER_FAILED)
        if e.pid == killed and e.launcher_pid is not None
    )
    assert own.launcher_pid is not None and len(run.launcher.launchers) == 2
    (other,) = run.launcher.launchers - {own.launcher_pid}
    assert own.ref.line is not None
    line = (DATA / name / LAUNCHER).read_text().splitlines()[own.ref.line - 1]
    return line, own.launcher_pid, other, killed


EDITS = {
    # the other node's launcher signals the pid the faulted rank's own SIGKILL killed
    "closing signal": lambda stamp, other, killed: _glog(
        stamp, other, f"Sending process {killed} closing signal SIGTERM"
    ),
    # the other node's launcher records that pid as its own worker's failure
    "record": lambda stamp, other, killed: _glog(
        stamp,
        other,
        f"failed (exitcode: 1) local_rank: 0 (pid: {killed}) of binary: python",
    ),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
@pytest.mark.parametrize("name", TWO_NODES)
def test_another_launcher_on_the_host_naming_the_killed_pid_fails(
    tmp_path: Path, name: str, edit: str
) -> None:
    """On one host a pid names one process: the other node's launcher never signals or
    records the process that the faulted node's launcher ran and its own SIGKILL killed."""
    record, _, other, killed = _two_nodes(name)
    doc = copy_run(DATA / name, tmp_path / "run")
    stamp = " ".join(record.split(" ")[:2])[1:]
    doc.insert_after(LAUNCHER, record, EDITS[edit](stamp, other, killed))
    v = judge_run_dir(doc.root).verdict("replaced_cycle")
    assert not v.passed and not v.not_applicable, (edit, v.reason)
    assert f"pid {killed}" in v.reason, v.reason


@pytest.mark.parametrize("name", TWO_NODES)
def test_the_faulted_ranks_record_by_the_other_nodes_launcher_fails(
    tmp_path: Path, name: str
) -> None:
    """The record of the faulted rank's death written by the launcher of the node it did not
    run on (NVRx's profiling events name each launcher's node): its own node recorded none."""
    record, own, other, _ = _two_nodes(name)
    doc = copy_run(DATA / name, tmp_path / "run")
    doc.replace(LAUNCHER, record, record.replace(f" {own} ", f" {other} ", 1))
    v = judge_run_dir(doc.root).verdict("replaced_cycle")
    assert not v.passed and not v.not_applicable, v.reason


@pytest.mark.parametrize("name", TWO_NODES)
def test_on_two_hosts_the_same_pid_number_is_no_contradiction(tmp_path: Path, name: str) -> None:
    """Nodes on two hosts (the faulted rank's marker, and its launcher's lines, name another
    host than run.json's node 0): a closing signal of node 0's launcher to the number the killed
    pid had is another process's, and says nothing of the faulted rank."""
    record, own, other, killed = _two_nodes(name)
    doc = copy_run(DATA / name, tmp_path / "run")
    on_two_hosts(doc, own)
    stamp = " ".join(record.split(" ")[:2])[1:]
    doc.insert_after(LAUNCHER, record, EDITS["closing signal"](stamp, other, killed))
    judgement = judge_run_dir(doc.root)
    failed = [v.render() for v in judgement.verdicts if not v.passed]
    assert failed == [], failed


@pytest.mark.parametrize("what", ["record", "closing signal"])
@pytest.mark.parametrize("name", ONE_NODE)
def test_a_line_by_no_launcher_of_the_run_fails(tmp_path: Path, name: str, what: str) -> None:
    """One node has one launcher, the pid its profiling events name: a worker-failure record
    or a closing signal that another pid wrote is no launcher's line of this run."""
    doc = copy_run(DATA / name, tmp_path / "run")
    record = next(x for x in doc.lines(LAUNCHER) if "failed (exitcode:" in x)
    writer = record.split(" ")[2]
    assert int(writer) in load_run(doc.root).launcher.launchers
    if what == "record":
        doc.replace(LAUNCHER, record, record.replace(f" {writer} ", " 99999 ", 1))
    else:
        stamp = " ".join(record.split(" ")[:2])[1:]
        line = _glog(stamp, 99999, "Sending process 4242 closing signal SIGTERM")
        doc.insert_before(LAUNCHER, record, line + "\n")
    v = judge_run_dir(doc.root).verdict("replaced_cycle")
    assert not v.passed and not v.not_applicable, (what, v.reason)
    assert "none of the run's launchers" in v.reason, v.reason


@pytest.mark.parametrize("where", ["run.json", "marker"])
def test_a_host_the_launchers_lines_never_name_cannot_be_judged(tmp_path: Path, where: str) -> None:
    """NVRx prints its host on each of its lines: a run.json or a marker naming another host is
    the record of another run (a host decides which pids may be compared)."""
    doc = copy_run(RUNS / NAMES[0], tmp_path / "run")
    doc.set_json("run.json" if where == "run.json" else "fault_injected.json", host="vm2")
    judgement = judge_run_dir(doc.root)
    assert not judgement.judgeable, [v.render() for v in judgement.verdicts]
    assert "'vm2'" in judgement.verdicts[0].reason, judgement.verdicts[0].reason
