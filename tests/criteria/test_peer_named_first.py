"""torch elastic names one failure of a poll, the earliest by a stamp in whole seconds: when the
faulted rank (killed by its own signal) and the peer whose collective broke on its death both
die before the launcher's poll, the launcher names local rank 0 (seen in ./check runs under
load: reference kill@save and segv@step on rank 1, rank 0 exit 1 of gloo's "Connection closed by
peer"). Doctored copies of committed real runs, rewritten as such a run's launcher log and rank
0's traceback read: the rank's death is shown by its marker and the peer's broken collective;
without that traceback, for a fault the rank could outlive (term), or a traceback of another
rank, the launcher's record still contradicts the marker."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome
from tests.helpers.doctor import Doctor, copy_run

DATA = Path(__file__).parents[1] / "data" / "windows" / "cpu"
# run: the faulted rank's pid (rank 1), its peer's (rank 0), the faulted rank's exit code
RUNS = {
    "ref-kill-save": (539, 538, -9),
    "ref-segv-step": (2609, 2608, -11),
    "ref-term-finalize": (2446, 2445, -15),
}
LAUNCHER = "logs/launcher.log"
CYCLE0 = "logs/train_cycle0.log"


def _traceback(rank: int) -> tuple[str, ...]:
    p = f"{rank}: [rank{rank}]: "
    return (
        f"{p}Traceback (most recent call last):\n",
        f'{p}  File "/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py",'
        " line 4181, in all_reduce\n",
        f"{p}    work.wait()\n",
        f"{p}RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561]"
        " Connection closed by peer [127.0.0.1]:29932. This is typically caused by a remote worker"
        " crashing. Check the logs of the remote worker for the root cause.\n",
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
        doc.insert_after(CYCLE0, "marker ", *_traceback(traceback_of))
    return doc


@pytest.mark.parametrize("name", ["ref-kill-save", "ref-segv-step"])
def test_a_peer_named_in_the_faulted_ranks_place_is_its_death_when_the_peer_says_so(
    tmp_path: Path, name: str
) -> None:
    doc = _peer_named(tmp_path, name, traceback_of=0)
    j = judge_run_dir(doc.root)
    assert j.passed, run_outcome(j).summary
    reason = j.verdict("replaced_cycle").reason
    assert "the launcher named local_rank 0 (exit 1) instead" in reason, reason
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
