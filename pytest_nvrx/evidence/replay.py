"""Replay comparison: do two logs print the same training, iteration by iteration?

A kill or hang run contains its own reference: the iterations between the restored checkpoint
and the fault are computed twice, by the failed cycle and by its replacement. A faithful resume
(same weights, optimizer, scheduler, RNG and data position) reproduces them bitwise, so the values
the two cycles print for those iterations are equal texts. An uninterrupted run of the same
configuration (a baseline) is a second reference for every iteration after the restore.

What a line prints is not always that iteration's own value. A workload may print some values
(Megatron: the losses) as the mean over a *logging window*, the iterations accumulated since the
accumulators were last reset. :class:`PrintModel` says which values and how the windows fall:

* a line is printed at every multiple of ``log_interval`` and at a process's first iteration;
* after a print the accumulators are reset, except after a process's *first* print, which
  resets only when ``first_print_resets`` holds and it falls on an interval boundary.

Megatron core <= 0.19 never resets at the first print (Megatron-LM issue #6237): with
``--log-interval 1`` a process's second line prints the mean of its first two iterations (a run
restored at 5 prints iteration 7 as the mean of 6 and 7). :func:`windows` gives each printed line
its window; :func:`compare` compares a candidate's lines with a reference's: a value printed for
the same window is compared as printed (exactly, or within ``rtol``), a candidate window that is a
union of reference windows is compared with their mean, within what the printed rounding allows.

Pure functions over parsed events: nothing here reads files.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.evidence.workload import IterationCommitted

# Values that describe speed, not training state: never compared.
NOT_COMPARED = frozenset({"elapsed_ms"})
# Averaged values are summed in float32 (Megatron's loss accumulators) before the division:
# each addition may round by half a float32 ulp of the partial sum.
_FLOAT32_HALF_EPS = 2.0**-24


@dataclass(frozen=True, slots=True)
class PrintModel:
    """How a workload's iteration lines relate to the iterations behind them."""

    averaged: frozenset[str] = frozenset()
    log_interval: int = 1
    first_print_resets: bool = True
    # where this model came from (shown in verdicts)
    basis: str = "each line prints its own iteration's values"


@dataclass(frozen=True, slots=True)
class Printed:
    """One iteration line and the window of iterations its averaged values cover."""

    event: IterationCommitted
    first: int  # first iteration of the window (== iteration when nothing is averaged)
    cycle: int | None = None

    @property
    def iteration(self) -> int:
        return self.event.iteration

    @property
    def window(self) -> tuple[int, int]:
        return (self.first, self.event.iteration)


def windows(
    iterations: Iterable[IterationCommitted], model: PrintModel, cycle: int | None = None
) -> list[Printed]:
    """The printed lines of ONE process lifetime (one cycle), each with its averaging window.

    Lines are taken in log order; a repeated iteration number (a second printing rank) keeps its
    first line. The accumulators start empty at the process's first iteration.
    """
    out: list[Printed] = []
    seen: set[int] = set()
    last_reset: int | None = None
    interval = max(1, model.log_interval)
    for event in iterations:
        it = event.iteration
        if it in seen:
            continue
        seen.add(it)
        if last_reset is None:
            # the process's first line: its window is that iteration alone
            out.append(Printed(event, it, cycle))
            resets = model.first_print_resets and it % interval == 0
            last_reset = it if resets else it - 1
            continue
        first = last_reset + 1 if last_reset < it else it
        out.append(Printed(event, first, cycle))
        last_reset = it
    return out


def ulp(text: str) -> Decimal | None:
    """The unit in the last printed digit of a number as printed (``6.419632E+00`` → 1E-6)."""
    value = _decimal(text)
    return None if value is None else _unit(value)


def _decimal(text: str) -> Decimal | None:
    """The number as printed, None for nan/inf/junk."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def _unit(value: Decimal) -> Decimal:
    """The unit in the last digit of a finite Decimal (its exponent is then an int)."""
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int), value
    return Decimal(1).scaleb(exponent)


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A value the candidate printed that the reference does not support."""

    iteration: int
    name: str
    actual: str
    expected: str  # the reference's text, or the derived mean (``6.4196325 = mean of 6, 7``)
    actual_ref: EvidenceRef
    expected_refs: tuple[EvidenceRef, ...]
    derived_from: tuple[int, ...] = ()  # reference lines a derived mean came from
    relative: float = math.inf

    def describe(self, candidate: str, reference: str) -> str:
        what = f"iteration {self.iteration} {self.name.replace('_', ' ')}"
        if self.derived_from:
            parts = " and ".join(str(i) for i in self.derived_from)
            mean = f"{self.expected}, the mean of {parts}"
            return f"{what} {self.actual} in {candidate} vs {mean} in {reference}"
        return f"{what} {self.actual} in {candidate} vs {self.expected} in {reference}"


@dataclass(frozen=True, slots=True)
class FieldGap:
    """A value one side prints for a compared iteration and the other side's line of it does not:
    the comparison needs it on both, so it cannot be made (never "fewer values compared")."""

    iteration: int
    name: str
    # the side that prints the value, and the line(s) of the side that does not
    printed_ref: EvidenceRef
    missing_refs: tuple[EvidenceRef, ...]
    missing_in_candidate: bool

    def describe(self, candidate: str, reference: str) -> str:
        what = self.name.replace("_", " ")
        has, lacks = (reference, candidate) if self.missing_in_candidate else (candidate, reference)
        return (
            f"iteration {self.iteration}'s {what} is printed by {has} ({self.printed_ref.location})"
            f" but not by {lacks}'s line of it ({self.missing_refs[0].location})"
        )


@dataclass(frozen=True, slots=True)
class Derivation:
    """A candidate line whose averaged values were compared with a mean of reference lines."""

    iteration: int
    parts: tuple[int, ...]


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing a candidate's lines with a reference's."""

    compared: tuple[int, ...] = ()  # candidate iterations with at least one value compared
    equal: tuple[int, ...] = ()  # ... all of whose compared values agreed
    values_compared: int = 0
    mismatches: tuple[Mismatch, ...] = ()
    derived: tuple[Derivation, ...] = ()
    not_comparable: tuple[int, ...] = ()  # candidate lines the reference printed no match for
    max_relative: float = 0.0  # largest relative difference among values that agreed
    names: tuple[str, ...] = field(default=())
    # values printed on one side only, for iterations both sides printed (at most ``keep``)
    gaps: tuple[FieldGap, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.mismatches

    def span(self) -> str:
        if not self.compared:
            return "none"
        lo, hi = min(self.compared), max(self.compared)
        return str(lo) if lo == hi else f"{lo}..{hi}"


def _relative(a: Decimal, b: Decimal) -> float:
    scale = max(abs(a), abs(b))
    if scale == 0:
        return 0.0
    return float(abs(a - b) / scale)


def _tile(start: int, end: int, by_first: dict[int, Printed]) -> list[Printed] | None:
    """Reference windows that exactly cover [start, end], in order; None if they do not."""
    parts: list[Printed] = []
    at = start
    while at <= end:
        piece = by_first.get(at)
        if piece is None or piece.iteration > end:
            return None
        parts.append(piece)
        at = piece.iteration + 1
    return parts


def compare(
    reference: Sequence[Printed],
    candidate: Sequence[Printed],
    model: PrintModel,
    *,
    rtol: float = 0.0,
    names: Iterable[str] | None = None,
    keep: int = 8,
) -> Comparison:
    """Compare every candidate line with what the reference printed for the same iterations.

    ``rtol`` 0 means exact: values printed for the same window must be equal numbers as printed
    (``1.0`` equals ``1.00``); a mean derived from reference lines must agree within the
    rounding of the printed digits (half a unit in the last digit of each print and of the
    mean's print, and half a float32 ulp per addition of the sum). With ``rtol`` > 0 a relative
    difference up to ``rtol`` is accepted as well.
    """
    wanted = None if names is None else frozenset(names)
    by_window = {p.window: p for p in reference}
    by_iteration = {p.iteration: p for p in reference}
    by_first: dict[int, Printed] = {}
    for p in reference:
        by_first.setdefault(p.first, p)
    compared: list[int] = []
    equal: list[int] = []
    mismatches: list[Mismatch] = []
    derived: list[Derivation] = []
    not_comparable: list[int] = []
    max_rel = 0.0
    n_values = 0
    seen_names: list[str] = []
    gaps: list[FieldGap] = []

    def compared_name(name: str) -> bool:
        return name not in NOT_COMPARED and (wanted is None or name in wanted)

    def gap(
        it: int, name: str, printed: EvidenceRef, missing: Sequence[Printed], cand: bool
    ) -> None:
        if len(gaps) < keep and all((g.iteration, g.name) != (it, name) for g in gaps):
            gaps.append(FieldGap(it, name, printed, tuple(p.event.ref for p in missing), cand))

    for cand in candidate:
        it = cand.iteration
        ok = True
        any_value = False
        same_line = by_iteration.get(it)
        # what the reference prints for this line, the candidate must print too: a value of
        # its own iteration from the same iteration's line, an averaged one from the line(s) of
        # the same window
        own = {name for name, _ in cand.event.values}
        window_line = by_window.get(cand.window)
        window = [window_line] if window_line is not None else None
        if window is None and model.averaged:
            window = _tile(cand.first, it, by_first)
        sources = [(same_line, False)] if same_line is not None else []
        sources += [(line, True) for line in window or ()]
        for line, averaged_only in sources:
            for name, _ in line.event.values:
                if not compared_name(name) or name in own:
                    continue
                if (name in model.averaged) != averaged_only:
                    continue
                gap(it, name, line.event.ref, [cand], True)
                ok = False
        for name, text in cand.event.values:
            if not compared_name(name):
                continue
            averaged = name in model.averaged
            # the one reference line that prints the same value: the window's for an averaged
            # one, the same iteration's for its own
            one = by_window.get(cand.window) if averaged else same_line
            if one is not None:
                expected_text = one.event.value(name)
                if expected_text is None:
                    gap(it, name, cand.event.ref, [one], False)
                    ok = False
                    continue
                result = _direct(text, expected_text, rtol)
                refs: tuple[EvidenceRef, ...] = (one.event.ref,)
                parts: tuple[int, ...] = ()
            elif averaged:
                tiles = _tile(cand.first, it, by_first)
                if tiles is None or len(tiles) < 2:
                    continue
                texts = [t.event.value(name) for t in tiles]
                if any(t is None for t in texts):
                    lacking = [t for t, x in zip(tiles, texts, strict=True) if x is None]
                    gap(it, name, cand.event.ref, lacking, False)
                    ok = False
                    continue
                weights = [t.iteration - t.first + 1 for t in tiles]
                result, expected_text = _derived(
                    text, [t for t in texts if t is not None], weights, rtol
                )
                refs = tuple(t.event.ref for t in tiles)
                parts = tuple(t.iteration for t in tiles)
                if Derivation(it, parts) not in derived:
                    derived.append(Derivation(it, parts))
            else:
                continue
            any_value = True
            n_values += 1
            if name not in seen_names:
                seen_names.append(name)
            agreed, rel = result
            if agreed:
                if math.isfinite(rel):
                    max_rel = max(max_rel, rel)
                continue
            ok = False
            if len(mismatches) < keep:
                mismatches.append(
                    Mismatch(it, name, text, expected_text, cand.event.ref, refs, parts, rel)
                )
        if any_value:
            compared.append(it)
            if ok:
                equal.append(it)
        else:
            not_comparable.append(it)
    return Comparison(
        compared=tuple(compared),
        equal=tuple(equal),
        values_compared=n_values,
        mismatches=tuple(mismatches),
        derived=tuple(derived),
        not_comparable=tuple(not_comparable),
        max_relative=max_rel,
        names=tuple(seen_names),
        gaps=tuple(gaps),
    )


def _direct(actual: str, expected: str, rtol: float) -> tuple[bool, float]:
    if actual == expected:
        return True, 0.0
    a, b = _decimal(actual), _decimal(expected)
    if a is None or b is None:
        return False, math.inf  # nan/inf/junk: equal only as identical text
    if a == b:
        return True, 0.0
    rel = _relative(a, b)
    return rel <= rtol, rel


def _derived(
    actual: str, parts: Sequence[str], weights: Sequence[int], rtol: float
) -> tuple[tuple[bool, float], str]:
    """Compare a printed mean with the weighted mean of printed parts."""
    a = _decimal(actual)
    parsed = [_decimal(part) for part in parts]
    values = [v for v in parsed if v is not None]
    if a is None or len(values) != len(parsed):
        return (False, math.inf), "(no finite mean)"
    unit_a = _unit(a)
    units = [_unit(v) for v in values]
    total = Decimal(sum(weights))
    mean = sum((Decimal(w) * v for w, v in zip(weights, values, strict=True)), Decimal(0)) / total
    slack_parts = sum((Decimal(w) * u for w, u in zip(weights, units, strict=True)), Decimal(0)) / (
        2 * total
    )
    additions = max(1, len(values) - 1)
    bound = unit_a / 2 + slack_parts + additions * abs(mean) * Decimal(_FLOAT32_HALF_EPS)
    rel = _relative(a, mean)
    agreed = abs(a - mean) <= bound or rel <= rtol
    shown = format(mean.normalize(), "f") if abs(mean) >= Decimal("1e-4") else str(mean)
    return (agreed, 0.0 if abs(a - mean) <= bound else rel), shown
