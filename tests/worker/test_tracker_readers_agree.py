"""The injector's stdlib-only tracker reader and the core's (evidence/tracker) are two copies of
one rule, held equal here: whatever a tracker holds, both read the same iteration or both read
none. The injector fires on what it reads and the criteria judge by what the core reads; were
they to differ, a run could be judged against an iteration the injector never saw."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_nvrx import layout
from pytest_nvrx.evidence.injector_log import OBSERVER_ANNOUNCEMENT, parse_injector_line
from pytest_nvrx.evidence.refs import LineCursor
from pytest_nvrx.evidence.tracker import read_tracker
from pytest_nvrx.worker import injector

CONTENTS: tuple[bytes, ...] = (
    b"",
    b"\n",
    b"0",
    b"12",
    b"12\n",
    b" 7 \r\n",
    b"00012",
    b"release",
    b"-3",
    b"+3",
    b"1.5",
    b"1_000",
    b"abc",
    b"12 13",
    b"\xc2\xb2",  # superscript two: str.isdigit() says yes, int() says no
    b"\xc2\xa012",  # no-break space before the digits
    b"\xe2\x80\x8312",  # em space
    b"\x1c12",  # a separator str.strip() takes for white space
    b"12\x00",
    b"\xff12",
    b"\xef\xbc\x91\xef\xbc\x92",  # fullwidth digits
    b"9" * 30,  # past the digits any count of a run has: no iteration in either
    b"9" * 20,
    b"9" * 21,
    b"1" * (injector.TRACKER_MAX_BYTES + 1),
)


@pytest.mark.parametrize("content", CONTENTS, ids=repr)
def test_both_readers_read_the_same_iteration(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / layout.TRACKER_NAME
    path.write_bytes(content)
    ours = injector.read_tracker(str(path))
    core = read_tracker(path, tmp_path)
    assert ours.iteration == core.iteration, (ours, core)


def test_an_absent_tracker_has_no_iteration_in_either(tmp_path: Path) -> None:
    path = tmp_path / layout.TRACKER_NAME
    assert injector.read_tracker(str(path)).iteration is None
    assert read_tracker(path, tmp_path).iteration is None


def test_the_injector_copies_the_layouts_names() -> None:
    """The stdlib-only injector keeps its own copies of the tracker's name and the windows."""
    assert injector.TRACKER_NAME == layout.TRACKER_NAME
    assert injector.WINDOWS == layout.FAULT_WINDOWS
    assert set(injector.SCHEDULE_WINDOWS) == set(layout.SCHEDULE_WINDOWS)
    assert dict(injector.FAULT_WINDOWS_ONLY) == dict(layout.FAULT_WINDOWS_ONLY)


def test_the_core_reads_the_observers_announcement_and_readings(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Rank 0's observer says it logs its readings before the first one, in the line the core
    requires wherever a run says so (criteria/required_evidence.py); both copies of its head
    agree, and what the observer writes is what the core parses."""
    assert injector.OBSERVER_ANNOUNCEMENT == OBSERVER_ANNOUNCEMENT
    path = tmp_path / layout.TRACKER_NAME
    path.write_text("5\n")
    observer = injector.TrackerObserver(str(path), 0)
    observer.announce()
    observer.observe("start")
    lines = capfd.readouterr().err.splitlines()
    parsed = [parse_injector_line(line, LineCursor("x.log")) for line in lines]
    assert [
        (p.kind, p.rank) if p is not None else line for p, line in zip(parsed, lines, strict=True)
    ] == [
        ("observing", 0),
        ("tracker", 0),
    ]
    assert parsed[1] is not None and parsed[1].tracker_iteration == 5
