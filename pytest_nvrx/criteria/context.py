"""One :class:`JudgeContext` per judgement: the evidence and what several criteria derive from it.

The timeline is built once here (it was rebuilt by every criterion); facts that more than one
criterion needs are computed on first use and then kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from pytest_nvrx.criteria.expected import (
    ExpectedFault,
    ExpectedWindow,
    expected_fault,
    expected_window,
)
from pytest_nvrx.criteria.first_cause import FirstCause, first_cause
from pytest_nvrx.criteria.helpers import launcher_outcome
from pytest_nvrx.criteria.windows import Fact, WindowFacts, window_facts
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.timeline import Timeline, build_timeline, saves_before_failure
from pytest_nvrx.evidence.workload import SaveCompleted, SaveScheduled


@dataclass(frozen=True, slots=True)
class RestoreTarget:
    """The iteration a replacement must restore, and the save that proves it was completed."""

    iteration: int | None
    save: SaveCompleted | None  # None: the iteration is the marker's tracker iteration, or unknown


# Nothing to restore against (a baseline that resumes an existing checkpoint).
NO_TARGET = RestoreTarget(None, None)


@dataclass(frozen=True)
class JudgeContext:
    """What every criterion of one judgement reads; build it with :meth:`build`."""

    run: RunEvidence
    expected: ExpectedFault
    timeline: Timeline
    # the fault the marker says happened (kill|hang), else the expected kind
    observed_fault: str
    # an uninterrupted run of the same configuration, for training_continuity (None: replay only)
    baseline: RunEvidence | None = None
    # relative tolerance of training_continuity's comparisons (0: exact)
    continuity_rtol: float = 0.0
    # the fault window asked for (run.json, the caller), or none
    window: ExpectedWindow | None = None
    # a fault schedule's recovery (criteria/schedule_recoveries.py) that a later fault cut short: it
    # need not reach the run's final iteration (False: the run's one recovery, or its last)
    cut_short: bool = False

    @classmethod
    def build(
        cls,
        run: RunEvidence,
        expected: ExpectedFault | None = None,
        *,
        baseline: RunEvidence | None = None,
        continuity_rtol: float = 0.0,
        window: ExpectedWindow | None = None,
        cut_short: bool = False,
    ) -> JudgeContext:
        exp = expected if expected is not None else expected_fault(run)
        win = window if window is not None else expected_window(run)
        marker = run.marker
        observed = marker.fault if marker is not None and marker.ok and marker.fault else exp.kind
        if not (continuity_rtol >= 0.0 and continuity_rtol < 1.0):  # also rejects nan
            raise ValueError(f"continuity rtol {continuity_rtol!r}: need 0 <= rtol < 1")
        return cls(
            run, exp, build_timeline(run), observed, baseline, continuity_rtol, win, cut_short
        )

    @cached_property
    def completed_before_failure(self) -> tuple[SaveCompleted, ...]:
        return tuple(saves_before_failure(self.run, self.timeline, SaveCompleted))

    @cached_property
    def scheduled_before_failure(self) -> tuple[SaveScheduled, ...]:
        return tuple(saves_before_failure(self.run, self.timeline, SaveScheduled))

    @cached_property
    def windows(self) -> WindowFacts | Fact | None:
        """The fault window's facts (criteria/windows.py); a Fact when a requested window cannot
        be judged; None for a baseline or a run without windows."""
        if self.expected.baseline:
            return None
        return window_facts(self.run, self.window or expected_window(self.run), self.timeline)

    @property
    def window_facts(self) -> WindowFacts | None:
        facts = self.windows
        return facts if isinstance(facts, WindowFacts) else None

    @cached_property
    def restore_target(self) -> RestoreTarget:
        """The newest save completed before the failure, never the save in flight at the
        fault; else the marker's tracker iteration.

        "Before the failure" is before the launcher's detection (completed_before_failure), not
        before the fault: the ranks that live on may finalize a save whose every part was
        written before the fault (its finalization all-reduce already passed) — rank 0 after a
        kill of rank 1, or the faulted rank itself after a fault it outlives
        (layout.RANK_OUTLIVES_FAULT: exception, ckpt-worker), 13 ms after its checkpoint worker
        died on one H200 (tests/data/gpu-one). The save the marker says was in flight (N) is
        never a target: a finalization of N after the fault is the tracker ahead of durability,
        which prior_checkpoint fails (criteria/windows.py).
        """
        facts = self.window_facts
        in_flight = facts.in_flight if facts is not None else None
        done = [e for e in self.completed_before_failure if e.iteration != in_flight]
        newest = max(done, key=lambda e: e.iteration, default=None)
        if newest is not None:
            return RestoreTarget(newest.iteration, newest)
        marker = self.run.marker
        if marker is not None and marker.ok:
            return RestoreTarget(marker.tracker_iteration, None)
        return NO_TARGET

    @cached_property
    def replacement_log(self) -> CycleLog | None:
        """The application log of the replacement cycle (None: no replacement, or no log)."""
        cycle = self.timeline.replacement_cycle
        return self.run.cycle_log(cycle) if cycle is not None else None

    @cached_property
    def first_cause(self) -> FirstCause | None:
        """What the workers died of when they failed before any fault was injected
        (criteria/first_cause.py); None when the first failure is the fault's or there is none."""
        window = (self.window or expected_window(self.run)).window
        return first_cause(self.run, self.timeline, self.expected, window=window)

    @cached_property
    def launcher_outcome(self) -> EvidenceRef:
        return launcher_outcome(self.run)
