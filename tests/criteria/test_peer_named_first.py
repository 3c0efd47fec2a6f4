"""torch elastic names one failure of a poll, the earliest by a stamp in whole seconds: when the
faulted rank (killed by its own signal) and the peer whose collective broke on its death both
die before the launcher's poll, the launcher names local rank 0 (seen in ./check runs under
load: reference kill@save and segv@step on rank 1, rank 0 exit 1 of gloo's "Connection closed by
peer"). Doctored copies of committed real runs, rewritten as such a run's launcher log and rank
0's traceback read: the rank's death is shown by its marker and the peer's broken collective;
without that traceback, for a fault the rank could outlive (term), or a traceback of another
rank, the launcher's record still contradicts the marker.

The real ties (tests/data/windows/cpu-tie, made with the launcher's poll every 4 s) show the
other message gloo gives for a peer gone, "Read error [addr]: Connection reset by peer". Each
edit of ATTACKS makes one piece of a real tie disagree (the classes a helper's attack on the
first version of the rule passed): every edited copy fails, on the piece it edited."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome
from tests.helpers.doctor import Doctor, copy_run

DATA = Path(__file__).parents[1] / "data" / "windows" / "cpu"
TIES = Path(__file__).parents[1] / "data" / "windows" / "cpu-tie"
REAL_TIES = ("ref-kill-step", "ref-kill-save", "ref-segv-step")
RESET = "Connection reset by peer"
# run: the faulted rank's pid (rank 1), its peer's (rank 0), the faulted rank's exit code
RUNS = {
    "ref-kill-save": (539, 538, -9),
    "ref-segv-step": (2609, 2608, -11),
    "ref-term-finalize": (2446, 2445, -15),
}
LAUNCHER = "logs/launcher.log"
CYCLE0 = "logs/train_cycle0.log"


GLOO_CLOSED = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561]"
    " Connection closed by peer [127.0.0.1]:29932. This is typically caused by a remote worker"
    " crashing. Check the logs of the remote worker for the root cause."
)


def _traceback(rank: int, stamp: str) -> tuple[str, ...]:
    """What the reference prints when its collective breaks: its own ``aborted`` word, stamped,
    then the traceback it re-raises."""
    p = f"{rank}: [rank{rank}]: "
    return (
        f"{rank}: [ref] {stamp} rank {rank} aborted {GLOO_CLOSED}\n",
        f"{p}Traceback (most recent call last):\n",
        f'{p}  File "/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py",'
        " line 4181, in all_reduce\n",
        f"{p}    work.wait()\n",
        f"{p}{GLOO_CLOSED}\n",
    )


def _peer_named(tmp_path: Path, name: str, *, traceback_of: int | None) -> Doctor:
    faulted, peer, code = RUNS[name]
    doc = copy_run(DATA / name, tmp_path / name)
    doc.replace(
        LAUNCHER,
        f"failed (exitcode: {code}) local_rank: 1 (pid: {faulted})",
        f"failed (exitcode: 1) local_rank: 0 (pid: {peer})",
    )
    doc.delete(LAUNCHER, f"Sending process {peer} closing signal")
    if traceback_of is not None:
        # 20 ms after the fault, before the launcher's record (56 and 67 ms after it)
        when = datetime.fromisoformat(doc.json("fault_injected.json")["time"])
        stamp = (when + timedelta(milliseconds=20)).isoformat(timespec="milliseconds")
        block = _traceback(traceback_of, stamp)
        at = doc.insert_after(CYCLE0, "marker ", *block)
        # the rank that raised prints nothing after its traceback
        lines = doc.lines(CYCLE0)
        end = at - 1 + len(block)
        prefix = f"{traceback_of}: "
        tail = [line for line in lines[end:] if not line.startswith(prefix)]
        doc.write_lines(CYCLE0, lines[:end] + tail)
    return doc


@pytest.mark.parametrize("name", ["ref-kill-save", "ref-segv-step"])
def test_a_peer_named_in_the_faulted_ranks_place_is_its_death_when_the_peer_says_so(
    tmp_path: Path, name: str
) -> None:
    doc = _peer_named(tmp_path, name, traceback_of=0)
    j = judge_run_dir(doc.root)
    assert j.passed, run_outcome(j).summary
    reason = j.verdict("replaced_cycle").reason
    assert "failed, named as local_rank 0 (exit 1) in its place" in reason, reason
    assert "torch elastic names the lowest local rank" in reason, reason


@pytest.mark.parametrize(
    ("name", "traceback_of"),
    [
        ("ref-kill-save", None),
        ("ref-segv-step", None),
        ("ref-segv-step", 1),
        ("ref-term-finalize", 0),
    ],
)
def test_without_the_peers_broken_collective_the_record_contradicts_the_marker(
    tmp_path: Path, name: str, traceback_of: int | None
) -> None:
    """No traceback, the faulted rank's own traceback, or a SIGTERM the rank could outlive."""
    doc = _peer_named(tmp_path, name, traceback_of=traceback_of)
    j = judge_run_dir(doc.root)
    assert not j.passed
    v = j.verdict("replaced_cycle")
    assert not v.passed
    assert "the launcher recorded the failure of local_rank 0" in v.reason, v.reason


@pytest.mark.parametrize("name", REAL_TIES)
def test_a_real_tie_passes_on_the_peers_connection_reset(name: str) -> None:
    """Real runs: rank 1 killed by its own SIGKILL/SIGSEGV, rank 0's all_reduce failed with
    gloo's ECONNRESET and exited 1 in the same launcher poll; torch elastic named local rank 0."""
    j = judge_run_dir(TIES / name)
    launcher = (TIES / name / LAUNCHER).read_text()
    assert "failed (exitcode: 1) local_rank: 0" in launcher
    assert "local_rank: 1 (pid" not in launcher
    assert j.passed, run_outcome(j).summary
    reason = j.verdict("replaced_cycle").reason
    assert "failed, named as local_rank 0 (exit 1) in its place" in reason, reason
    quoted = [
        e for e in j.verdict("replaced_cycle").evidence if e.file == CYCLE0 and RESET in e.text
    ]
    assert quoted and quoted[0].text.startswith("0: "), j.verdict("replaced_cycle").evidence


@pytest.mark.parametrize("name", REAL_TIES)
def test_a_real_tie_without_the_peers_broken_collective_fails(tmp_path: Path, name: str) -> None:
    """The same run with rank 0's connection error gone: nothing shows the named rank died of
    its peer, so the record naming it contradicts the marker."""
    doc = copy_run(TIES / name, tmp_path / name)
    assert doc.delete(CYCLE0, RESET)
    j = judge_run_dir(doc.root)
    v = j.verdict("replaced_cycle")
    assert not v.passed
    assert "the launcher recorded the failure of local_rank 0" in v.reason, v.reason


@pytest.mark.parametrize("name", REAL_TIES)
def test_a_real_tie_with_the_reset_on_the_faulted_ranks_lines_fails(
    tmp_path: Path, name: str
) -> None:
    """The connection error moved to rank 1's prefix: the faulted rank's own line is no proof
    that the named peer died of the vanished peer."""
    doc = copy_run(TIES / name, tmp_path / name)
    lines = doc.lines(CYCLE0)
    moved = [
        "1: " + line[3:].replace("[rank0]", "[rank1]") if RESET in line else line for line in lines
    ]
    assert moved != lines
    doc.write_lines(CYCLE0, moved)
    j = judge_run_dir(doc.root)
    assert not j.verdict("replaced_cycle").passed


def _agent(doc: Doctor) -> str:
    """The pid of the launcher that wrote the run's first failure record (its glog line's)."""
    return next(x for x in doc.lines(LAUNCHER) if "failed (exitcode:" in x).split(" ")[2]


def _pids(doc: Doctor) -> tuple[int, int]:
    """The faulted rank's pid (its marker's) and the named peer's (the launcher's record)."""
    record = next(
        line for line in doc.lines(LAUNCHER) if "failed (exitcode: 1) local_rank: 0" in line
    )
    return int(doc.json("fault_injected.json")["rank_pid"]), int(
        record.split("(pid: ")[1].split(")")[0]
    )


def _reset_lines(doc: Doctor) -> list[str]:
    return [line for line in doc.lines(CYCLE0) if RESET in line]


def _fire(doc: Doctor) -> str:
    return next(line for line in doc.lines(CYCLE0) if line.startswith("1: ") and "marker " in line)


def _traceback_block(doc: Doctor) -> list[str]:
    """Rank 0's traceback, from its head to its broken collective's exception line."""
    lines = doc.lines(CYCLE0)
    end = max(i for i, line in enumerate(lines) if RESET in line)
    head = max(i for i in range(end) if "Traceback (most recent call last)" in lines[i])
    return lines[head : end + 1]


def _own_traceback(doc: Doctor) -> None:
    block = [line.replace("0: [rank0]", "1: [rank1]") for line in _traceback_block(doc)]
    doc.insert_after(CYCLE0, _fire(doc), *block)


def _closing(pid_of: int) -> object:
    def edit(doc: Doctor) -> None:
        pid = _pids(doc)[pid_of]
        doc.insert_after(
            LAUNCHER,
            "failed (exitcode: 1) local_rank: 0",
            f"W1205 15:22:04.556000 {_agent(doc)} torch/distributed/elastic/multiprocessing"
            "/api.py:1028]"
            f" Sending process {pid} closing signal SIGTERM",
        )

    return edit


def _reset_before_fire(doc: Doctor) -> None:
    moved = _reset_lines(doc)
    doc.delete(CYCLE0, RESET)
    doc.insert_before(CYCLE0, _fire(doc), *moved)


def _mixed_tag(doc: Doctor) -> None:
    doc.replace(CYCLE0, "0: [rank0]: RuntimeError", "0: [rank1]: RuntimeError")
    doc.delete(CYCLE0, "aborted RuntimeError")


def _oom_first(doc: Doctor) -> None:
    block = _traceback_block(doc)
    oom = "0: [rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    doc.insert_before(CYCLE0, _fire(doc), *block[:-1], oom)


def _record(old: str, new: str) -> object:
    def edit(doc: Doctor) -> None:
        doc.replace(LAUNCHER, old, new)

    return edit


def _named_pid(pid_of: int | None) -> object:
    def edit(doc: Doctor) -> None:
        faulted, peer = _pids(doc)
        pid = 99999 if pid_of is None else (faulted, peer)[pid_of]
        doc.replace(LAUNCHER, f"local_rank: 0 (pid: {peer})", f"local_rank: 0 (pid: {pid})")

    return edit


def _went_on(doc: Doctor) -> None:
    iteration = next(
        line
        for line in doc.lines(CYCLE0)
        if line.startswith("0: [ref]") and " iteration 3/" in line
    )
    doc.append(CYCLE0, iteration)


def _append_traceback(prefix: str, exception: str) -> object:
    """A second traceback of rank 0's stream (``prefix``) after its broken collective."""

    def edit(doc: Doctor) -> None:
        doc.append(
            CYCLE0,
            f"{prefix}Traceback (most recent call last):",
            f'{prefix}  File "/x/pytest_nvrx/workloads/ref_checkpoints.py", line 88, in save',
            f"{prefix}    torch.save(state, path)",
            f"{prefix}{exception}",
        )

    return edit


def _exception_line(new: str) -> object:
    """Rank 0's traceback ends in another exception than its ``aborted`` line says."""

    def edit(doc: Doctor) -> None:
        lines = doc.lines(CYCLE0)
        at = max(i for i, line in enumerate(lines) if RESET in line)
        lines[at] = f"0: [rank0]: {new}\n"
        doc.write_lines(CYCLE0, lines)

    return edit


def _said(text: str) -> object:
    """Both the ``aborted`` line and the exception line say ``text``, which holds gloo's words."""

    def edit(doc: Doctor) -> None:
        lines = doc.lines(CYCLE0)
        for i, line in enumerate(lines):
            if RESET in line:
                head = line[: line.index("RuntimeError: ")]
                lines[i] = head + text + "\n"
        doc.write_lines(CYCLE0, lines)

    return edit


def _fault_time(doc: Doctor) -> datetime:
    return datetime.fromisoformat(doc.json("fault_injected.json")["time"])


def _aborted_at(seconds: float) -> object:
    """Rank 0's ``aborted`` line stamped ``seconds`` from the fault (its place in the log kept)."""

    def edit(doc: Doctor) -> None:
        when = _fault_time(doc) + timedelta(seconds=seconds)
        stamp = when.isoformat(timespec="milliseconds")
        lines = doc.lines(CYCLE0)
        for i, line in enumerate(lines):
            if " aborted RuntimeError" in line:
                old = line.split(" ")[2]
                lines[i] = line.replace(old, stamp, 1)
        doc.write_lines(CYCLE0, lines)

    return edit


def _record_at_fault(doc: Doctor) -> None:
    """The record stamped 1 ms after the fault, before rank 0's ``aborted`` line."""
    when = (_fault_time(doc) + timedelta(milliseconds=1)).strftime("%H:%M:%S.%f")
    lines = doc.lines(LAUNCHER)
    for i, line in enumerate(lines):
        if "failed (exitcode: 1) local_rank: 0" in line:
            lines[i] = line[:6] + when + line[21:]
    doc.write_lines(LAUNCHER, lines)


def _started_pid(rank: int, pid_of: int | None, *, copy: bool = False) -> object:
    """Rank ``rank``'s start line naming another pid (the peer's, the faulted rank's, or 77777),
    or a second start line of it with 77777."""

    def edit(doc: Doctor) -> None:
        faulted, peer = _pids(doc)
        own = (peer, faulted)[rank]
        pid = 77777 if pid_of is None else (faulted, peer)[pid_of]
        line = next(x for x in doc.lines(CYCLE0) if f"rank {rank} started pid {own} " in x)
        if copy:
            doc.insert_after(CYCLE0, line, line.replace(f"pid {own} ", f"pid {pid} "))
        else:
            doc.replace(CYCLE0, f"started pid {own} ", f"started pid {pid} ")

    return edit


def _pid_everywhere_but_injector(doc: Doctor) -> None:
    """The record and rank 0's start line say 77777; its injector lines keep its real pid."""
    _, peer = _pids(doc)
    doc.replace(CYCLE0, f"started pid {peer} ", "started pid 77777 ")
    doc.replace(LAUNCHER, f"(pid: {peer})", "(pid: 77777)")


def _closing_before(pid_of: int) -> object:
    def edit(doc: Doctor) -> None:
        pid = _pids(doc)[pid_of]
        doc.insert_before(
            LAUNCHER,
            "failed (exitcode: 1) local_rank: 0",
            f"W1205 15:22:04.554000 {_agent(doc)} torch/distributed/elastic/multiprocessing"
            "/api.py:1028]"
            f" Sending process {pid} closing signal SIGTERM",
        )

    return edit


def _second_record(code: int, pid_of: int | None) -> object:
    def edit(doc: Doctor) -> None:
        record = next(x for x in doc.lines(LAUNCHER) if "failed (exitcode: 1) local_rank: 0" in x)
        _, peer = _pids(doc)
        pid = 55555 if pid_of is None else peer
        again = record.replace("(exitcode: 1)", f"(exitcode: {code})").replace(
            f"(pid: {peer})", f"(pid: {pid})"
        )
        doc.insert_after(LAUNCHER, record, again)

    return edit


def _before_aborted(line: str) -> object:
    """A line of rank 0 (``{stamp}`` its ``aborted`` line's stamp) between the fire line and its
    broken collective."""

    def edit(doc: Doctor) -> None:
        aborted = next(x for x in doc.lines(CYCLE0) if " rank 0 aborted RuntimeError" in x)
        doc.insert_before(CYCLE0, aborted, line.format(stamp=aborted.split(" ")[2]))

    return edit


def _other_raised(doc: Doctor) -> None:
    """Rank 0's traceback ends in gloo's other wording; its ``aborted`` line, which names the
    exception the workload re-raises, keeps the one it printed."""
    final = _reset_lines(doc)[-1]
    assert final.startswith("0: [rank0]: RuntimeError: ")
    doc.replace(CYCLE0, final, f"0: [rank0]: {GLOO_CLOSED}\n")


def _own_record_too(doc: Doctor) -> None:
    faulted, peer = _pids(doc)
    code = -11 if "SIGSEGV" in _fire(doc) else -9
    record = next(x for x in doc.lines(LAUNCHER) if f"local_rank: 0 (pid: {peer})" in x)
    own = record.replace("(exitcode: 1) local_rank: 0", f"(exitcode: {code}) local_rank: 1")
    doc.insert_after(LAUNCHER, record, own.replace(f"(pid: {peer})", f"(pid: {faulted})"))


def _no_aborted(doc: Doctor) -> None:
    doc.delete(CYCLE0, " rank 0 aborted RuntimeError")


ATTACKS = {
    "faulted rank's own traceback after its fire line": _own_traceback,
    "closing signal to the faulted rank": _closing(0),
    "closing signal to the named peer": _closing(1),
    "peer's broken collective before the fire line": _reset_before_fire,
    "torch tag of another rank": _mixed_tag,
    "peer's own error before the fault": _oom_first,
    "named exit -9": _record("(exitcode: 1) local_rank: 0", "(exitcode: -9) local_rank: 0"),
    "named exit -15": _record("(exitcode: 1) local_rank: 0", "(exitcode: -15) local_rank: 0"),
    "named exit 2": _record("(exitcode: 1) local_rank: 0", "(exitcode: 2) local_rank: 0"),
    "named local_rank 2 of a 2-rank node": _record(
        "(exitcode: 1) local_rank: 0", "(exitcode: 1) local_rank: 2"
    ),
    "record naming the faulted rank's pid": _named_pid(0),
    "record naming a pid no rank printed": _named_pid(None),
    "peer training after its broken collective": _went_on,
    # a second helper's attack on the rule above (adv6)
    "peer's second traceback, another error": _append_traceback(
        "0: [rank0]: ", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    ),
    "peer's second traceback, the injected exception": _append_traceback(
        "0: [rank0]: ",
        "pytest_nvrx.worker.injector.InjectedFault: pytest-nvrx injected exception on rank 0",
    ),
    "a rank-1 traceback in rank 0's stream": _append_traceback("0: [rank1]: ", "ValueError: boom"),
    "traceback ending in another exception": _exception_line(
        "ValueError: checkpoint shard corrupt"
    ),
    "a socket error of Python's, not gloo's": _said(
        "ConnectionResetError: [Errno 104] Connection reset by peer"
    ),
    "gloo's words inside another error": _said(
        "ValueError: bad config value 'Connection reset by peer'"
    ),
    "an https upload's connection closed": _said(
        "RuntimeError: Connection closed by peer [10.0.0.9]:443 (https upload to s3)"
    ),
    "peer's aborted line stamped 5 s before the fault": _aborted_at(-5),
    "peer's aborted line stamped 30 s after the fault": _aborted_at(30),
    "record stamped before the peer's aborted line": _record_at_fault,
    "faulted rank's start line naming the peer's pid": _started_pid(1, 1),
    "faulted rank's start line naming 77777": _started_pid(1, None),
    "a second start line of the peer": _started_pid(0, None, copy=True),
    "record and start line agree, injector lines do not": _pid_everywhere_but_injector,
    "closing signal to the faulted rank before the record": _closing_before(0),
    "closing signal to the named peer before the record": _closing_before(1),
    "a second record of the peer, exit -9": _second_record(-9, 1),
    "a second record of local rank 0, another pid": _second_record(1, None),
    # a third attack (adv7)
    "the faulted rank's own record after the peer's": _own_record_too,
    "peer's load failing of a missing file before its broken collective": _before_aborted(
        "0: [ref] {stamp} rank 0 load failed: cannot read /x/iter_0000005:"
        " FileNotFoundError(2, 'No such file or directory')"
    ),
    "peer's clean exit before its broken collective": _before_aborted(
        "0: [ref] {stamp} rank 0 exit code 0"
    ),
    "peer's stamped aborted line gone": _no_aborted,
    # a fifth attack (adv9)
    "peer's exit line before its broken collective": _before_aborted(
        "0: [ref] {stamp} rank 0 exit code 1"
    ),
    "peer's traceback ending in another exception than its aborted line": _other_raised,
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("name", REAL_TIES)
def test_an_edited_real_tie_fails(tmp_path: Path, name: str, attack: str) -> None:
    """Each edit makes one piece of the tie disagree; the record naming rank 0 then contradicts
    the marker (or another criterion fails), and the run does not pass."""
    doc = copy_run(TIES / name, tmp_path / name)
    ATTACKS[attack](doc)  # type: ignore[operator]
    j = judge_run_dir(doc.root)
    assert not j.passed, (attack, run_outcome(j).summary)
    reason = j.verdict("replaced_cycle").reason
    assert not j.verdict("replaced_cycle").passed, (attack, reason)
    refused = "; not a peer named for two deaths in one poll: " in reason
    assert refused or "a second worker failure" in reason, (attack, reason)


# -- an exception fault whose peer's exit the launcher recorded first --

EXCEPTION_PEER = (
    Path(__file__).parents[1] / "data" / "cpu-schedules" / "ref-kill-step+exception-restore"
)
PEER_RECORD = "failed (exitcode: 1) local_rank: 0 (pid: 7923)"
CYCLE1 = "logs/train_cycle1.log"


def _peer_edit(old: str, new: str, rel: str = LAUNCHER) -> object:
    def edit(doc: Doctor) -> None:
        doc.replace(rel, old, new)

    return edit


def _peer_closing(doc: Doctor) -> None:
    doc.insert_after(
        LAUNCHER,
        PEER_RECORD,
        "W1202 14:49:40.586000 7730 torch/distributed/elastic/multiprocessing/api.py:1028]"
        " Sending process 7923 closing signal SIGTERM",
    )


def _peer_load_failed(raised: str) -> object:
    def edit(doc: Doctor) -> None:
        line = next(x for x in doc.lines(CYCLE1) if x.startswith("0: ") and " load failed: " in x)
        doc.replace(CYCLE1, line, line[: line.index(": RuntimeError(") + 2] + raised + "\n")

    return edit


def _peer_stamps(load: str, exit_: str) -> object:
    def edit(doc: Doctor) -> None:
        doc.replace(
            CYCLE1, "T14:49:36.715+00:00 rank 0 load failed", f"T{load}+00:00 rank 0 load failed"
        )
        doc.replace(
            CYCLE1, "T14:49:36.741+00:00 rank 0 exit code", f"T{exit_}+00:00 rank 0 exit code"
        )

    return edit


def _peer_second(record: str) -> object:
    def edit(doc: Doctor) -> None:
        doc.insert_after(
            LAUNCHER,
            PEER_RECORD,
            f"E1202 14:49:40.586000 7730 torch/distributed/elastic/multiprocessing/api.py:1002]"
            f" failed {record} of binary: /work/main/.venv/bin/python",
        )

    return edit


def _peer_quiet(doc: Doctor) -> None:
    doc.delete(CYCLE1, "0: [ref] 2026-12-02T14:49:36.715+00:00 rank 0 load failed")
    doc.delete(CYCLE1, "rank 0 exit code 1")


EXCEPTION_PEER_ATTACKS = {
    "a pid no rank printed": _peer_edit("(pid: 7923)", "(pid: 55555)"),
    "the faulted rank's pid": _peer_edit("local_rank: 0 (pid: 7923)", "local_rank: 0 (pid: 7924)"),
    "exit -9": _peer_edit("(exitcode: 1) local_rank: 0", "(exitcode: -9) local_rank: 0"),
    "exit 2": _peer_edit("(exitcode: 1) local_rank: 0", "(exitcode: 2) local_rank: 0"),
    "local_rank 5 of a 2-rank node": _peer_edit("local_rank: 0 (pid", "local_rank: 5 (pid"),
    "a closing signal to the peer": _peer_closing,
    "no error of the peer's own": _peer_quiet,
    "the peer's injector line naming another pid": _peer_edit(
        "rank 0 pid 7923: checkpoint tracker", "rank 0 pid 7999: checkpoint tracker", CYCLE1
    ),
    # a third attack (adv7)
    "the peer's load failing of a missing file": _peer_load_failed(
        "FileNotFoundError(2, 'No such file or directory')"
    ),
    "the peer's load failing of the injected exception on rank 0": _peer_load_failed(
        "InjectedFault('pytest-nvrx injected exception on rank 0 in window restore')"
    ),
    "only the peer's exit line after the fire line": _peer_edit(
        "0: [ref] 2026-12-02T14:49:36.715+00:00 rank 0 load failed",
        "0: [ref] 2026-12-02T14:49:36.715+00:00 rank 0 loaded failed",
        CYCLE1,
    ),
    "the peer's lines stamped before the fault": _peer_stamps("14:49:30.000", "14:49:30.010"),
    "the record stamped before the peer's error": _peer_edit(
        "E1202 14:49:40.585000", "E1202 14:49:36.710000"
    ),
    "the peer printing exit code 0": _peer_edit("rank 0 exit code 1", "rank 0 exit code 0", CYCLE1),
    "the peer printing exit code 2": _peer_edit("rank 0 exit code 1", "rank 0 exit code 2", CYCLE1),
    "a second record of the peer, exit -9": _peer_second(
        "(exitcode: -9) local_rank: 0 (pid: 7923)"
    ),
    "the raising rank's own record after the peer's": _peer_second(
        "(exitcode: 1) local_rank: 1 (pid: 7924)"
    ),
    "the raising rank printing exit code 0": _peer_edit(
        "rank 1 exit code 1", "rank 1 exit code 0", CYCLE1
    ),
}


def test_the_exception_faults_peer_recorded_first_passes() -> None:
    """The real run: rank 1 raised InjectedFault in its restore; rank 0's load failed on gloo's
    closed connection and both exited 1 in one poll; the launcher recorded rank 0's."""
    assert PEER_RECORD in (EXCEPTION_PEER / LAUNCHER).read_text()
    j = judge_run_dir(EXCEPTION_PEER)
    assert j.passed, run_outcome(j).summary
    assert "the launcher recorded local_rank 0's exit 1 first" in j.verdict("replaced_cycle").reason


@pytest.mark.parametrize("attack", sorted(EXCEPTION_PEER_ATTACKS))
def test_an_edited_exception_peer_record_fails(tmp_path: Path, attack: str) -> None:
    doc = copy_run(EXCEPTION_PEER, tmp_path / "run")
    EXCEPTION_PEER_ATTACKS[attack](doc)  # type: ignore[operator]
    j = judge_run_dir(doc.root)
    reason = j.verdict("replaced_cycle").reason
    assert not j.passed and not j.verdict("replaced_cycle").passed, (attack, reason)
    said = ("is not its peer failing with it: ", "a second worker failure", "yet printed its exit")
    assert any(text in reason for text in said), (attack, reason)


# -- a fault after which the job was rightly stopped: no replacement, but still its death --

SCHEDULES = Path(__file__).parents[1] / "data" / "cpu-schedules"
STOPPED = {
    # run: the stopping fault's record
    "ref-budget-kill-step+kill-restore+kill-restore": "(exitcode: -9) local_rank: 1 (pid: 17628)",
    "ref-no-progress-kill-step+3x-kill-restore": "(exitcode: -9) local_rank: 1 (pid: 20669)",
}


def _pid_in(record: str) -> str:
    """The pid a launcher record (``... (pid: P)``) names."""
    return record.split("(pid: ")[1].rstrip(")")


STOPPED_EDITS = {
    "local_rank 5 of a 2-rank node, exit -15": "(exitcode: -15) local_rank: 5 (pid: {pid})",
    "the peer named, exit 1, no broken collective": "(exitcode: 1) local_rank: 0 (pid: {pid})",
    "another pid": "(exitcode: -9) local_rank: 1 (pid: 55555)",
    "exit -15 for a kill": "(exitcode: -15) local_rank: 1 (pid: {pid})",
}


@pytest.mark.parametrize("edit", sorted(STOPPED_EDITS))
@pytest.mark.parametrize("name", sorted(STOPPED))
def test_the_stopping_faults_record_must_still_name_its_death(
    tmp_path: Path, name: str, edit: str
) -> None:
    """replaced_cycle is not applicable to the fault after which the launcher rightly stopped
    the job, but a record that does not show that fault's death fails it."""
    record = STOPPED[name]
    pid = _pid_in(record)
    assert judge_run_dir(SCHEDULES / name).passed
    doc = copy_run(SCHEDULES / name, tmp_path / "run")
    doc.replace(LAUNCHER, record, STOPPED_EDITS[edit].format(pid=pid))
    j = judge_run_dir(doc.root)
    v = j.verdict("replaced_cycle")
    assert not j.passed and not v.passed and not v.not_applicable, (edit, v.reason)


# -- what the launcher says after the faulted rank's own record (every kill and segv run) --

OWN_RECORDS = {
    # run: the faulted rank's own record (of the fault after which the job stopped in the
    # schedules)
    **{f"cpu-schedules/{name}": record for name, record in STOPPED.items()},
    "windows/cpu/ref-kill-save": "(exitcode: -9) local_rank: 1 (pid: 539)",
    "windows/cpu/ref-segv-step": "(exitcode: -11) local_rank: 1 (pid: 2609)",
}


def _after_own_record(record: str, what: str, agent: str) -> str:
    pid = _pid_in(record)
    glog = f"W1205 00:00:00.000000 {agent} torch/distributed/elastic/multiprocessing/api.py"
    if what == "closing":
        return f"{glog}:1028] Sending process {pid} closing signal SIGTERM"
    return f"{glog}:1002] failed (exitcode: 1) local_rank: 0 (pid: 55555) of binary: python"


@pytest.mark.parametrize("what", ["closing", "closing before", "second record"])
@pytest.mark.parametrize("name", sorted(OWN_RECORDS))
def test_a_launcher_line_after_the_faulted_ranks_own_record_that_denies_its_death_fails(
    tmp_path: Path, name: str, what: str
) -> None:
    """torch elastic signals only the workers still running, and records one failure before it
    stops the group: a closing signal to the pid the rank's own SIGKILL/SIGSEGV killed, or a
    second record before the workers restart, contradicts the record of its death."""
    record = OWN_RECORDS[name]
    doc = copy_run(DATA.parents[1] / name, tmp_path / "run")
    line = next(x for x in doc.lines(LAUNCHER) if record in x)
    stamp = line.split(" ")[1]
    added = _after_own_record(record, what.removesuffix(" before"), line.split(" ")[2])
    added = added.replace("00:00:00.000000", stamp)
    if what.endswith(" before"):  # the closing signal just before the record
        doc.insert_before(LAUNCHER, line, added)
    else:
        doc.insert_after(LAUNCHER, line, added)
    v = judge_run_dir(doc.root).verdict("replaced_cycle")
    assert not v.passed and not v.not_applicable, (what, v.reason)
    said = "closing signal" if what.startswith("closing") else "a second worker failure"
    assert said in v.reason, v.reason


# -- a rank's end printed before the fault fired (a fourth attack, adv8) --

ENDS_BEFORE = {
    # run: the cycle log the fault fired in
    "windows/cpu/ref-kill-save": CYCLE0,
    "windows/cpu/ref-segv-step": CYCLE0,
    "windows/cpu/ref-exception-step": CYCLE0,
    "windows/cpu-tie/ref-kill-step": CYCLE0,
    "cpu-schedules/ref-kill-step+exception-restore": CYCLE1,
}
END_LINES = {
    "the faulted rank's clean exit": "1: [ref] {stamp} rank 1 exit code 0",
    "the faulted rank's error": "1: [ref] {stamp} rank 1 aborted ValueError: corrupt batch",
    "the peer's clean exit": "0: [ref] {stamp} rank 0 exit code 0",
    "the peer's error": "0: [ref] {stamp} rank 0 aborted ValueError: corrupt batch",
}


@pytest.mark.parametrize("end", sorted(END_LINES))
@pytest.mark.parametrize("name", sorted(ENDS_BEFORE))
def test_a_ranks_end_before_the_fire_line_fails(tmp_path: Path, name: str, end: str) -> None:
    """Either rank printing its end (an error, a clean exit) before the fault fired: the failure
    the launcher recorded need not be the fault's."""
    rel = ENDS_BEFORE[name]
    doc = copy_run(DATA.parents[1] / name, tmp_path / "run")
    marker = "fault_injected_2.json" if rel == CYCLE1 else "fault_injected.json"
    when = datetime.fromisoformat(doc.json(marker)["time"]) - timedelta(seconds=1)
    fire = next(
        x for x in doc.lines(rel) if x.startswith("1: [pytest-nvrx injector]") and " written; " in x
    )
    stamp = when.isoformat(timespec="milliseconds")
    doc.insert_before(rel, fire, END_LINES[end].format(stamp=stamp))
    j = judge_run_dir(doc.root)
    v = j.verdict("replaced_cycle")
    assert not j.passed and not v.passed, (end, v.reason)
    assert "before the fault" in v.reason, v.reason


# -- what a process the faulted rank started prints under its prefix after it died --

#: a real GPU run's lines of rank 1's async checkpoint worker, printed after rank 1's SIGSEGV
#: fire line: its error lines and an unstamped traceback (gpu-faults/g2-segv-30, 1070-1112)
CHILD_LINES = Path(__file__).parents[1] / "data" / "gpu-faults" / "g2-segv-30" / CYCLE0


@pytest.mark.parametrize("name", REAL_TIES)
def test_a_tie_passes_with_the_faulted_ranks_child_printing_after_its_death(
    tmp_path: Path, name: str
) -> None:
    """The tie rule reads the faulted rank's own lines after its fire line, not the unstamped
    errors of processes it started (an async checkpoint worker) that print under its prefix."""
    lines = CHILD_LINES.read_text().splitlines(keepends=True)
    start = next(i for i, x in enumerate(lines) if "filesystem_async:Local worker 0" in x)
    end = next(i for i, x in enumerate(lines) if "ConnectionResetError: [Errno 104]" in x)
    child = lines[start : end + 1]
    assert all(x.startswith("1: ") for x in child) and len(child) > 40
    doc = copy_run(TIES / name, tmp_path / name)
    doc.insert_after(CYCLE0, _fire(doc), *child)
    j = judge_run_dir(doc.root)
    assert j.passed, [v.render() for v in j.verdicts if not v.passed]
