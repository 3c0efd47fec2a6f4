"""The checkpoint directory and its tracker against the saves the logs show: a cross-check that
makes a run "cannot judge" where they contradict each other.

Both workloads write ``latest_checkpointed_iteration.txt`` in a save's finalization and print
the finalization line (Megatron's ``successfully saved checkpoint from iteration N``, the
reference workload's ``save completed iteration N``) after that write; a save's directory
``iter_N/`` is written only after iteration N was trained and its save scheduled; and one
process finalizes its async saves in the order it scheduled them (a failed save raises in its
finalization, ending the cycle). So, where the logs show saves:

* the tracker at the end is there and names an iteration: a run that finalized a save wrote
  it. ``release`` is no tracker of ours at all: neither workload writes a release checkpoint and
  a run never starts from one (run_dir.read_baseline refuses it). An empty tracker is a write
  cut short, which only a cycle that ended with a save in flight can leave;
* every ``iter_N/`` on disk is one a save of the run wrote: a save line (scheduled, finalized)
  names it, a cycle loaded it or a marker recorded it. A run that started from a checkpoint it
  did not write (a user's checkpoint directory) may hold an earlier run's: not checked there.

What the tracker names at the end against the finalized saves (a tracker naming a checkpoint
no line finalized) and a save scheduled and never finalized before a later one are durability
failures, not contradictions: evidence/durability.py.

Pure functions over parsed evidence: nothing here reads files.
"""

from __future__ import annotations

from pytest_nvrx.evidence.durability import tracker_readings
from pytest_nvrx.evidence.refs import EvidenceRef, Problem
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.workload import LoadCompleted, SaveCompleted, SaveScheduled


def checkpoint_problems(run: RunEvidence) -> tuple[Problem, ...]:
    """Fatal problems where the tracker, the checkpoint directories and the save lines
    contradict each other (see the module's docstring)."""
    return tuple(p for p in (_tracker_problem(run), _stray_dir_problem(run)) if p is not None)


def _last_finalized(run: RunEvidence) -> SaveCompleted | None:
    saves = [s for log in run.cycle_logs for s in log.of_type(SaveCompleted)]
    return saves[-1] if saves else None


def _write_cut_short(run: RunEvidence) -> bool:
    """Whether the run's tracker may hold a write cut short: a cycle, no earlier than the last
    one that finalized a save or read the tracker, ended with a save it scheduled and never
    finalized (its finalization, which writes the tracker, may have begun when the cycle was
    stopped). After a later reading or finalization the value was whole, and no save of ours
    writes the tracker outside a finalization."""
    told = [log.cycle for log in run.cycle_logs if log.of_type(SaveCompleted)]
    told += [cycle for cycle, _ in tracker_readings(run)]
    since = max(told, default=-1)
    for log in run.cycle_logs:
        if log.cycle < since:
            continue
        if log.saves_not_kept:
            return True
        done = {e.iteration for e in log.of_type(SaveCompleted)}
        if any(e.iteration not in done for e in log.of_type(SaveScheduled)):
            return True
    return False


def _tracker_problem(run: RunEvidence) -> Problem | None:
    tracker = run.tracker
    last = _last_finalized(run)
    if last is None or tracker.refused or tracker.junk or tracker.iteration is not None:
        return None
    said = (
        f"{last.ref.location} finalized checkpoint {last.iteration}, and the {run.workload}"
        " workload writes the tracker before it prints that line"
    )
    if tracker.release:
        return Problem(
            "fatal",
            f"{tracker.file} names a release checkpoint at the end, but no run of ours writes"
            f" one or starts from one, and {said}: the tracker is not the run's",
            tracker.ref,
        )
    if not tracker.exists:
        return Problem(
            "fatal",
            f"{tracker.file} is absent at the end, but {said}: the run's tracker is missing"
            " (pass --checkpoint-dir where its checkpoints were written elsewhere)",
            last.ref,
        )
    if _write_cut_short(run):
        return None  # a write a cycle's end cut short (rundir: a warning)
    return Problem(
        "fatal",
        f"{tracker.file} is empty at the end, but {said}: only a write cut short leaves it"
        " empty, and no cycle ended with a save in flight after the last line that names the"
        " tracker's value",
        tracker.ref,
    )


def _named_iterations(run: RunEvidence) -> set[int]:
    """Every iteration a save line, a load line or a marker names."""
    named: set[int] = set()
    for log in run.cycle_logs:
        for event in log.events:
            if isinstance(event, SaveScheduled | SaveCompleted | LoadCompleted):
                named.add(event.iteration)
    markers = [run.marker, *(m for _, m in run.later_markers)]
    for marker in markers:
        if marker is None:
            continue
        for value in (
            marker.in_flight_iteration,
            marker.tracker_iteration,
            marker.baseline_iteration,
            marker.load_iteration,
        ):
            if value is not None:
                named.add(value)
    if run.tracker.iteration is not None:
        named.add(run.tracker.iteration)  # durability.py judges a tracker naming no save
    return named


def _stray_dir_problem(run: RunEvidence) -> Problem | None:
    listed = run.checkpoint_dirs
    if not listed or not run.cycle_logs:
        return None
    first = run.cycle_logs[0]
    if first.of_type(LoadCompleted):
        return None  # it resumed a checkpoint directory it did not write: earlier runs' are there
    marker = run.marker
    if marker is not None and (marker.baseline_iteration or 0) > 0:
        return None
    if any(log.saves_not_kept for log in run.cycle_logs):
        return None  # the save lines of a huge log are not all kept: a missing one is unknown
    named = _named_iterations(run)
    stray = [n for n in listed if n not in named]
    if not stray:
        return None
    last = _last_finalized(run)
    dirs = ", ".join(f"iter_{n:07d}/" for n in stray[:3]) + (" ..." if len(stray) > 3 else "")
    return Problem(
        "fatal",
        f"{run.checkpoint_dir.name}/ holds {dirs}, which no save of the run wrote: no line"
        " scheduled, finalized or loaded it and no marker names it, and the run started from"
        " no checkpoint"
        + (f" (its last save finalized: {last.iteration}, {last.ref.location})" if last else ""),
        EvidenceRef(f"{run.checkpoint_dir.name}/iter_{stray[0]:07d}", None, "(on disk)"),
    )
