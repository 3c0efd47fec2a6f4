"""Replay comparison (pytest_nvrx.evidence.replay) and Megatron's print model, on real H200 logs
and on small synthetic sequences whose expected windows are worked out by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from pytest_nvrx.evidence.megatron import MEGATRON
from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.evidence.replay import (
    Printed,
    PrintModel,
    compare,
    ulp,
    windows,
)
from pytest_nvrx.evidence.rundir import load_run
from pytest_nvrx.evidence.workload import IterationCommitted, SettingReported

DATA = Path(__file__).parents[1] / "data"
RECIPE = DATA / "gpu-recipe"
MEGATRON_MODEL = PrintModel(averaged=frozenset({"loss"}), first_print_resets=False)
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def line(
    it: int, loss: str, lr: str = "1.0E-04", *, elapsed: str | None = None
) -> IterationCommitted:
    values = [("loss", loss), ("learning_rate", lr)]
    if elapsed is not None:
        values.append(("elapsed_ms", elapsed))
    return IterationCommitted(
        iteration=it,
        total=30,
        consumed_samples=it,
        loss=float(loss),
        time=T0 + timedelta(milliseconds=100 * it),
        ref=EvidenceRef("train.log", it, f"iteration {it} loss {loss}"),
        values=tuple(values),
    )


def failed_cycle(*replayed: IterationCommitted) -> list[Printed]:
    """A failed cycle that had been running since iteration 1 (its later lines are single
    iterations), ending with the ``replayed`` lines."""
    return windows([line(i, "5.0E+00") for i in range(1, 6)] + list(replayed), MEGATRON_MODEL)


def test_windows_megatron_first_line_kept_in_accumulator() -> None:
    """Without the first-print reset, a process's second line covers its first two iterations;
    every later line its own (log interval 1)."""
    prints = windows([line(i, "1.0") for i in range(6, 10)], MEGATRON_MODEL)
    assert [p.window for p in prints] == [(6, 6), (6, 7), (8, 8), (9, 9)]


def test_windows_with_reset_and_with_interval() -> None:
    fixed = PrintModel(averaged=frozenset({"loss"}), first_print_resets=True)
    assert [p.window for p in windows([line(i, "1") for i in (6, 7, 8)], fixed)] == [
        (6, 6),
        (7, 7),
        (8, 8),
    ]
    # interval 5, resumed at 5: first line at 6 (off the boundary: never reset), then 10, 15
    every5 = PrintModel(averaged=frozenset({"loss"}), log_interval=5, first_print_resets=True)
    got = [p.window for p in windows([line(i, "1") for i in (6, 10, 15)], every5)]
    assert got == [(6, 6), (6, 10), (11, 15)]
    # a fresh process under interval 5: 1, 5, 10
    got = [p.window for p in windows([line(i, "1") for i in (1, 5, 10)], every5)]
    assert got == [(1, 1), (1, 5), (6, 10)]


def test_windows_keeps_first_line_of_a_repeated_iteration() -> None:
    prints = windows([line(6, "1.0"), line(6, "2.0"), line(7, "3.0")], MEGATRON_MODEL)
    assert [(p.iteration, p.event.value("loss")) for p in prints] == [(6, "1.0"), (7, "3.0")]


def test_ulp_of_printed_numbers() -> None:
    assert ulp("6.419632E+00") == Decimal("1E-6")
    assert ulp("5.858") == Decimal("0.001")
    assert ulp("1.0") == Decimal("0.1")
    assert ulp("12") == Decimal(1)
    assert ulp("nan") is None
    assert ulp("junk") is None


def test_compare_exact_equal_and_derived_mean() -> None:
    ref = windows(
        [line(i, v) for i, v in ((6, "6.439997E+00"), (7, "6.419632E+00"), (8, "7.1E+00"))],
        MEGATRON_MODEL,
    )
    cand = windows(
        [line(6, "6.439997E+00"), line(7, "6.419632E+00"), line(8, "7.1E+00")], MEGATRON_MODEL
    )
    # reference is a fresh process started at 6 too, so its 7 is also a mean: same windows
    result = compare(ref, cand, MEGATRON_MODEL)
    assert result.passed and result.equal == (6, 7, 8) and not result.derived


def test_compare_derives_the_mean_when_windows_differ() -> None:
    ref = failed_cycle(line(6, "6.439997E+00"), line(7, "6.399268E+00"), line(8, "7.133384E+00"))
    cand = windows(
        [line(6, "6.439997E+00"), line(7, "6.419632E+00"), line(8, "7.133384E+00")], MEGATRON_MODEL
    )
    result = compare(ref, cand, MEGATRON_MODEL)
    assert result.passed, result.mismatches
    assert result.compared == (6, 7, 8)
    assert [(d.iteration, d.parts) for d in result.derived] == [(7, (6, 7))]


def test_compare_fails_on_a_fifth_significant_digit_and_names_both_lines() -> None:
    ref = failed_cycle(line(6, "6.439997E+00"), line(7, "6.399268E+00"), line(8, "7.133384E+00"))
    cand = windows(
        [line(6, "6.439997E+00"), line(7, "6.419632E+00"), line(8, "7.133484E+00")], MEGATRON_MODEL
    )
    result = compare(ref, cand, MEGATRON_MODEL)
    assert not result.passed
    assert result.equal == (6, 7) and result.compared == (6, 7, 8)
    (bad,) = result.mismatches
    assert (bad.iteration, bad.name, bad.actual, bad.expected) == (
        8,
        "loss",
        "7.133484E+00",
        "7.133384E+00",
    )
    assert bad.actual_ref.line == 8 and bad.expected_refs[0].line == 8
    assert (
        bad.describe("cycle 1", "cycle 0")
        == "iteration 8 loss 7.133484E+00 in cycle 1 vs 7.133384E+00 in cycle 0"
    )
    # a tolerance admits it, and the largest relative difference is reported
    loose = compare(ref, cand, MEGATRON_MODEL, rtol=1e-4)
    assert loose.passed and 1e-5 < loose.max_relative < 2e-5


def test_compare_derived_mean_outside_rounding_fails() -> None:
    ref = failed_cycle(line(6, "6.439997E+00"), line(7, "6.399268E+00"))
    # mean is 6.4196325: 6.419634 is two units in the last digit away
    cand = windows([line(6, "6.439997E+00"), line(7, "6.419634E+00")], MEGATRON_MODEL)
    result = compare(ref, cand, MEGATRON_MODEL)
    assert not result.passed
    (bad,) = result.mismatches
    assert bad.derived_from == (6, 7) and bad.expected == "6.4196325"


def test_compare_instant_values_and_nan() -> None:
    ref = windows([line(6, "nan", lr="2.0E-04")], PrintModel())
    cand = windows([line(6, "nan", lr="2.5E-04")], PrintModel())
    result = compare(ref, cand, PrintModel())
    assert [(m.name, m.actual, m.expected) for m in result.mismatches] == [
        ("learning_rate", "2.5E-04", "2.0E-04")
    ]
    cand = windows([line(6, "inf", lr="2.0E-04")], PrintModel())
    assert [m.name for m in compare(ref, cand, PrintModel()).mismatches] == ["loss"]


def test_compare_reports_lines_the_reference_cannot_match() -> None:
    ref = windows([line(6, "1.0")], PrintModel())
    cand = windows([line(6, "1.0"), line(7, "1.0")], PrintModel())
    result = compare(ref, cand, PrintModel())
    assert result.compared == (6,) and result.not_comparable == (7,)


@pytest.mark.parametrize(
    "name", ["cli-kill-30", "cli-hang-30", "megatron-kill-40", "megatron-hang-40"]
)
def test_real_h200_resumes_replay_bitwise(name: str) -> None:
    """Real single-GPU kill/hang runs: the replacement reprints the failed cycle's iterations
    6..10 exactly, 7 as the mean of cycle 0's 6 and 7 (Megatron-LM #6237)."""
    run = load_run(RECIPE / name)
    settings = {e.name: e.value for e in run.cycle_logs[1].of_type(SettingReported)}
    model = MEGATRON.print_model([log.iterations for log in run.cycle_logs], settings)
    assert model.first_print_resets is False and "averages its first two" in model.basis
    result = compare(
        windows(run.cycle_logs[0].iterations, model),
        windows(run.cycle_logs[1].iterations, model),
        model,
    )
    assert result.passed
    assert result.compared[0] == 6 and len(result.compared) >= 5
    assert result.equal == result.compared
    assert [(d.iteration, d.parts) for d in result.derived] == [(7, (6, 7))]
    assert set(result.names) == {
        "consumed_samples",
        "learning_rate",
        "loss",
        "loss_scale",
        "grad_norm",
    }


def test_real_h200_resume_matches_the_baseline() -> None:
    model = MEGATRON_MODEL
    base = load_run(RECIPE / "megatron-baseline-40")
    run = load_run(RECIPE / "megatron-kill-40")
    result = compare(
        windows(base.cycle_logs[0].iterations, model),
        windows(run.cycle_logs[1].iterations, model),
        model,
    )
    assert result.passed and len(result.equal) == 35 and result.span() == "6..40"


def test_megatron_print_model_reads_the_timer() -> None:
    """Elapsed 2870 ms then 1479 ms 89 ms later: the second line averaged both (no reset);
    had it reset, it would have printed about 89 ms."""
    kept = [line(1, "7.0", elapsed="2870.2"), line(2, "7.0", elapsed="1479.5")]
    assert MEGATRON.print_model([kept], {}).first_print_resets is False
    own = [line(1, "7.0", elapsed="2870.2"), line(2, "7.0", elapsed="101.0")]
    model = MEGATRON.print_model([own], {"log_interval": "1"})
    assert model.first_print_resets is True and "is its own window" in model.basis
    # cannot tell: no timer; conflicting cycles -> the core <= 0.19 rule, said as assumed
    for cycles in ([[line(1, "7"), line(2, "7")]], [kept, own]):
        model = MEGATRON.print_model(cycles, {})
        assert model.first_print_resets is False and "#6237" in model.basis
    assert MEGATRON.print_model([kept], {"log_interval": "10"}).log_interval == 10
