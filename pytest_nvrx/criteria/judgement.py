"""A whole judgement: every criterion over one :class:`JudgeContext`, plus what the report needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_nvrx.criteria.baseline import baseline_refusal
from pytest_nvrx.criteria.checkpoint_agreement import checkpoint_problems
from pytest_nvrx.criteria.clocks import clock_problems, timing_problems
from pytest_nvrx.criteria.consistency import evidence_problems
from pytest_nvrx.criteria.context import JudgeContext
from pytest_nvrx.criteria.expected import (
    ExpectedFault,
    ExpectedWindow,
    expected_fault,
    expected_window,
)
from pytest_nvrx.criteria.first_cause import FirstCause, run_timeout_cause
from pytest_nvrx.criteria.manifest_agreement import manifest_problems
from pytest_nvrx.criteria.marker_agreement import marker_problems, stray_markers
from pytest_nvrx.criteria.planted import plant_label_problems, planted_name
from pytest_nvrx.criteria.registry import CRITERIA
from pytest_nvrx.criteria.required_evidence import required_problems, unprinted_problems
from pytest_nvrx.criteria.schedule_recoveries import (
    run_ending,
    schedule_problems,
    schedule_verdicts,
)
from pytest_nvrx.criteria.verdict import CRITERIA_IDS, Verdict, failing
from pytest_nvrx.evidence.refs import EvidenceRef, Problem
from pytest_nvrx.evidence.rundir import RunEvidence, load_run
from pytest_nvrx.evidence.segments import (
    FaultRecovery,
    fault_recoveries,
    fault_segments,
    schedule_downtime_s,
)
from pytest_nvrx.evidence.timeline import RecoveryClock, recovery_clock
from pytest_nvrx.settings.plants import plant_named


@dataclass(frozen=True)
class Judgement:
    """All verdicts of one run, plus what the report needs (stack, timings, problems)."""

    run_dir: Path
    checkpoint_dir: Path
    expected: ExpectedFault
    verdicts: tuple[Verdict, ...]
    problems: tuple[Problem, ...]
    # verify's timings: the recovery clock's; a fault schedule's run's only the whole run's
    # (RUN_TIMINGS), its recoveries' are each fault's (``recoveries``): no figure of one fault
    # stands for the run's
    timings: dict[str, float]
    stack: dict[str, Any]
    # the recovery's instants (``timings`` are this clock's): the downtime gate and the report
    # read it, never a second computation
    clock: RecoveryClock = field(compare=False, repr=False)
    # training_continuity's references and tolerance
    baseline_dir: Path | None = None
    continuity_rtol: float = 0.0
    # the fault window asked for (None when the run and the caller name none)
    window: ExpectedWindow | None = None
    # what the workers died of when they failed before the fault; it leads every failing reason
    first_cause: FirstCause | None = None
    # why the baseline given was not compared with (criteria/baseline.py; a note says it too);
    # None: none was given, or it was used
    baseline_refused: str | None = None
    # the runs that held one of this run's GPUs while it ran (result.json), with that line;
    # None: not recorded. Its recovery timings include their memory reclaim and load
    gpu_shared_with: tuple[str, ...] | None = None
    gpu_shared_ref: EvidenceRef | None = None
    # the self-test's planted bug the run names (run.json's config.plant, else the marker's):
    # a planted run is never a qualification run, and every output says so first
    planted: str | None = None
    # a fault schedule's faults (FAULT@WINDOW, run.json's), judged fault by fault; () for a run
    # of one fault
    schedule: tuple[str, ...] = ()
    # a fault schedule's recoveries, one per fault that happened, each measured by its own
    # recovery clock (evidence/segments.py); () for a run of one fault
    recoveries: tuple[FaultRecovery, ...] = ()

    @property
    def total_downtime_s(self) -> float | None:
        """A schedule's total downtime (:func:`~pytest_nvrx.evidence.segments.
        schedule_downtime_s`); None for a run of one fault or where not measurable."""
        return schedule_downtime_s(self.recoveries) if self.schedule else None

    @property
    def recovery_count(self) -> int:
        """A schedule's recoveries that were due (the job was not stopped before them)."""
        return sum(r.due for r in self.recoveries)

    @property
    def gpu_shared(self) -> bool:
        return bool(self.gpu_shared_with)

    def sharing_note(self) -> str | None:
        """One line saying the timings were measured on a GPU other runs held; None if not."""
        if not self.gpu_shared_with:
            return None
        n = len(self.gpu_shared_with)
        where = f" ({self.gpu_shared_ref.location})" if self.gpu_shared_ref is not None else ""
        return (
            f"timings measured on a GPU shared with {n} other run{'' if n == 1 else 's'}{where}:"
            " NVRx waits for the whole GPU's memory to be reclaimed and the runs load each"
            " other, so the recovery timings are not this stack's alone"
        )

    def planted_note(self) -> str | None:
        """The line that leads a planted run's every output; None when nothing was planted."""
        if self.planted is None:
            return None
        try:
            title = plant_named(self.planted).title
        except KeyError:
            title = "a plant this version's catalogue does not know"
        return (
            f"planted: {self.planted} ({title}): a self-test run with a known recovery bug"
            " planted on purpose, never a qualification"
        )

    @property
    def judgeable(self) -> bool:
        """False when the artifacts are too broken to judge, or a criterion found the evidence
        it reads contradicting itself (verify exits 2)."""
        return not any(p.severity == "fatal" for p in self.problems) and not any(
            v.cannot_judge for v in self.verdicts
        )

    @property
    def unjudgeable_reasons(self) -> list[str]:
        """Why the run cannot be judged: each fatal problem, then each criterion that could
        not judge its evidence (with the line it could not judge)."""
        out = [p.message for p in self.problems if p.severity == "fatal"]
        out += [
            f"{v.id}: {v.reason} [{v.evidence[0].location}]"
            for v in self.verdicts
            if v.cannot_judge
        ]
        return out

    @property
    def passed(self) -> bool:
        return self.judgeable and all(v.passed for v in self.verdicts)

    def verdict(self, criterion: str) -> Verdict:
        for v in self.verdicts:
            if v.id == criterion:
                return v
        raise KeyError(f"unknown criterion {criterion!r}; known: {', '.join(CRITERIA_IDS)}")

    def as_dict(self) -> dict[str, Any]:
        # "planted" leads a planted run's document and is absent from every other (whose
        # documents stay as they were)
        planted = {"planted": self.planted} if self.planted is not None else {}
        return {
            **planted,
            "run_dir": str(self.run_dir),
            "checkpoint_dir": str(self.checkpoint_dir),
            "expected_fault": {"kind": self.expected.kind, "source": self.expected.source},
            "schedule": list(self.schedule),
            "expected_window": (
                {"window": self.window.window, "source": self.window.source}
                if self.window is not None and self.window.window is not None
                else None
            ),
            "first_cause": self.first_cause.as_dict() if self.first_cause is not None else None,
            "criteria": [v.as_dict() for v in self.verdicts],
            "passed": self.passed,
            "problems": [{"severity": p.severity, "message": p.message} for p in self.problems],
            "stack": self.stack,
            "timings": self.timings,
            # a fault schedule's every recovery, and its total; absent from a one-fault run's
            **(
                {
                    "recoveries": [r.as_dict() for r in self.recoveries],
                    "total_downtime_s": self.total_downtime_s,
                }
                if self.schedule
                else {}
            ),
            "gpu_shared_with": (
                list(self.gpu_shared_with) if self.gpu_shared_with is not None else None
            ),
            "continuity": {
                "baseline": str(self.baseline_dir) if self.baseline_dir is not None else None,
                "rtol": self.continuity_rtol,
            },
        }


def judge(
    run: RunEvidence,
    expect_fault: str | None = None,
    *,
    source: str = "caller",
    baseline: RunEvidence | None = None,
    continuity_rtol: float = 0.0,
    expect_window: str | None = None,
    window_source: str | None = None,
) -> Judgement:
    """Judge loaded evidence by every criterion (``expect_fault`` overrides run.json;
    ``source`` names where it came from in the report; ``baseline``, an uninterrupted run of the
    same configuration, and ``continuity_rtol`` are for training_continuity; ``expect_window``
    overrides run.json's fault window, ``window_source`` naming where it came from).

    A ``baseline`` that cannot be one (criteria/baseline.py: the run itself, a fault run, a run
    that did not finish, another configuration) is not compared with: training_continuity is
    judged by the replay alone and a note says why (``verify --baseline`` refuses it instead)."""
    notes: tuple[Problem, ...] = ()
    refused = baseline_refusal(run, baseline) if baseline is not None else None
    if baseline is not None and refused is not None:
        notes = (
            Problem(
                "warning",
                f"baseline {baseline.run_dir} not used by training_continuity: {refused}",
            ),
        )
        baseline = None
    ctx = JudgeContext.build(
        run,
        expected_fault(run, expect_fault, source),
        baseline=baseline,
        continuity_rtol=continuity_rtol,
        window=expected_window(run, expect_window, window_source or source),
    )
    clock = recovery_clock(run, ctx.timeline)
    timed = clock.timings()
    problems = (
        run.problems
        + evidence_problems(run)
        + clock_problems(run, ctx.timeline)
        + marker_problems(run, ctx.timeline)
        + required_problems(run)
        + checkpoint_problems(run)
        + unprinted_problems(run)
        + stray_markers(run)
        + plant_label_problems(run)
        + manifest_problems(run)
        + timing_problems(timed)
        + notes
    )
    schedule = run.manifest.schedule if run.manifest is not None else None
    scheduled = run.manifest.scheduled_faults if run.manifest is not None else ()
    segments = None
    ends: tuple[int, str | None] | None = None
    recoveries: tuple[FaultRecovery, ...] = ()
    if schedule is not None and scheduled:
        segments = fault_segments(run, scheduled)
        later = [p for s in segments[1:] for p in marker_problems(s.view, s.timeline)]
        later += schedule_problems(run, scheduled, segments)
        problems += tuple(p for p in dict.fromkeys(later) if p not in problems)
        ending = run_ending(run, scheduled)
        ends = (ending.due, ending.why() if ending.stopped else None)
        verdicts = schedule_verdicts(
            run,
            scheduled,
            schedule.ref,
            segments,
            baseline=baseline,
            continuity_rtol=continuity_rtol,
            ending=ending,
        )
        recoveries = fault_recoveries(
            segments, (ending.due, ending.why()) if ending.stopped else None
        )
        # the run's own timings only: each fault's are its recovery's
        timed = clock.run_timings()
    else:
        verdicts = tuple(CRITERIA[cid](ctx) for cid in CRITERIA_IDS)
    fatal = [p for p in problems if p.severity == "fatal"]
    if fatal:
        verdicts = tuple(_unjudgeable(v, fatal[0]) for v in verdicts)
    cause = ctx.first_cause
    if cause is None or cause.never:
        # our run timeout stopped a run whose workers had not failed by themselves: that
        # leads, with what it cut short (a fault that "never happened" may just have been late)
        cause = run_timeout_cause(run, ctx.timeline, ctx.expected, segments, ends) or cause
    if cause is not None and not fatal and all(v.passed for v in verdicts):
        # a cause says the run failed short of what every verdict found it did: one side reads
        # evidence that is not what it says, and no outcome can be printed beside the other
        contradiction = Problem(
            "fatal",
            f"{cause.text}, yet every criterion holds: the evidence contradicts itself",
            cause.ref,
        )
        problems += (contradiction,)
        verdicts = tuple(_unjudgeable(v, contradiction) for v in verdicts)
    elif cause is not None:
        # the derived failures ("the fault never happened") follow from it: it leads each reason
        verdicts = tuple(cause.lead(v) for v in verdicts)
    shared = run.manifest.gpu_shared_with if run.manifest is not None else None
    planted = planted_name(run)
    return Judgement(
        run_dir=run.run_dir,
        checkpoint_dir=run.checkpoint_dir,
        expected=ctx.expected,
        verdicts=verdicts,
        problems=problems,
        timings=timed,
        stack=run.stack(),
        clock=clock,
        baseline_dir=baseline.run_dir if baseline is not None else None,
        continuity_rtol=continuity_rtol,
        window=ctx.window,
        first_cause=cause,
        baseline_refused=refused,
        gpu_shared_with=shared.value if shared is not None else None,
        gpu_shared_ref=shared.ref if shared is not None else None,
        planted=planted,
        schedule=tuple(str(e) for e in scheduled),
        recoveries=recoveries,
    )


def _unjudgeable(verdict: Verdict, problem: Problem) -> Verdict:
    """A verdict that would pass on evidence the run cannot be judged by does not pass: the
    tracker a FIFO, a marker without timezone, ... (N/A and failing verdicts stay as they are)."""
    if not verdict.passed or verdict.not_applicable:
        return verdict
    return failing(
        verdict.id,
        f"cannot judge: {problem.message} (the rest of the evidence would pass)",
        problem.ref,
        verdict.evidence,
    )


def judge_run_dir(
    run_dir: Path,
    checkpoint_dir: Path | None = None,
    *,
    expect_fault: str | None = None,
    baseline: RunEvidence | Path | None = None,
    continuity_rtol: float = 0.0,
    expect_window: str | None = None,
) -> Judgement:
    """Load and judge a run directory (``baseline``: evidence or a run directory to load;
    ``expect_window``: the fault window, when run.json does not say). Raises RunDirError if a
    directory is not one."""
    base = (
        load_run(Path(baseline), read_checkpoints=False) if isinstance(baseline, Path) else baseline
    )
    return judge(
        load_run(Path(run_dir), checkpoint_dir),
        expect_fault,
        baseline=base,
        continuity_rtol=continuity_rtol,
        expect_window=expect_window,
    )
