"""Durability order: the tracker names a checkpoint only once that checkpoint is finalized.

A submitted async save is not a checkpoint; Megatron writes ``latest_checkpointed_iteration.txt``
in the save's finalization and prints ``successfully saved checkpoint from iteration N`` right
after (``megatron/training/checkpointing.py:1011-1014``, core_v0.19.0), on rank 0's training
thread. The injector's tracker observer (rank 0, every run: ``checkpoint tracker reads N at T
(probe)``) reads the tracker at that same thread's section and submit probes, so on a correct
stack every value it reads has been finalized by a line printed at or before the reading. What
it checks, over every save of every cycle (not only a fault's window):

* a value read during a cycle was finalized (a ``save completed`` line of it, in that cycle or
  an earlier one) no later than the reading;
* the value found at a cycle's start was finalized by an earlier cycle, or is the checkpoint the
  cycle loaded (a run resuming a checkpoint it did not write);
* the readings of one cycle never go back, and a cycle finalizes a save only after it
  scheduled it (where it logs submits), and every save it scheduled before a later one it
  finalized (:func:`unfinalized_breaks`);
* the tracker at the end names a checkpoint the logs show finalized or loaded, and, where the
  checkpoint directory still lists checkpoints, one that is on disk.

Pure functions over parsed evidence: nothing here reads files.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from pytest_nvrx.evidence.checkpoint import OptimizerState
from pytest_nvrx.evidence.injector_log import InjectorLine
from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.workload import LoadCompleted, SaveCompleted, SaveScheduled

#: The finalization line and the reading are both taken on rank 0's training thread, the line
#: first; the reference workload prints milliseconds, the reading microseconds.
READ_AFTER_FINALIZED_SLACK = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class DurabilityBreak:
    """One tracker value that was not (yet) a finalized checkpoint where it was read."""

    iteration: int
    text: str
    refs: tuple[EvidenceRef, ...]


def tracker_readings(run: RunEvidence) -> list[tuple[int, InjectorLine]]:
    """Every tracker reading of the observer, with its cycle, in log order."""
    return [
        (log.cycle, line)
        for log in run.cycle_logs
        for line in log.injector
        if line.kind == "tracker" and line.tracker_iteration is not None
    ]


def _finalized_and_loaded(
    run: RunEvidence,
) -> tuple[dict[int, list[tuple[int, SaveCompleted]]], dict[int, set[int]]]:
    """The finalization lines by iteration (with their cycle), the loaded iterations by cycle."""
    completed: dict[int, list[tuple[int, SaveCompleted]]] = {}
    loaded: dict[int, set[int]] = {}
    for log in run.cycle_logs:
        for save in log.of_type(SaveCompleted):
            completed.setdefault(save.iteration, []).append((log.cycle, save))
        for load in log.of_type(LoadCompleted):
            loaded.setdefault(log.cycle, set()).add(load.iteration)
    return completed, loaded


def end_of_run_break(run: RunEvidence) -> DurabilityBreak | None:
    """The tracker at the end names no checkpoint the logs finalized or loaded, or one not on
    disk while other checkpoints are."""
    return _end_of_run(run, *_finalized_and_loaded(run))


def reading_breaks(run: RunEvidence) -> list[DurabilityBreak]:
    """The observer's tracker readings that name a checkpoint not finalized by then."""
    completed, loaded = _finalized_and_loaded(run)
    out: list[DurabilityBreak] = _out_of_order(run)
    highest: dict[int, InjectorLine] = {}
    for cycle, reading in tracker_readings(run):
        top = highest.get(cycle)
        if (
            top is not None
            and top.tracker_iteration is not None
            and (reading.tracker_iteration or 0) < top.tracker_iteration
        ):
            out.append(
                DurabilityBreak(
                    reading.tracker_iteration or 0,
                    f"rank {reading.rank} read the tracker naming {reading.tracker_iteration} at"
                    f" {_clock_of(reading)} in cycle {cycle}, after reading"
                    f" {top.tracker_iteration} at {_clock_of(top)}: the tracker went backwards",
                    (reading.ref, top.ref),
                )
            )
            continue
        highest[cycle] = reading
        n = reading.tracker_iteration
        assert n is not None
        saves = completed.get(n, [])
        if reading.trigger == "start":
            if any(c < cycle for c, _ in saves) or n in loaded.get(cycle, set()):
                continue
            out.append(
                DurabilityBreak(
                    n,
                    f"at the start of cycle {cycle} the tracker named {n}, which no earlier cycle"
                    " finalized and this cycle did not load",
                    (reading.ref,),
                )
            )
            continue
        when = reading.time
        done = [
            s
            for c, s in saves
            if c < cycle
            or (
                c == cycle
                and (when is None or s.time is None or s.time <= when + READ_AFTER_FINALIZED_SLACK)
            )
        ]
        if done:
            continue
        later = [s for c, s in saves if c >= cycle]
        what = (
            f"its finalization line came only at {_clock(later[0])}"
            if later
            else "no line of the run finalized it"
        )
        out.append(
            DurabilityBreak(
                n,
                f"rank {reading.rank} read the tracker naming {n} at {_clock_of(reading)}"
                f" ({reading.trigger}) in cycle {cycle}, but {what}: the tracker named a"
                " checkpoint before it was durable",
                (reading.ref, *(s.ref for s in later[:1])),
            )
        )
    return out


def _out_of_order(run: RunEvidence) -> list[DurabilityBreak]:
    """A cycle that finalized checkpoint N before it scheduled N: the finalization of a save
    comes after its submit (where the cycle logs submits at all and dropped none of them)."""
    out: list[DurabilityBreak] = []
    for log in run.cycle_logs:
        scheduled = log.of_type(SaveScheduled)
        if not scheduled or log.saves_not_kept:
            continue
        first_scheduled: dict[int, SaveScheduled] = {}
        for event in scheduled:
            first_scheduled.setdefault(event.iteration, event)
        for done in log.of_type(SaveCompleted):
            submit = first_scheduled.get(done.iteration)
            early = submit is not None and (
                (done.ref.line or 0) < (submit.ref.line or 0)
                or (done.time is not None and submit.time is not None and done.time < submit.time)
            )
            if early and submit is not None:
                out.append(
                    DurabilityBreak(
                        done.iteration,
                        f"cycle {log.cycle} finalized checkpoint {done.iteration}"
                        f" ({done.ref.location}) before it scheduled that save"
                        f" ({submit.ref.location}): a save is finalized after its submit",
                        (done.ref, submit.ref),
                    )
                )
                break
    return out


def unfinalized_breaks(run: RunEvidence) -> list[DurabilityBreak]:
    """A cycle that scheduled the save of N and never finalized it, yet finalized a later save:
    one process finalizes its async saves in the order it scheduled them, and a save that fails
    raises in its finalization, ending the cycle; so the save of N was lost without a word (or
    the line that says it was finalized is missing). The first such save of each cycle."""
    out: list[DurabilityBreak] = []
    for log in run.cycle_logs:
        if log.saves_not_kept:
            continue
        done = {s.iteration: s for s in log.of_type(SaveCompleted)}
        if not done:
            continue
        top = max(done)
        for scheduled in log.of_type(SaveScheduled):
            n = scheduled.iteration
            if n in done or n >= top:
                continue
            out.append(
                DurabilityBreak(
                    n,
                    f"cycle {log.cycle} scheduled the save of {n} ({scheduled.ref.location}) and"
                    f" never finalized it, yet finalized the later save of {top}"
                    f" ({done[top].ref.location}): a process finalizes its saves in the order"
                    " it scheduled them, and a failed one ends the cycle",
                    (scheduled.ref, done[top].ref),
                )
            )
            break
    return out


def _end_of_run(
    run: RunEvidence,
    completed: dict[int, list[tuple[int, SaveCompleted]]],
    loaded: dict[int, set[int]],
) -> DurabilityBreak | None:
    tracker = run.tracker
    n = tracker.iteration
    if n is None or tracker.ref is None:
        return None
    if n not in completed and not any(n in its for its in loaded.values()):
        if not run.cycle_logs:
            return None
        return DurabilityBreak(
            n,
            f"{tracker.file} names iteration {n} at the end, but no line of the run finalized"
            " or loaded a checkpoint of it",
            (tracker.ref,),
        )
    meta = run.checkpoint(n)
    if meta is not None and meta.state is OptimizerState.ABSENT_DIR and _lists_checkpoints(run):
        return DurabilityBreak(
            n,
            f"{tracker.file} names iteration {n} at the end, but {meta.dir}/ is not on disk"
            " while other checkpoints are",
            (tracker.ref, meta.ref),
        )
    return None


def _lists_checkpoints(run: RunEvidence) -> bool:
    return any(m.state is not OptimizerState.ABSENT_DIR for m in run.checkpoints)


def _clock(save: SaveCompleted) -> str:
    return save.time.strftime("%H:%M:%S.%f")[:-3] if save.time is not None else "an unknown time"


def _clock_of(line: InjectorLine) -> str:
    return line.time.strftime("%H:%M:%S.%f")[:-3] if line.time is not None else "an unknown time"
