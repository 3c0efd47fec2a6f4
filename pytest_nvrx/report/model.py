"""One scenario's report as plain data: verdicts, recovery cost, timeline and loss, from a run dir.

Nothing here judges: :meth:`ScenarioReport.from_run_dir` loads and judges a run directory with
the code path ``verify`` uses (:func:`~pytest_nvrx.evidence.rundir.load_run` then
:func:`~pytest_nvrx.criteria.judge`), and derives what a person wants to *see* from the evidence
already parsed. A report is JSON-able both ways (:meth:`ScenarioReport.as_dict`,
:meth:`ScenarioReport.from_dict`) so that an xdist worker can ship it to the controller as plain
data. Times are seconds from the scenario's ``t0`` (the launcher's first line, else run.json's
start), so that a report carries no time zone questions.

The recovery's cost is :mod:`~pytest_nvrx.report.recovery`'s, the timeline
:mod:`~pytest_nvrx.report.timeline_data`'s and the loss curve :mod:`~pytest_nvrx.report.loss`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_nvrx.criteria import judge
from pytest_nvrx.criteria.judgement import Judgement
from pytest_nvrx.criteria.outcome import Outcome, cause_in, outcome_text, run_outcome
from pytest_nvrx.criteria.selftest_outcome import PlantOutcome, control_outcome, plant_outcome
from pytest_nvrx.criteria.training_continuity import print_model
from pytest_nvrx.evidence.manifest import Manifest
from pytest_nvrx.evidence.plant_records import read_plant_records
from pytest_nvrx.evidence.rundir import RunEvidence, load_run
from pytest_nvrx.evidence.timeline import PHASES as PHASES  # re-exported: the report's phases
from pytest_nvrx.report.loss import LossSeries, loss_series
from pytest_nvrx.report.plain import flat_dict, start_time
from pytest_nvrx.report.recovery import Recovery, fault_recovery_of, recovery_of
from pytest_nvrx.report.timeline_data import TimelineData, timeline_data
from pytest_nvrx.settings.plants import Plant, plant_named
from pytest_nvrx.settings.values import quote

#: the scenario document's version: raised only when a change breaks existing readers
SCHEMA_VERSION = 2  # 2: termination ends when the workers stopped; gpu_reclaim follows


# ----------------------------------------------------------------------------------------------
# The scenario


@dataclass(frozen=True, slots=True)
class CriterionResult:
    id: str
    status: str  # PASS | FAIL | N/A
    reason: str
    evidence: tuple[str, ...]  # "file:line: quoted text"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CriterionResult:
        return cls(data["id"], data["status"], data["reason"], tuple(data["evidence"]))


@dataclass(frozen=True, slots=True)
class ScenarioReport:
    """What the report shows of one scenario; plain data, JSON-able both ways."""

    name: str
    run_dir: str
    workload: str | None
    fault: str  # the expected fault kind ("none": a baseline)
    window: str | None
    train_iters: int | None
    passed: bool
    judgeable: bool
    summary: str
    first_cause: str | None
    #: why it did not qualify (criteria/outcome.py's cause: the one the console, verify and
    #: JUnit name too); None: nothing failed
    cause: str | None
    criteria: tuple[CriterionResult, ...]
    problems: tuple[str, ...]
    stack: dict[str, Any]
    timings: dict[str, float]
    # None: a baseline, or no fault time to measure from; a fault schedule's first recovery
    recovery: Recovery | None
    timeline: TimelineData
    loss: LossSeries
    #: the limits the run was held to (--nvrx-max-downtime, --nvrx-max-phase), and why it
    #: broke them
    max_downtime_s: float | None = None
    max_phases: dict[str, float] | None = None
    gate: str | None = None
    #: the runs that held one of this run's GPUs while it ran (result.json; None: not
    #: recorded): its recovery timings include theirs
    gpu_shared_with: tuple[str, ...] | None = None
    #: the self-test's planted bug the run names (never a qualification run; every line about
    #: it starts with "planted: <name>")
    planted: str | None = None
    #: a self-test run's row (pytest_nvrx.criteria.selftest_outcome.PlantOutcome.as_dict, plus the
    #: tolerance it was judged at): was its plant caught, by what; None: not a self-test run
    selftest: dict[str, Any] | None = None
    #: a fault schedule's faults (FAULT@WINDOW), its every recovery, one per fault that
    #: happened, and its total downtime; (), () and None for a run of one fault
    schedule: tuple[str, ...] = ()
    recoveries: tuple[Recovery, ...] = ()
    total_downtime_s: float | None = None
    #: the ranks run.json says the run launched (config.world_size; None: not recorded): a run
    #: whose rank printed nothing still launched them
    world_size: int | None = None

    @property
    def baseline(self) -> bool:
        return self.fault == "none"

    @property
    def outcome(self) -> str:
        """``QUALIFIED`` or ``NOT QUALIFIED: <cause>``, after ``planted: <name>: `` in a planted
        run, which is never QUALIFIED (:func:`~pytest_nvrx.criteria.outcome.outcome_text`)."""
        return outcome_text(self.cause, self.planted)

    @property
    def downtime_s(self) -> float | None:
        """The recovery's downtime; a fault schedule's total (every recovery's)."""
        if self.schedule:
            return self.total_downtime_s
        return self.recovery.downtime_s if self.recovery is not None else None

    @property
    def recovery_count(self) -> int:
        """A schedule's recoveries that were due (not after the fault that stopped the job)."""
        return sum(r.outcome != "stopped" for r in self.recoveries)

    def downtime_text(self) -> str | None:
        """``downtime 12.9 s``; a schedule's ``downtime 15.9 s in total over 2 recoveries``."""
        if self.downtime_s is None:
            return None
        if not self.schedule:
            return f"downtime {self.downtime_s:.1f} s"
        n = self.recovery_count
        return f"downtime {self.downtime_s:.1f} s in total over {n} recover" + (
            "y" if n == 1 else "ies"
        )

    @property
    def fault_recoveries(self) -> tuple[Recovery, ...]:
        """Every recovery to show: a schedule's, one per fault, else the run's one (if any)."""
        if self.recoveries:
            return self.recoveries
        return (self.recovery,) if self.recovery is not None else ()

    @property
    def fault_text(self) -> str:
        """The fault as the matrix names it: ``kill (step)``, a schedule's every fault."""
        if self.schedule:
            return ", ".join(self.schedule)
        return self.fault + (f" ({self.window})" if self.window else "")

    def held_to(
        self,
        outcome: Outcome,
        failure: str | None,
        *,
        max_downtime_s: float | None = None,
        max_phases: dict[str, float] | None = None,
    ) -> ScenarioReport:
        """This report under time limits: ``failure`` is why the run broke them (None: it kept
        to them), ``outcome`` the run's outcome held to them
        (:func:`~pytest_nvrx.criteria.outcome.run_outcome`)."""
        return replace(
            self,
            max_downtime_s=max_downtime_s,
            max_phases=max_phases,
            gate=failure,
            cause=outcome.cause,
            passed=outcome.cause is None,
        )

    @classmethod
    def from_run_dir(
        cls,
        run_dir: Path | str,
        *,
        name: str | None = None,
        checkpoint_dir: Path | None = None,
        expect_fault: str | None = None,
        expect_window: str | None = None,
        baseline: Path | None = None,
        continuity_rtol: float = 0.0,
    ) -> ScenarioReport:
        """Load and judge ``run_dir`` as ``verify`` does, then build its report. Raises
        :class:`~pytest_nvrx.evidence.rundir.RunDirError` if it is not a directory."""
        run = load_run(Path(run_dir), checkpoint_dir)
        base = load_run(Path(baseline), read_checkpoints=False) if baseline is not None else None
        judgement = judge(
            run,
            expect_fault,
            source="caller",
            baseline=base,
            continuity_rtol=continuity_rtol,
            expect_window=expect_window,
        )
        return cls.from_judgement(run, judgement, name=name)

    @classmethod
    def from_judgement(
        cls,
        run: RunEvidence,
        judgement: Judgement,
        *,
        name: str | None = None,
        launch_error: str | None = None,
    ) -> ScenarioReport:
        """The report of a run already judged (the plugin has both at hand): its recovery is
        the judgement's recovery clock (:func:`~pytest_nvrx.evidence.timeline.recovery_clock`);
        ``launch_error``: why its launch did not end by itself (None: it did, or it was not
        launched here)."""
        clock = judgement.clock
        outcome = run_outcome(judgement, launch_error=launch_error)
        t0 = start_time(run)
        manifest = run.manifest
        train_iters = None
        if manifest is not None and manifest.train_iters is not None:
            train_iters = int(manifest.train_iters.value)
        if train_iters is None:
            train_iters = next(
                (
                    log.last_iteration.total
                    for log in run.cycle_logs
                    if log.last_iteration and log.last_iteration.total
                ),
                None,
            )
        window = judgement.window.window if judgement.window is not None else None
        recoveries = tuple(fault_recovery_of(run, r, t0) for r in judgement.recoveries)
        if judgement.schedule:
            recovery = recoveries[0] if recoveries else None
        else:
            recovery = None if judgement.expected.baseline else recovery_of(run, clock, t0)
        return cls(
            name=name or run.run_dir.name,
            run_dir=str(run.run_dir),
            workload=run.workload,
            fault=str(judgement.expected.kind),
            window=window,
            train_iters=train_iters,
            passed=outcome.cause is None,
            judgeable=judgement.judgeable,
            summary=outcome.summary,
            first_cause=judgement.first_cause.text if judgement.first_cause is not None else None,
            cause=outcome.cause,
            criteria=tuple(
                CriterionResult(v.id, v.status, v.reason, tuple(ref.render() for ref in v.evidence))
                for v in judgement.verdicts
            ),
            problems=tuple(f"{p.severity}: {p.message}" for p in judgement.problems),
            stack=dict(judgement.stack),
            timings=dict(judgement.timings),
            recovery=recovery,
            timeline=timeline_data(run, clock.timeline, t0, recovery, judgement.recoveries),
            loss=loss_series(run.cycle_logs, print_model(run)),
            gpu_shared_with=judgement.gpu_shared_with,
            planted=judgement.planted,
            selftest=_selftest_row(run, judgement, launch_error),
            schedule=judgement.schedule,
            recoveries=recoveries,
            total_downtime_s=judgement.total_downtime_s,
            world_size=_world_size(manifest),
        )

    def as_dict(self) -> dict[str, Any]:
        # a planted run's document starts with its plant; "planted" and "selftest" are absent
        # from the documents of every other run (which stay as they were)
        planted = {"planted": self.planted} if self.planted is not None else {}
        selftest = {"selftest": self.selftest} if self.selftest is not None else {}
        return {
            **planted,
            "name": self.name,
            "run_dir": self.run_dir,
            "workload": self.workload,
            "fault": self.fault,
            "window": self.window,
            # a schedule's every fault; absent from a one-fault run's document (as it was)
            **({"schedule": list(self.schedule)} if self.schedule else {}),
            "train_iters": self.train_iters,
            # absent where run.json does not say it (a document as it was before it)
            **({"world_size": self.world_size} if self.world_size is not None else {}),
            "passed": self.passed,
            "judgeable": self.judgeable,
            "summary": self.summary,
            "outcome": self.outcome,
            "first_cause": self.first_cause,
            "criteria": [flat_dict(c) for c in self.criteria],
            "problems": list(self.problems),
            "stack": self.stack,
            "timings": self.timings,
            "downtime_s": self.downtime_s,
            "max_downtime_s": self.max_downtime_s,
            "max_phases": self.max_phases,
            "gate": self.gate,
            "gpu_shared_with": (
                list(self.gpu_shared_with) if self.gpu_shared_with is not None else None
            ),
            "recovery": self.recovery.as_dict() if self.recovery is not None else None,
            **(
                {
                    "recoveries": [r.as_dict() for r in self.recoveries],
                    "total_downtime_s": self.total_downtime_s,
                }
                if self.schedule
                else {}
            ),
            "timeline": self.timeline.as_dict(),
            "loss": self.loss.as_dict(),
            **selftest,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScenarioReport:
        """The report a document holds; ValueError where its ``outcome`` and ``passed``
        disagree (a qualified outcome that did not pass, or the reverse)."""
        recovery = data["recovery"]
        # the document keeps the cause in its outcome line, once
        cause = cause_in(data["outcome"], data.get("planted"))
        if (cause is None) is not data["passed"]:
            outcome, passed = quote(data["outcome"]), str(data["passed"]).lower()
            raise ValueError(
                f"'passed' is {passed}, yet 'outcome' is {outcome}: the scenario contradicts itself"
            )
        return cls(
            name=data["name"],
            run_dir=data["run_dir"],
            workload=data["workload"],
            fault=data["fault"],
            window=data["window"],
            train_iters=data["train_iters"],
            passed=data["passed"],
            judgeable=data["judgeable"],
            summary=data["summary"],
            first_cause=data["first_cause"],
            cause=cause,
            criteria=tuple(CriterionResult.from_dict(c) for c in data["criteria"]),
            problems=tuple(data["problems"]),
            stack=dict(data["stack"]),
            timings={k: float(v) for k, v in data["timings"].items()},
            recovery=Recovery.from_dict(recovery) if recovery is not None else None,
            timeline=TimelineData.from_dict(data["timeline"]),
            loss=LossSeries.from_dict(data["loss"]),
            max_downtime_s=data.get("max_downtime_s"),
            max_phases=data.get("max_phases"),
            gate=data.get("gate"),
            gpu_shared_with=(
                tuple(data["gpu_shared_with"]) if data.get("gpu_shared_with") is not None else None
            ),
            planted=data.get("planted"),
            selftest=data.get("selftest"),
            # a document written before schedules' recoveries has none of these
            schedule=tuple(data.get("schedule") or ()),
            recoveries=tuple(Recovery.from_dict(r) for r in data.get("recoveries") or ()),
            total_downtime_s=data.get("total_downtime_s"),
            world_size=data.get("world_size"),
        )


# ----------------------------------------------------------------------------------------------
# Building


def _world_size(manifest: Manifest | None) -> int | None:
    """run.json's world size, where it states a whole number of ranks."""
    setting = manifest.world_size if manifest is not None else None
    value = setting.value if setting is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _selftest_row(
    run: RunEvidence, judgement: Judgement, launch_error: str | None
) -> dict[str, Any] | None:
    """A self-test run's outcome (run.json's ``config.selftest``, or a plant named): the control
    qualified or not, a plant caught, missed or not applied (its ``plant-records/``), judged at
    the tolerance ``judgement`` was; None for every other run."""
    manifest = run.manifest
    selftest = manifest is not None and manifest.is_selftest
    if not selftest and judgement.planted is None:
        return None
    rtol = judgement.continuity_rtol
    if judgement.planted is None:
        outcome = control_outcome(judgement, launch_error=launch_error)
    else:
        try:
            plant = plant_named(judgement.planted)
        except KeyError as exc:
            plant = Plant(judgement.planted, "not in this version's catalogue", str(exc), "")
            reason = "; ".join(judgement.unjudgeable_reasons) or str(exc.args[0])
            outcome = PlantOutcome(plant, "cannot-judge", reason, judgement.run_dir)
        else:
            records = read_plant_records(run.run_dir)
            outcome = plant_outcome(plant, judgement, records, rtol=rtol)
    return {**outcome.as_dict(), "continuity_rtol": rtol}
