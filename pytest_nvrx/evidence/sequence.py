"""The iteration sequence of one cycle: what a process that trains step by step may print.

A process restored from the checkpoint of iteration R trains R+1, R+2, ...; a fresh one trains
1, 2, .... What its log prints of them, per printing rank, is therefore fixed by the workload's
print rule, and anything else is a contradiction: iterations that were never trained (a
counter restored too high, a gap), a rewind, or one iteration printed twice (with different
values two trainings of it, with equal ones a line that is not what it says).

What the stacks legitimately do, read in their source (Megatron core_v0.19.0):

* ``training_log`` prints at every multiple of ``--log-interval`` and at the process's first
  iteration (``megatron/training/training.py:2816``: ``iteration % args.log_interval == 0 or
  is_first_iteration``), on one rank (``print_rank_last``);
* ``--iterations-to-skip`` iterations advance the counter without a training step and without a
  line (``training.py:3798-3803``), so the next line may jump past them;
* an fp16 iteration skipped for an inf/nan gradient still advances the counter and is printed
  (``number of skipped iterations`` counts it: ``training.py:2598-2607``): no gap;
* the rerun state machine (``--rerun-mode``) re-runs forward/backward *inside* one
  ``train_step`` (``training.py:2358``): one iteration, one line; a rerun that asks to exit
  ends the process, and its replacement restores a checkpoint: a new cycle, judged on its own.

The CPU reference workload prints every iteration on rank 0 (``log_interval`` 1).

Pure functions over parsed events: nothing here reads files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pytest_nvrx.evidence.cycle_log import ITERATIONS_KEPT, CycleLog
from pytest_nvrx.evidence.refs import EvidenceRef, split_rank_prefix
from pytest_nvrx.evidence.workload import IterationCommitted


@dataclass(frozen=True, slots=True)
class PrintRule:
    """Which iterations a process prints: its first, then every multiple of ``log_interval``
    that is not among ``skipped`` (``--iterations-to-skip``)."""

    log_interval: int = 1
    skipped: frozenset[int] = frozenset()
    # where the rule came from, for verdicts
    basis: str = "every iteration is printed"
    # the iterations the run trains, and where that is said (every line's ``N/M`` prints M)
    train_iters: int | None = None
    train_iters_source: str = ""
    # samples consumed per iteration when fixed (no batch-size ramp-up): iteration i has
    # consumed i x this many; None when it varies or is unknown
    samples_per_iteration: int | None = None
    samples_source: str = ""

    def first_after(self, restored: int) -> int:
        """The first iteration a process restored at ``restored`` trains and prints."""
        it = restored + 1
        while it in self.skipped:
            it += 1
        return it

    def next_after(self, printed: int) -> int:
        """The next iteration printed after ``printed``."""
        interval = max(1, self.log_interval)
        it = (printed // interval + 1) * interval
        while it in self.skipped:
            it += interval
        return it


@dataclass(frozen=True, slots=True)
class SequenceBreak:
    """One way a cycle's printed iterations contradict training step by step."""

    cycle: int
    rank: int | None
    text: str
    refs: tuple[EvidenceRef, ...]


def rank_of(event: IterationCommitted) -> int | None:
    return split_rank_prefix(event.ref.text)[0]


def _runs(log: CycleLog) -> list[Sequence[IterationCommitted]]:
    """The kept iteration lines in stretches without a gap the parser made: a log of more than
    2 x ITERATIONS_KEPT iteration lines keeps its first and last ITERATIONS_KEPT only."""
    its = log.iterations
    if log.iterations_not_kept > 0 and len(its) > ITERATIONS_KEPT:
        return [its[:ITERATIONS_KEPT], its[ITERATIONS_KEPT:]]
    return [its]


def sequence_breaks(log: CycleLog, restored: int | None, rule: PrintRule) -> list[SequenceBreak]:
    """Every rank's printed iterations in ``log`` against the process that restored ``restored``
    (None or 0: a fresh start at iteration 1) and printed by ``rule``: the first one, each next
    one, no repeat, no rewind. At most one break per rank (the first: later lines follow from
    it)."""
    start = restored or 0
    out: list[SequenceBreak] = []
    by_rank: dict[int | None, list[list[IterationCommitted]]] = {}
    for stretch in _runs(log):
        groups: dict[int | None, list[IterationCommitted]] = {}
        for event in stretch:
            groups.setdefault(rank_of(event), []).append(event)
        for rank, events in groups.items():
            by_rank.setdefault(rank, []).append(events)
    for rank, stretches in by_rank.items():
        found = _first_break(log.cycle, rank, stretches, start, rule)
        if found is not None:
            out.append(found)
    return out


def _first_break(
    cycle: int,
    rank: int | None,
    stretches: Iterable[list[IterationCommitted]],
    start: int,
    rule: PrintRule,
) -> SequenceBreak | None:
    who = f"cycle {cycle}" + (f" rank {rank}" if rank is not None else "")
    seen: dict[int, IterationCommitted] = {}
    prev: IterationCommitted | None = None
    for index, events in enumerate(stretches):
        for event in events:
            it = event.iteration
            twice = seen.get(it)
            if twice is not None:
                same = twice.values == event.values
                return SequenceBreak(
                    cycle,
                    rank,
                    f"{who} printed iteration {it} twice"
                    + (
                        " (the same values: a line that is not what it says)"
                        if same
                        else f" with different values ({_difference(twice, event)}): two"
                        " trainings of one iteration"
                    ),
                    (twice.ref, event.ref),
                )
            wrong = _wrong_counts(who, event, rule)
            if wrong is not None:
                return SequenceBreak(cycle, rank, wrong, (event.ref,))
            if prev is None:
                if index == 0:
                    want = rule.first_after(start)
                    if it != want:
                        what = f"restored iteration {start}" if start else "a fresh start"
                        trained = (
                            f"iterations {want}..{it - 1} were never trained"
                            if it > want
                            else f"iteration {it} was already in the restored checkpoint"
                        )
                        return SequenceBreak(
                            cycle,
                            rank,
                            f"{who} resumed at iteration {it} after {what}: the first"
                            f" iteration after it is {want}; {trained}",
                            (event.ref,),
                        )
            elif index > 0 and event is events[0]:
                # across the parser's gap only the order can be checked
                if it <= prev.iteration:
                    return _rewind(cycle, rank, who, prev, event)
            else:
                want = rule.next_after(prev.iteration)
                if it < prev.iteration:
                    return _rewind(cycle, rank, who, prev, event)
                if it != want:
                    return SequenceBreak(
                        cycle,
                        rank,
                        f"{who} printed iteration {it} after {prev.iteration}: the next line is"
                        f" {want} ({rule.basis}); iterations {want}..{it - 1} are missing",
                        (prev.ref, event.ref),
                    )
            seen[it] = event
            prev = event
    return None


def _wrong_counts(who: str, event: IterationCommitted, rule: PrintRule) -> str | None:
    """The line's ``N/M`` and consumed samples against the run's iteration count and fixed
    batch: every line of a run prints the same M, and iteration i has consumed i x batch."""
    it = event.iteration
    if rule.train_iters is not None and event.total is not None and event.total != rule.train_iters:
        return (
            f"{who} printed iteration {it}/{event.total}, but the run trains {rule.train_iters}"
            f" iterations ({rule.train_iters_source})"
        )
    per, consumed = rule.samples_per_iteration, event.consumed_samples
    if per is not None and consumed is not None and consumed != it * per:
        return (
            f"{who} printed {consumed} consumed samples at iteration {it}; with"
            f" {per} samples an iteration ({rule.samples_source}) it has consumed {it * per}:"
            " the data position is not the iteration's"
        )
    return None


def _rewind(
    cycle: int,
    rank: int | None,
    who: str,
    prev: IterationCommitted,
    event: IterationCommitted,
) -> SequenceBreak:
    return SequenceBreak(
        cycle,
        rank,
        f"{who} printed iteration {event.iteration} after {prev.iteration}: the iteration"
        " count went backwards within one process",
        (prev.ref, event.ref),
    )


def _difference(a: IterationCommitted, b: IterationCommitted) -> str:
    first = dict(a.values)
    for name, text in b.values:
        if first.get(name) != text:
            return f"{name.replace('_', ' ')} {first.get(name, 'absent')} vs {text}"
    return "the values printed differ"
