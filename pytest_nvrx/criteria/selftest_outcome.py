"""What one self-test run shows: was its planted bug caught, and by the criterion documented for it.
No pytest here, no launching: a judged run and its plant records in, an outcome out.

A plant is **caught** when its run is not qualified and the criterion the catalogue names for it
fails. A planted run that qualifies is **missed**: on this stack, at this tolerance, the criteria
would have passed a recovery with that bug. A planted run without a record of the plant acting
was **not applied** and proves nothing either way. The unplanted control must qualify, or the
self-test cannot tell a caught plant from a stack that fails anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pytest_nvrx.criteria.judgement import Judgement
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.evidence.plant_records import PlantRecords
from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.settings.plants import Plant

Status = Literal[
    "caught",  # not qualified, and the documented criterion failed
    "caught-elsewhere",  # not qualified, but not by the documented criterion
    "missed",  # qualified although planted
    "not-applied",  # no worker recorded planting it
    "cannot-plant",  # the checkout lacks a patch point (nothing launched)
    "skipped",  # the plant needs more ranks than the run has (nothing launched)
    "cannot-judge",  # the run's evidence cannot be judged
    "qualified",  # the control qualified
    "not-qualified",  # the control did not
]
#: Statuses that let the self-test pass.
GOOD: frozenset[Status] = frozenset({"caught", "skipped", "qualified"})
#: Statuses that are findings about the criteria (exit 1); any other bad one: cannot judge (2).
FINDINGS: frozenset[Status] = frozenset({"missed", "caught-elsewhere"})


@dataclass(frozen=True)
class PlantOutcome:
    """One row of the self-test: a plant (None: the control) and what its run showed."""

    plant: Plant | None
    status: Status
    reason: str
    run_dir: Path | None = None
    failed: tuple[str, ...] = ()  # the criteria that failed
    first_cause: str | None = None
    evidence: tuple[EvidenceRef, ...] = ()

    @property
    def name(self) -> str:
        return self.plant.name if self.plant is not None else "control"

    @property
    def good(self) -> bool:
        return self.status in GOOD

    def as_dict(self) -> dict[str, Any]:
        return {
            "plant": self.name,
            "title": self.plant.title if self.plant is not None else "no plant",
            "expected_criterion": self.plant.caught_by if self.plant is not None else None,
            "status": self.status,
            "reason": self.reason,
            "caught_by": list(self.failed),
            "first_cause": self.first_cause,
            "run_dir": str(self.run_dir) if self.run_dir is not None else None,
            "evidence": [ref.render() for ref in self.evidence],
        }


def _failed(judgement: Judgement) -> tuple[str, ...]:
    return tuple(v.id for v in judgement.verdicts if not v.passed)


def control_outcome(judgement: Judgement, *, launch_error: str | None = None) -> PlantOutcome:
    """The control's row: qualified or not by the run's outcome (criteria/outcome.py;
    ``launch_error``: why its launch did not end by itself, None where it did)."""
    failed = _failed(judgement)
    cause = judgement.first_cause.text if judgement.first_cause is not None else None
    outcome = run_outcome(judgement, launch_error=launch_error)
    if outcome.kind == "cannot-judge":
        reason = "; ".join(judgement.unjudgeable_reasons) or "cannot judge"
        return PlantOutcome(None, "cannot-judge", reason, judgement.run_dir, failed, cause)
    if outcome.qualified:
        return PlantOutcome(None, "qualified", "the unplanted control qualified", judgement.run_dir)
    why = outcome.summary if outcome.kind != "launch" else outcome.reason
    return PlantOutcome(
        None,
        "not-qualified",
        f"the unplanted control is NOT QUALIFIED ({why}): this stack fails "
        "without a plant, so a failing plant shows nothing",
        judgement.run_dir,
        failed,
        cause,
    )


def plant_outcome(
    plant: Plant, judgement: Judgement, records: PlantRecords, *, rtol: float
) -> PlantOutcome:
    """The outcome of ``plant``'s run from its judgement and its plant records."""
    run_dir = judgement.run_dir
    failed = _failed(judgement)
    cause = judgement.first_cause.text if judgement.first_cause is not None else None
    if records.problems:
        reason = "; ".join(p.message for p in records.problems)
        return PlantOutcome(plant, "cannot-judge", reason, run_dir, failed, cause)
    strangers = [r for r in records.records if r.plant != plant.name]
    if strangers:
        return PlantOutcome(
            plant,
            "cannot-judge",
            f"{strangers[0].ref.location} records plant {strangers[0].plant!r} in the run of"
            f" {plant.name!r}",
            run_dir,
            failed,
            cause,
            (strangers[0].ref,),
        )
    acted = records.applied
    if not acted:
        refused = records.refused
        why = (
            "; ".join(f"{r.action} [{r.ref.location}]" for r in refused)
            if refused
            else "no worker recorded acting"
        )
        return PlantOutcome(
            plant,
            "not-applied",
            f"plant not applied: {why}; the run shows nothing about {plant.title}",
            run_dir,
            failed,
            cause,
            tuple(r.ref for r in refused),
        )
    proof = tuple(r.ref for r in acted[:2])
    if not judgement.judgeable:
        reason = "; ".join(judgement.unjudgeable_reasons) or "cannot judge"
        return PlantOutcome(plant, "cannot-judge", reason, run_dir, failed, cause, proof)
    if judgement.passed:
        return PlantOutcome(
            plant,
            "missed",
            f"on this stack, at rtol {rtol:g}, {plant.models} would be QUALIFIED: every"
            f" criterion passed although {acted[0].action} [{acted[0].ref.location}]",
            run_dir,
            failed,
            cause,
            proof,
        )
    expected = judgement.verdict(plant.caught_by)
    if not expected.passed:
        return PlantOutcome(
            plant,
            "caught",
            f"caught by {plant.caught_by}: {expected.reason}",
            run_dir,
            failed,
            cause,
            (*proof, *expected.evidence[:2]),
        )
    return PlantOutcome(
        plant,
        "caught-elsewhere",
        f"NOT QUALIFIED, but {plant.caught_by} passed (the documented catch): failed"
        f" {', '.join(failed)}; the catalogue's claim does not hold on this stack",
        run_dir,
        failed,
        cause,
        proof,
    )


def exit_status(outcomes: list[PlantOutcome] | tuple[PlantOutcome, ...]) -> int:
    """0 when every plant was caught as documented and the control qualified; 1 when a plant
    was missed or caught by another criterion; 2 when the self-test cannot tell."""
    if all(o.good for o in outcomes):
        return 0
    if any(o.status in FINDINGS for o in outcomes):
        return 1
    return 2
