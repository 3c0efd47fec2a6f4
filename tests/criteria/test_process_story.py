"""What the processes of a faulted run say of their own lives must fit the fault (the classes a
fifth attack on the replaced-cycle rules passed, adv9): a rank's end stamped before the fault,
wherever its line stands; a rank its own SIGKILL or SIGSEGV ended printing its end afterwards;
a pid that ended in one cycle starting a rank in a later one on the same host. Doctored copies
of committed real runs; each edit fails the run, quoting the edited line."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from tests.helpers.doctor import MARKER, Doctor, copy_run, on_two_hosts

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
    on_two_hosts(doc, 2988)  # node 1's launcher
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


# -- a sixth attack (adv10): what the launcher and the other ranks say must fit too --

LAUNCHER = "logs/launcher.log"
EXCEPTION_RUN = "windows/cpu/ref-exception-step"
KILL_RUN = "windows/cpu/ref-kill-step"
TWO_LAUNCHERS = "windows/cpu-two-launchers/tn2-reference-kill-save"


def _records(doc: Doctor) -> list[str]:
    return [x for x in doc.lines(LAUNCHER) if "failed (exitcode: " in x]


def _glog_time(line: str) -> str:
    return line.split(" ")[1]


def _record_of(doc: Doctor, pid: int) -> str:
    return next(x for x in _records(doc) if f"(pid: {pid})" in x)


def _record_before_fault(pid_of: str) -> Callable[[Doctor], None]:
    """The record of the faulted rank (``rank_pid``) or of the other node's rank (``peer``)
    stamped 400 ms before the marker's time."""

    def edit(doc: Doctor) -> None:
        marker = doc.json(MARKER)
        own = _record_of(doc, marker["rank_pid"])
        record = own if pid_of == "rank_pid" else next(x for x in _records(doc) if x != own)
        when = datetime.fromisoformat(marker["time"]) - timedelta(milliseconds=400)
        doc.replace(
            LAUNCHER, record, record.replace(_glog_time(record), when.strftime("%H:%M:%S.%f"))
        )

    return edit


def _closing_to(pid: str) -> Callable[[Doctor], None]:
    """The launcher's closing signal sent to another pid: ``4444`` (no rank's), ``raiser``
    (the exception raiser, after its own record)."""

    def edit(doc: Doctor) -> None:
        if pid == "raiser":
            record = _records(doc)[0]
            head = " ".join(record.split(" ")[:3])
            signal = f"W{head[1:]} torch/distributed/elastic/multiprocessing/api.py:1028]"
            raiser = doc.json(MARKER)["rank_pid"]
            doc.insert_after(
                LAUNCHER, record, f"{signal} Sending process {raiser} closing signal SIGTERM"
            )
            return
        closing = next(x for x in doc.lines(LAUNCHER) if "closing signal" in x)
        old = closing.split("Sending process ")[1].split(" ")[0]
        doc.replace(LAUNCHER, closing, closing.replace(f"process {old} ", "process 4444 "))

    return edit


def _peer_record_pid(doc: Doctor) -> None:
    own = _record_of(doc, doc.json(MARKER)["rank_pid"])
    record = next(x for x in _records(doc) if x != own)
    old = record.split("(pid: ")[1].split(")")[0]
    doc.replace(LAUNCHER, record, record.replace(f"(pid: {old})", "(pid: 4444)"))


def _peer_started_as_the_faulted_rank(doc: Doctor) -> None:
    line = _started(doc.lines(CYCLE0))[0][0]
    old = _started(doc.lines(CYCLE0))[0][1]
    doc.replace(
        CYCLE0,
        line,
        line.replace(f"started pid {old} ", f"started pid {doc.json(MARKER)['rank_pid']} "),
    )


def _raiser_traceback_in_the_peers_stream(doc: Doctor) -> None:
    doc.replace(CYCLE0, "1: [rank1]: ", "0: [rank0]: ")


def _raiser_aborted_on_another_exception(doc: Doctor) -> None:
    doc.replace(
        CYCLE0,
        "aborted InjectedFault: pytest-nvrx injected exception on rank 1",
        "aborted ValueError: loss is nan",
    )


def _raiser_injector_line_of_another_pid(doc: Doctor) -> None:
    pid = doc.json(MARKER)["rank_pid"]
    doc.replace(CYCLE0, f"rank 1 pid {pid}: watching", "rank 1 pid 5555: watching")


def _a_rank_beyond_the_world(doc: Doctor) -> None:
    fire = _fire_line(doc.lines(CYCLE0))
    stamp = _stamp(doc.json(MARKER)["time"], 10)
    doc.insert_after(
        CYCLE0, fire, f"2: [ref] {stamp} rank 2 started pid 4444 world_size 2 restart_count 0"
    )


def _a_frameless_peer_traceback(doc: Doctor) -> None:
    kept = [
        x
        for x in doc.lines(CYCLE0)
        if not x.startswith("0: [rank0]:")
        or x.startswith(("0: [rank0]: Traceback", "0: [rank0]: RuntimeError"))
    ]
    doc.write_lines(CYCLE0, kept)


SIXTH = {
    "the faulted rank's record stamped before the fault": (
        KILL_RUN,
        _record_before_fault("rank_pid"),
    ),
    "the raiser's record stamped before the fault": (
        EXCEPTION_RUN,
        _record_before_fault("rank_pid"),
    ),
    "the other node's record stamped before the fault": (
        TWO_LAUNCHERS,
        _record_before_fault("peer"),
    ),
    "a closing signal to a pid no rank printed": (KILL_RUN, _closing_to("4444")),
    "a closing signal to the raiser after its record": (EXCEPTION_RUN, _closing_to("raiser")),
    "the other node's record of a pid no rank printed": (TWO_LAUNCHERS, _peer_record_pid),
    "two ranks started as one pid": (KILL_RUN, _peer_started_as_the_faulted_rank),
    "the raiser's traceback in its peer's stream": (
        EXCEPTION_RUN,
        _raiser_traceback_in_the_peers_stream,
    ),
    "the raiser's aborted line naming another exception": (
        EXCEPTION_RUN,
        _raiser_aborted_on_another_exception,
    ),
    "the raiser's injector line naming another pid": (
        EXCEPTION_RUN,
        _raiser_injector_line_of_another_pid,
    ),
    "a line of rank 2 in a world of 2": (KILL_RUN, _a_rank_beyond_the_world),
    "a tie's peer traceback without frames": (
        "windows/cpu-tie/ref-kill-step",
        _a_frameless_peer_traceback,
    ),
}


@pytest.mark.parametrize("attack", sorted(SIXTH))
def test_a_sixth_attack_fails(tmp_path: Path, attack: str) -> None:
    name, edit = SIXTH[attack]
    doc = copy_run(DATA / name, tmp_path / "run")
    edit(doc)
    j = judge_run_dir(doc.root)
    v = j.verdict("replaced_cycle")
    assert not j.passed and not v.passed, (attack, v.reason)


def test_another_ranks_end_stamped_after_the_fault_may_stand_above_the_fire_line(
    tmp_path: Path,
) -> None:
    """Ranks' lines reach the log as they arrive (two launchers here): rank 0's aborted line,
    stamped after the fault, one line above rank 1's fire line, is no end before the fault."""
    doc = copy_run(DATA / TWO_LAUNCHERS, tmp_path / "run")
    lines = doc.lines(CYCLE0)
    fire = lines.index(_fire_line(lines))
    aborted = next(i for i, x in enumerate(lines) if " rank 0 aborted RuntimeError" in x)
    assert aborted > fire
    lines.insert(fire, lines.pop(aborted))
    doc.write_lines(CYCLE0, lines)
    judgement = judge_run_dir(doc.root)
    failed = [v.render() for v in judgement.verdicts if not v.passed]
    assert failed == [], failed
