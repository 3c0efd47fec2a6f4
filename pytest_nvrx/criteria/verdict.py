"""What a criterion returns: a :class:`Verdict` that cannot exist without the lines proving it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pytest_nvrx.evidence.refs import EvidenceRef

# The criteria in the order they are judged and reported; a new criterion adds its id here and
# its check to pytest_nvrx.criteria.registry.CRITERIA.
CriterionId = Literal[
    "prior_checkpoint",
    "replaced_cycle",
    "optimizer_state_load",
    "progress_past_restore",
    "no_repeat_injection",
    "training_continuity",
]
CRITERIA_IDS: tuple[CriterionId, ...] = get_args(CriterionId)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One criterion's outcome: a one-line reason and the lines that prove it."""

    id: CriterionId
    passed: bool
    reason: str
    evidence: tuple[EvidenceRef, ...]
    # True only for a baseline (fault=none) criterion that needs a fault; passed is then True.
    not_applicable: bool = False
    # True when the evidence contradicts itself where this criterion must read it: passed is
    # then False and the run cannot be judged (verify exits 2), never a pass
    cannot_judge: bool = False

    def __post_init__(self) -> None:
        if not self.evidence:
            raise ValueError(f"verdict {self.id} has no evidence: a verdict must quote its proof")

    @property
    def status(self) -> str:
        if self.not_applicable:
            return "N/A"
        return "PASS" if self.passed else "FAIL"

    def headline(self) -> str:
        return f"{self.status} {self.id}: {self.reason} [{self.evidence[0].location}]"

    def render(self, width: int | None = 200) -> str:
        lines = [self.headline()]
        lines += [f"    {ref.render(width)}" for ref in self.evidence]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "passed": self.passed,
            "not_applicable": self.not_applicable,
            "cannot_judge": self.cannot_judge,
            "reason": self.reason,
            "evidence": [ref.render() for ref in self.evidence],
        }


# What a criterion may quote: one line, several (None where a fact has no line), or nothing.
Quote = EvidenceRef | Iterable[EvidenceRef | None] | None


def quoted(*items: Quote) -> tuple[EvidenceRef, ...]:
    """The lines of ``items`` in order, without gaps (None) or repeats."""
    out: list[EvidenceRef] = []
    for item in items:
        if item is None:
            continue
        candidates: Iterable[EvidenceRef | None] = (
            (item,) if isinstance(item, EvidenceRef) else item
        )
        for ref in candidates:
            if ref is not None and ref not in out:
                out.append(ref)
    return tuple(out)


def passing(cid: CriterionId, reason: str, *evidence: Quote) -> Verdict:
    return Verdict(cid, True, reason, quoted(*evidence))


def failing(cid: CriterionId, reason: str, *evidence: Quote) -> Verdict:
    return Verdict(cid, False, reason, quoted(*evidence))


def not_applicable(cid: CriterionId, reason: str, *evidence: Quote) -> Verdict:
    """A baseline (fault=none) criterion that needs a fault: passed, marked N/A."""
    return Verdict(cid, True, f"not applicable: {reason}", quoted(*evidence), not_applicable=True)


def unjudgeable(cid: CriterionId, reason: str, *evidence: Quote) -> Verdict:
    """Evidence this criterion must read cannot be judged (a replayed line without its values,
    an impossible clock): not a pass, and the whole run cannot be judged (exit 2)."""
    return Verdict(cid, False, f"cannot judge: {reason}", quoted(*evidence), cannot_judge=True)
