"""What the processes of a faulted run say of their own lives must fit the fault (the classes a
fifth attack on the replaced-cycle rules passed, adv9): a rank's end stamped before the fault,
wherever its line stands; a rank its own SIGKILL or SIGSEGV ended printing its end afterwards;
a pid that ended in one cycle starting a rank in a later one on the same host. Doctored copies
of committed real runs; each edit fails the run, quoting the edited line."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from tests.helpers.doctor import MARKER, copy_run

DATA = Path(__file__).parents[1] / "data"
CYCLE0 = "logs/train_cycle0.log"
CYCLE1 = "logs/train_cycle1.log"
#: one-fault runs that pass: the rank the fault struck is 1
FAULTED = (
    "windows/cpu/ref-kill-save",
    "windows/cpu/ref-segv-step",
    "windows/cpu/ref-exception-step",
    "windows/cpu-tie/ref-kill-step",
    "windows/cpu-two-launchers/tn2-reference-kill-save",
)
KILLED = tuple(n for n in FAULTED if "exception" not in n)


def _fire_line(lines: list[str]) -> str:
    return next(x for x in lines if x.startswith("1: [pytest-nvrx injector]") and " written; " in x)


def _stamp(doc_time: str, ms: int) -> str:
    when = datetime.fromisoformat(doc_time) + timedelta(milliseconds=ms)
    return when.isoformat(timespec="milliseconds")


ENDS = {
    "error": "{rank}: [ref] {stamp} rank {rank} aborted ValueError: corrupt batch",
    "exit": "{rank}: [ref] {stamp} rank {rank} exit code 0",
}


@pytest.mark.parametrize("end", sorted(ENDS))
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("name", FAULTED)
def test_an_end_stamped_before_the_fault_below_the_fire_line_fails(
    tmp_path: Path, name: str, rank: int, end: str
) -> None:
    """A rank's end stamped 50 ms before the marker's time, though printed below the fire line:
    by its clock it ended before the fault, so the failure recorded need not be the fault's."""
    doc = copy_run(DATA / name, tmp_path / "run")
    stamp = _stamp(doc.json(MARKER)["time"], -50)
    doc.insert_after(
        CYCLE0, _fire_line(doc.lines(CYCLE0)), ENDS[end].format(rank=rank, stamp=stamp)
    )
    j = judge_run_dir(doc.root)
    v = j.verdict("replaced_cycle")
    assert not j.passed and not v.passed, (rank, end, v.reason)


@pytest.mark.parametrize("end", sorted(ENDS))
@pytest.mark.parametrize("name", KILLED)
def test_a_killed_rank_printing_its_end_after_its_fire_line_fails(
    tmp_path: Path, name: str, end: str
) -> None:
    """5 ms after its own SIGKILL/SIGSEGV (inside the clocks' allowance for a dying process),
    the rank prints the workload's own stamped error or exit line: its process was gone."""
    doc = copy_run(DATA / name, tmp_path / "run")
    stamp = _stamp(doc.json(MARKER)["time"], 5)
    doc.insert_after(CYCLE0, _fire_line(doc.lines(CYCLE0)), ENDS[end].format(rank=1, stamp=stamp))
    j = judge_run_dir(doc.root)
    v = j.verdict("replaced_cycle")
    assert not j.passed and not v.passed, (end, v.reason)


#: runs with a replacement cycle whose ranks print their start pid, on one host
REPLACED = (*FAULTED, "cpu-schedules/ref-kill-step+exception-restore")
_STARTED = re.compile(r"^(?P<rank>\d+): \[ref\] \S+ rank \d+ started pid (?P<pid>\d+) ")


def _started(lines: list[str]) -> dict[int, tuple[str, str]]:
    """rank -> (its start line, its pid)."""
    out: dict[int, tuple[str, str]] = {}
    for line in lines:
        m = _STARTED.match(line)
        if m is not None:
            out.setdefault(int(m["rank"]), (line, m["pid"]))
    return out


@pytest.mark.parametrize("reused", [0, 1])
@pytest.mark.parametrize("name", REPLACED)
def test_a_replacement_started_as_a_pid_of_the_faulted_cycle_fails(
    tmp_path: Path, name: str, reused: int
) -> None:
    """Rank 1's replacement prints the pid that rank ``reused`` had in cycle 0: that process
    ended when the launcher stopped the group, and one host does not reuse a pid so soon."""
    doc = copy_run(DATA / name, tmp_path / "run")
    old = _started(doc.lines(CYCLE0))[reused][1]
    line, new = _started(doc.lines(CYCLE1))[1]
    doc.replace(CYCLE1, line, line.replace(f" started pid {new} ", f" started pid {old} ", 1))
    j = judge_run_dir(doc.root)
    v = j.verdict("replaced_cycle")
    assert not j.passed and not v.passed, (reused, v.reason)
    assert "does not reuse a pid" in v.reason, v.reason


def test_on_two_hosts_a_pid_number_may_start_again(tmp_path: Path) -> None:
    """Two nodes the marker and run.json place on two hosts: the same number in a later cycle
    may be the other host's process (here node 0's rank 0 after node 1's killed rank)."""
    doc = copy_run(DATA / "windows/cpu-two-launchers/tn2-reference-kill-save", tmp_path / "run")
    doc.set_json(MARKER, host="another-host")
    old = _started(doc.lines(CYCLE0))[1][1]
    line, new = _started(doc.lines(CYCLE1))[0]
    doc.replace(CYCLE1, line, line.replace(f" started pid {new} ", f" started pid {old} ", 1))
    judgement = judge_run_dir(doc.root)
    failed = [v.render() for v in judgement.verdicts if not v.passed]
    assert failed == [], failed


#: the restore of cycle 1 raised the injected exception (the schedule's second fault)
RAISED_IN_RESTORE = "cpu-schedules/ref-kill-step+exception-restore"
GOES_ON = {
    "restores": "1: [ref] {stamp} rank 1 load checkpoint iteration 5 (model, optimizer, scheduler,"
    " rng, data) consumed_samples 20 path {path}",
    "trains": "1: [ref] {stamp} rank 1 iteration 6/20 consumed_samples 24 loss 4.9 lr 0.009"
    " grad_norm 0.5",
}


@pytest.mark.parametrize("goes_on", sorted(GOES_ON))
def test_a_rank_that_raised_the_injected_exception_going_on_fails(
    tmp_path: Path, goes_on: str
) -> None:
    """The exception unwinds the rank's training thread: after its ``load failed`` it neither
    completes the restore nor trains."""
    doc = copy_run(DATA / RAISED_IN_RESTORE, tmp_path / "run")
    failed = next(
        x for x in doc.lines(CYCLE1) if x.startswith("1: [ref] ") and " load failed: " in x
    )
    stamp = failed.split(" ")[2]
    path = failed.split("cannot read ")[1].split(":")[0]
    doc.insert_after(CYCLE1, failed, GOES_ON[goes_on].format(stamp=stamp, path=path))
    j = judge_run_dir(doc.root)
    v = j.verdict("replaced_cycle")
    assert not j.passed and not v.passed, (goes_on, v.reason)
