"""A run's outcome, computed once: did it qualify, and if not, the one cause that says why.

The console (the outcome line, the verdict table's row, the failing tests' messages), the
report, JUnit, verify and the self-test all read :func:`run_outcome`; none of them orders the
causes itself, so that no two of them can name different causes for one run. The order:

1. the run cannot be judged (a fatal problem, or a criterion found the evidence it reads
   contradicting itself): said first, because any cause read from that evidence is suspect (an
   empty run dir's "the fault never happened"); verify exits 2 for it;
2. the first cause: the workers died before the fault, or our run timeout cut a run short that
   had not failed by itself; every derived failure follows from it (criteria/first_cause.py);
3. the launch's own end (its deadline, as the launcher saw it), when the run dir names no cause;
4. the first failing criterion, in the criteria's order;
5. the time limits (--nvrx-max-downtime, --nvrx-max-phase) the run broke.

A planted self-test run is never a qualification: its outcome says so even where every
criterion held. Pure: a judgement and two strings in, plain data out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pytest_nvrx.criteria.judgement import Judgement

#: where a cause comes from, in the order above
CauseKind = Literal["cannot-judge", "first-cause", "launch", "criterion", "limits"]
#: the causes a run has before any criterion is read: the pytest suite's test_run_finished
#: fails on them (each criterion's test fails on its own verdict)
RUN_CAUSES: frozenset[CauseKind] = frozenset({"cannot-judge", "first-cause", "launch"})

CANNOT_JUDGE = "cannot judge the run directory: "
QUALIFIED = "QUALIFIED"
NOT_QUALIFIED = "NOT QUALIFIED"
#: a planted run whose every criterion held: its plant was missed, and it qualifies nothing
PLANTED_HELD = "every criterion held, NOT A QUALIFICATION (a planted run)"


@dataclass(frozen=True)
class Outcome:
    """A run's outcome: the cause (None: nothing failed), where it came from, verify's count
    line, and the plant a self-test run names."""

    cause: str | None
    kind: CauseKind | None
    #: verify's one-line count: ``PASSED (6 of 6)``, ``FAILED: <first cause>; 6 of 6 fail: ...``,
    #: ``FAILED (2 of 6: a, b)``, ``CANNOT JUDGE (see errors)``; a planted run's after
    #: ``planted: <name>: ``
    summary: str
    planted: str | None = None

    @property
    def qualified(self) -> bool:
        """Nothing failed and nothing was planted."""
        return self.cause is None and self.planted is None

    @property
    def reason(self) -> str | None:
        """Why the run did not qualify: its cause; a planted run whose criteria all held, that it
        is planted. None: it qualified."""
        if self.cause is None and self.planted is not None:
            return PLANTED_HELD
        return self.cause

    @property
    def status(self) -> str:
        """``QUALIFIED`` or ``NOT QUALIFIED`` (the verdict table's outcome column)."""
        return QUALIFIED if self.qualified else NOT_QUALIFIED

    @property
    def text(self) -> str:
        """The outcome line (:func:`outcome_text`)."""
        return outcome_text(self.cause, self.planted)


def run_outcome(
    judgement: Judgement, *, launch_error: str | None = None, limits: str | None = None
) -> Outcome:
    """The outcome of a judged run: ``launch_error`` is why its launch did not end by itself
    (None: it did, or the run was not launched here), ``limits`` why it broke the time limits
    it was held to (None: it kept to them, or was held to none)."""
    kind, cause = _cause(judgement, launch_error, limits)
    summary = _summary(judgement)
    if judgement.planted is not None:
        summary = f"planted: {judgement.planted}: {summary}"
    return Outcome(cause, kind, summary, judgement.planted)


def _cause(
    judgement: Judgement, launch_error: str | None, limits: str | None
) -> tuple[CauseKind | None, str | None]:
    if not judgement.judgeable:
        # the first of the reasons (verify lists them all, the report's problems too)
        return "cannot-judge", CANNOT_JUDGE + judgement.unjudgeable_reasons[0]
    if judgement.first_cause is not None:
        return "first-cause", judgement.first_cause.text
    if launch_error is not None:
        return "launch", launch_error
    failing = next((v for v in judgement.verdicts if not v.passed), None)
    if failing is not None:
        return "criterion", f"{failing.id}: {failing.reason}"
    if limits is not None:
        return "limits", limits
    return None, None


def _summary(judgement: Judgement) -> str:
    if not judgement.judgeable:
        return "CANNOT JUDGE (see errors)"
    failed = [v.id for v in judgement.verdicts if not v.passed]
    total = len(judgement.verdicts)
    if failed:
        count = f"{len(failed)} of {total}"
        if judgement.first_cause is not None:
            return f"FAILED: {judgement.first_cause.text}; {count} fail: {', '.join(failed)}"
        return f"FAILED ({count}: {', '.join(failed)})"
    na = sum(v.not_applicable for v in judgement.verdicts)
    extra = f", {na} not applicable" if na else ""
    return f"PASSED ({total - na} of {total}{extra})"


def outcome_text(cause: str | None, planted: str | None) -> str:
    """``QUALIFIED`` or ``NOT QUALIFIED: <cause>``, after ``planted: <name>: `` in a planted
    run, which is never QUALIFIED (where every criterion held it says so)."""
    said = QUALIFIED if cause is None else f"{NOT_QUALIFIED}: {cause}"
    if planted is None:
        return said
    return f"planted: {planted}: {PLANTED_HELD if cause is None else said}"


def cause_in(text: str, planted: str | None) -> str | None:
    """The cause an outcome line names (None: none), as a report document keeps it (its
    ``outcome``): the inverse of :func:`outcome_text`."""
    if planted is not None:
        text = text.removeprefix(f"planted: {planted}: ")
        if text == PLANTED_HELD:
            return None
    if text == QUALIFIED:
        return None
    head = f"{NOT_QUALIFIED}: "
    if not text.startswith(head):
        raise ValueError(f"not an outcome: {text!r}")
    return text[len(head) :]
