"""A big cycle log parsed in byte ranges by worker processes gives the one-pass CycleLog.

Every assertion compares the parallel result with ``workers=1`` (one pass in this process) as a
whole dataclass, so any field the merge gets wrong (a line number, a cap, a kept iteration, an
event's order) fails it. The logs are small; the size thresholds are lowered for the test.
"""

from __future__ import annotations

from datetime import timedelta, timezone
from pathlib import Path

import pytest

from pytest_nvrx.evidence import cycle_log
from pytest_nvrx.evidence.cycle_log import (
    ITERATIONS_KEPT,
    MAX_ERRORS,
    SAVES_KEPT,
    CycleLog,
    parse_cycle_log,
)
from pytest_nvrx.evidence.injector_log import MAX_INJECTOR_LINES
from pytest_nvrx.evidence.megatron import MEGATRON
from pytest_nvrx.evidence.reference import REFERENCE
from pytest_nvrx.evidence.refs import MAX_LINE_BYTES
from pytest_nvrx.evidence.workload import SaveCompleted, WorkloadError, WorkloadLogAdapter

DATA = Path(__file__).parents[1] / "data"
TZ = timezone(timedelta(hours=-5))

TRACEBACK = (
    "{r}: [rank{r}]: Traceback (most recent call last):\n"
    '{r}: [rank{r}]:   File "/ckpt/megatron/training/checkpointing.py", line 9, in'
    " load_checkpoint\n"
    "{r}: [rank{r}]:     state = load(path)\n"
    "{r}: [rank{r}]: RuntimeError: bad checkpoint {n}\n"
)


def iteration(n: int, rank: int = 0) -> str:
    return (
        f"{rank}:  [2026-11-29 11:00:{n % 60:02d}.{n % 997:06d}] iteration {n:8d}/  999999 |"
        f" consumed samples: {n:12d} | learning rate: 1.0E-04 | lm loss: {1 + n % 7}.5E+00 |\n"
    )


def busy_log(path: Path) -> Path:
    """More of everything than one pass keeps: iteration lines (2 x ITERATIONS_KEPT + some),
    saves (> 2 x SAVES_KEPT of each kind), errors (> MAX_ERRORS), injector lines, tracebacks,
    several ranks, unprefixed, CRLF, invalid UTF-8 and overlong lines; no newline at the end."""
    parts: list[str | bytes] = ["> PyTorch version ................ 2.11.0\n"]
    for n in range(1, 2 * ITERATIONS_KEPT + 1500):
        parts.append(iteration(n, rank=n % 3))
        if n % 60 == 0:
            parts.append(
                f"1:   [2026-11-29 11:01:00] scheduled an async checkpoint save at iteration {n}\n"
            )
            parts.append(f"1:   successfully saved checkpoint from iteration {n - 60} to /ckpt\n")
        if n % 150 == 0:
            parts.append(f"2: RuntimeError: step {n}\r\n")
        if n % 700 == 0:
            parts.append(TRACEBACK.format(r=n % 3, n=n))
        if n % 4 == 0:  # > MAX_INJECTOR_LINES in all
            parts.append(
                f"0: [pytest-nvrx injector] rank 0 pid 7: marker /m{n} exists: fault already"
                " injected; running the workload without injection\n"
            )
        if n % 900 == 0:
            parts.append(b"no prefix \xff\xfe junk\n")
            parts.append(b"0: " + b"x" * (MAX_LINE_BYTES + 10) + b"\n")
            parts.append("[after training is done] datetime: 2026-11-29 11:09:00\n")
    parts.append("0: the last line, cut short")
    with path.open("wb") as f:
        for part in parts:
            f.write(part if isinstance(part, bytes) else part.encode())
    return path


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return busy_log(tmp_path_factory.mktemp("ranges") / "train_cycle2.log")


def in_ranges(path: Path, ranges: int, adapter: WorkloadLogAdapter = MEGATRON) -> CycleLog | None:
    with path.open("rb") as f:
        starts = cycle_log._range_starts(f, path.stat().st_size, ranges)
    assert len(starts) == ranges, starts
    return cycle_log._parse_in_ranges(path, starts, 2, adapter, "logs/x.log", TZ)


def one_pass(path: Path, adapter: WorkloadLogAdapter = MEGATRON) -> CycleLog:
    return parse_cycle_log(path, 2, adapter, file="logs/x.log", tz=TZ, workers=1)


def test_the_busy_log_overflows_every_cap(busy: Path) -> None:
    """The comparison below is only worth something if one pass drops and keeps a lot."""
    c = one_pass(busy)
    assert c.iterations_not_kept > 0 and len(c.iterations) == 2 * ITERATIONS_KEPT
    assert c.saves_not_kept > 0 and len(c.of_type(SaveCompleted)) == SAVES_KEPT * 2
    assert c.errors_not_kept > 0 and len(c.of_type(WorkloadError)) == MAX_ERRORS
    assert len(c.injector) == MAX_INJECTOR_LINES and c.ranks == (0, 1, 2)
    assert c.unprefixed_lines > 1 and c.last_line is not None
    assert c.last_line.text == "0: the last line, cut short"


@pytest.mark.parametrize("ranges", [2, 3, 7])
def test_ranges_merge_to_the_one_pass_result(busy: Path, ranges: int) -> None:
    parallel = in_ranges(busy, ranges)
    assert parallel is not None, "fell back to one pass"
    assert parallel == one_pass(busy)


def test_committed_logs_in_ranges_both_adapters(tmp_path: Path) -> None:
    """Every committed cycle log (real H200 and CPU runs) end to end, read by both adapters."""
    logs = sorted(DATA.rglob("train_cycle*.log"))
    assert len(logs) > 50
    path = tmp_path / "all.log"
    path.write_bytes(b"".join(log.read_bytes() for log in logs))
    for adapter in (MEGATRON, REFERENCE):
        expected = one_pass(path, adapter)
        assert expected.iteration_lines > 300 and expected.events
        parallel = in_ranges(path, 4, adapter)
        if parallel is None:  # a range ended inside a traceback: shown by the next test
            continue
        assert parallel == expected


def test_a_range_that_starts_inside_a_traceback_falls_back_to_one_pass(
    busy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = busy.read_bytes()
    frame = data.index(b'1: [rank1]:   File "/ckpt/')  # the line after a traceback's head
    assert data[frame - 1 : frame] == b"\n"
    assert cycle_log._parse_in_ranges(busy, [0, frame], 2, MEGATRON, "logs/x.log", TZ) is None

    # parse_cycle_log then gives the one-pass result (its own ranges may or may not split there)
    monkeypatch.setattr(cycle_log, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(cycle_log, "MIN_RANGE_BYTES", 1)
    monkeypatch.setattr(cycle_log, "_range_starts", lambda f, size, ranges: [0, frame])
    assert parse_cycle_log(busy, 2, MEGATRON, file="logs/x.log", tz=TZ, workers=2) == one_pass(busy)


def test_parse_cycle_log_uses_ranges_above_the_threshold(
    busy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results: list[CycleLog | None] = []
    real = cycle_log._parse_in_ranges

    def spy(*args: object, **kwargs: object) -> CycleLog | None:
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        results.append(result)
        return result

    monkeypatch.setattr(cycle_log, "_parse_in_ranges", spy)
    one = one_pass(busy)
    assert results == []  # workers=1: never
    monkeypatch.setattr(cycle_log, "PARALLEL_MIN_BYTES", busy.stat().st_size)
    monkeypatch.setattr(cycle_log, "MIN_RANGE_BYTES", 1)
    assert parse_cycle_log(busy, 2, MEGATRON, file="logs/x.log", tz=TZ, workers=3) == one
    assert len(results) == 1 and results[0] is not None
    monkeypatch.setattr(cycle_log, "PARALLEL_MIN_BYTES", busy.stat().st_size + 1)
    parse_cycle_log(busy, 2, MEGATRON, file="logs/x.log", tz=TZ, workers=3)
    assert len(results) == 1  # below the threshold: one pass


def test_an_unregistered_adapter_is_parsed_in_one_pass(
    busy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker gets the adapter by its registered name; another object is not sent."""

    class Private(type(MEGATRON)):  # type: ignore[misc]
        name = "private-test-adapter"

    monkeypatch.setattr(cycle_log, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(cycle_log, "MIN_RANGE_BYTES", 1)
    monkeypatch.setattr(cycle_log, "_parse_in_ranges", lambda *a, **k: pytest.fail("ranges"))
    c = parse_cycle_log(busy, 2, Private(), file="logs/x.log", tz=TZ, workers=2)
    assert c.iteration_lines == one_pass(busy).iteration_lines


def test_range_starts_are_line_starts(busy: Path, tmp_path: Path) -> None:
    data = busy.read_bytes()
    with busy.open("rb") as f:
        starts = cycle_log._range_starts(f, len(data), 5)
    assert starts[0] == 0 and starts == sorted(set(starts)) and len(starts) == 5
    assert all(data[s - 1 : s] == b"\n" for s in starts[1:])
    flat = tmp_path / "flat.log"
    flat.write_bytes(b"x" * 10_000)  # no newline: one range
    with flat.open("rb") as f:
        assert cycle_log._range_starts(f, 10_000, 4) == [0]


@pytest.mark.parametrize(
    ("counts", "kept"),
    [
        ([3, 15_000, 2, 12_000], [(3, 0), (9_997, 0), (0, 0), (0, 10_000)]),
        ([5_000, 4_000, 3_000, 2_000], [(5_000, 0), (4_000, 0), (1_000, 2_000), (0, 2_000)]),
        ([25_000, 0, 4_000], [(10_000, 6_000), (0, 0), (0, 4_000)]),
        ([0, 0], [(0, 0), (0, 0)]),
    ],
)
def test_kept_iterations_take_the_first_and_last_of_the_whole_log(
    counts: list[int], kept: list[tuple[int, int]]
) -> None:
    assert cycle_log._kept_iterations(counts) == kept
    total = sum(counts)
    kept_total = sum(h + t for h, t in kept)
    assert kept_total == min(total, 2 * ITERATIONS_KEPT)
