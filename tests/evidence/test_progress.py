"""Live progress lines, on run dirs grown line by line from committed real logs."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from pytest_nvrx.evidence.marker import read_marker
from pytest_nvrx.evidence.progress import (
    InjectedFault,
    Progress,
    ProgressReader,
    read_progress,
    waiting_for,
)
from pytest_nvrx.layout import RunLayout
from pytest_nvrx.settings import SectionTimeouts

DATA = Path(__file__).parents[1] / "data"
REF_KILL = DATA / "cpu" / "reference-kill"
GPU_KILL = DATA / "gpu" / "gpu-kill-100"


class GrowingRun:
    """A run dir whose cycle logs and marker appear the way a live run writes them, read by
    one ProgressReader, keeping the lines Launch.wait would print (one per new state)."""

    def __init__(self, tmp_path: Path, source: Path, workload: str) -> None:
        self.source = source
        self.layout = RunLayout.for_run(tmp_path / "run")
        self.layout.logs.mkdir(parents=True)
        self.reader = ProgressReader(self.layout, workload)
        self.printed: list[str] = []
        self._last: tuple[object, ...] | None = None
        self._elapsed = 0.0

    def lines(self, cycle: int) -> list[bytes]:
        return (self.source / "logs" / f"train_cycle{cycle}.log").read_bytes().splitlines(True)

    def write(self, cycle: int, upto: int, start: int = 0) -> None:
        """Append lines [start, upto) of the real cycle log (0-based, upto exclusive)."""
        with self.layout.cycle_log(cycle).open("ab") as fh:
            fh.write(b"".join(self.lines(cycle)[start:upto]))

    def inject(self) -> None:
        self.layout.marker.write_bytes((self.source / "fault_injected.json").read_bytes())

    def poll(self) -> Progress:
        self._elapsed += 1.0
        progress = self.reader.read(self._elapsed)
        if progress.state != self._last:
            self._last = progress.state
            self.printed.append(progress.describe())
        return progress


def test_reference_kill_progress_lines(tmp_path: Path) -> None:
    """cycle 0 counts up, the fault is said once with its rank and iteration, cycle 1 never shows
    cycle 0's iteration, says when it restored checkpoint 10, then counts on from 11."""
    run = GrowingRun(tmp_path, REF_KILL, "reference")
    assert run.poll().describe().endswith("launcher starting")
    run.write(0, 1)  # the injector's first line: cycle 0 exists, no step yet
    assert run.poll().describe().endswith("cycle 0 starting")
    run.write(0, 10, start=1)
    first = run.poll()
    assert first.cycle == 0 and first.iteration is not None and first.total == 40
    run.write(0, 28, start=10)  # through "iteration 20/40" and "save completed iteration 10"
    assert run.poll().iteration == 20
    run.inject()
    run.write(0, 30, start=28)  # the injector's line and rank 0's last one
    hit = run.poll()
    assert hit.news == {"fault"} and hit.fault is not None
    assert hit.describe().endswith(
        "cycle 0: fault injected into rank 1 (kill) at iteration 20, tracker at 10"
    )
    for _ in range(3):  # the hung cycle says nothing new
        assert run.poll().news == frozenset()
    run.write(1, 4)  # replacement workers started, nothing loaded yet
    starting = run.poll()
    assert starting.cycle == 1 and starting.iteration is None and starting.fault is not None
    assert starting.describe().endswith("cycle 1 starting")
    run.write(1, 6, start=4)  # both ranks' "load checkpoint iteration 10 (...)"
    restored = run.poll()
    assert restored.news == {"restored"} and restored.restored == 10
    assert restored.describe().endswith("cycle 1 restored checkpoint 10")
    run.write(1, len(run.lines(1)), start=6)
    done = run.poll()
    assert done.describe().endswith("cycle 1, iteration 40/40")
    assert sum("fault injected" in line for line in run.printed) == 1, run.printed
    assert sum("restored checkpoint" in line for line in run.printed) == 1, run.printed
    said = [line.split("] ", 1)[1] for line in run.printed]
    assert all(a != b for a, b in itertools.pairwise(said)), run.printed
    cycle1 = [line for line in run.printed if "cycle 1" in line]
    assert cycle1 and not any("iteration 20/" in line for line in cycle1), run.printed


def test_restore_and_iterations_seen_in_one_poll(tmp_path: Path) -> None:
    """A poll that sees the load and the first steps together still says the restore, once."""
    run = GrowingRun(tmp_path, REF_KILL, "reference")
    run.write(0, 30)
    run.inject()
    run.poll()
    run.write(1, 12)
    both = run.poll()
    assert both.describe().endswith("cycle 1 restored checkpoint 10, iteration 16/40")
    run.write(1, 13, start=12)
    assert run.poll().describe().endswith("cycle 1, iteration 17/40")


def test_marker_seen_after_the_restart_names_the_cycle_it_hit(tmp_path: Path) -> None:
    """Polled late (cycle 1 already started): the marker's restart count names cycle 0, whose
    last committed iteration is the fault's; the line goes on with cycle 1's own state."""
    run = GrowingRun(tmp_path, REF_KILL, "reference")
    run.write(0, 30)
    run.write(1, 4)
    run.inject()
    line = run.poll().describe()
    assert line.endswith(
        "cycle 0: fault injected into rank 1 (kill) at iteration 20, tracker at 10;"
        " cycle 1 starting"
    ), line


def test_marker_being_written_is_read_again(tmp_path: Path) -> None:
    """The injector claims the marker, then writes it: a partial marker is no fault yet."""
    run = GrowingRun(tmp_path, REF_KILL, "reference")
    run.write(0, 28)
    complete = (REF_KILL / "fault_injected.json").read_bytes()
    run.layout.marker.write_bytes(complete[:40])
    assert run.poll().fault is None
    run.layout.marker.write_bytes(complete)
    fault = run.poll().fault
    assert fault is not None and fault.marker.time is not None
    read = read_marker(run.layout.marker, run.layout.run_dir)
    assert read is not None and fault == InjectedFault(read, 0, 20)
    marker = fault.marker
    assert (marker.rank, marker.fault, marker.tracker_iteration) == (1, "kill", 10)


def test_megatron_restore_far_into_the_log(tmp_path: Path) -> None:
    """Megatron prints 'loading ...' 64 KB into a cycle log, after ~950 lines of setup, and
    'successfully loaded' later: restoring, then restored, then its own iterations."""
    run = GrowingRun(tmp_path, GPU_KILL, "megatron")
    run.write(0, len(run.lines(0)))
    run.inject()
    hit = run.poll()
    assert hit.describe().endswith(
        "cycle 0: fault injected into rank 0 (kill) at iteration 10, tracker at 5"
    )
    loading = 953  # "loading distributed checkpoint ... at iteration 5" is line 953
    assert b"loading distributed checkpoint" in run.lines(1)[loading - 1]
    run.write(1, loading - 1)
    assert run.poll().describe().endswith("cycle 1 starting")
    run.write(1, loading, start=loading - 1)
    assert run.poll().describe().endswith("cycle 1 restoring checkpoint 5")
    run.write(1, 980, start=loading)
    assert run.poll().describe().endswith("cycle 1 restored checkpoint 5")
    run.write(1, len(run.lines(1)), start=980)
    assert run.poll().describe().endswith("cycle 1, iteration 100/100")
    assert sum("fault injected" in line for line in run.printed) == 1, run.printed


def test_half_written_line_and_numeric_cycle_order(tmp_path: Path) -> None:
    run = GrowingRun(tmp_path, REF_KILL, "reference")
    line = run.lines(0)[26]  # "iteration 20/40 ..."
    for cycle in (9, 10):
        run.layout.cycle_log(cycle).write_bytes(line[:30])
    assert run.poll().cycle == 10  # by number, not by name ("train_cycle10" < "train_cycle9")
    assert run.poll().iteration is None  # not a line until its newline arrives
    with run.layout.cycle_log(10).open("ab") as fh:
        fh.write(line[30:])
    assert run.poll().iteration == 20


def test_read_progress_takes_the_workload_from_the_manifest(tmp_path: Path) -> None:
    layout = RunLayout.for_run(tmp_path / "run")
    layout.logs.mkdir(parents=True)
    layout.manifest.write_bytes((REF_KILL / "run.json").read_bytes())
    layout.cycle_log(1).write_bytes((REF_KILL / "logs" / "train_cycle1.log").read_bytes())
    progress = read_progress(layout, 0.0)
    assert (progress.cycle, progress.restored, progress.iteration) == (1, 10, 40)


def test_a_reader_without_a_workload_waits_for_run_json_to_decide(tmp_path: Path) -> None:
    """Polled before run.json is written, a reader given no workload does not settle on a
    workload then: once run.json names the reference workload, its iterations show."""
    layout = RunLayout.for_run(tmp_path / "run")
    layout.logs.mkdir(parents=True)
    reader = ProgressReader(layout)
    assert reader.read(0.0).iteration is None
    layout.manifest.write_bytes((REF_KILL / "run.json").read_bytes())
    layout.cycle_log(1).write_bytes((REF_KILL / "logs" / "train_cycle1.log").read_bytes())
    progress = reader.read(1.0)
    assert (progress.cycle, progress.restored, progress.iteration) == (1, 10, 40)


GPU_KILL_SAVE = DATA / "gpu-one-matrix" / "kill-save"
REF_HANG_FINALIZE = DATA / "windows" / "cpu" / "ref-hang-finalize"


def test_a_window_fault_is_told_from_its_marker(tmp_path: Path) -> None:
    """A Megatron kill in the save window (marker: tracker 5, save of 15 in flight) read while
    the cycle log showed no iteration yet said "before the first iteration", and read while it
    showed iteration 10 said "at iteration 10": the marker's save in flight and tracker, the
    verdict's evidence, are what the line says."""
    run = GrowingRun(tmp_path, GPU_KILL_SAVE, "megatron")
    run.write(0, 1012)  # setup, up to the line before "iteration 1/100"
    run.inject()
    early = run.poll()
    assert early.iteration is None and early.fault is not None
    said = early.describe()
    assert said.endswith(
        "cycle 0: fault injected into rank 0 (kill) in the save window: save of 15 in flight,"
        " tracker at 5"
    ), said
    assert "before the first iteration" not in said
    late = GrowingRun(tmp_path / "late", GPU_KILL_SAVE, "megatron")
    late.write(0, 1050)  # the log through iteration 10 only
    late.inject()
    lagging = late.poll()
    assert lagging.iteration is not None and lagging.iteration < 15
    assert lagging.describe().endswith("save of 15 in flight, tracker at 5"), lagging.describe()
    assert f"iteration {lagging.iteration}" not in lagging.describe().split("(kill)")[1]


def test_a_hang_waits_for_its_sections_deadline(tmp_path: Path) -> None:
    """A quiet wait says what it waits for and how long is left: a hung rank, by the deadline
    of the section its marker recorded open; a killed one, its restart; the run's time limit."""
    run = GrowingRun(tmp_path, REF_HANG_FINALIZE, "reference")
    run.write(0, len(run.lines(0)))
    run.inject()
    hung = run.poll()
    assert hung.fault is not None and hung.fault.marker.time is not None
    assert hung.fault.marker.section == "checkpointing"
    sections = SectionTimeouts(setup=900, step=30, checkpointing=30)
    twelve = hung.fault.marker.time + timedelta(seconds=12)
    line = replace(
        hung,
        waiting=waiting_for(
            hung, quiet_s=10, run_left_s=571.6, sections=sections, out_of_section_s=180, now=twelve
        ),
    ).describe()
    assert line.endswith(
        "; nothing new for 10 s, waiting for NVRx to detect the hung rank by the checkpointing"
        " section's 30 s deadline (~18 s left); the run's time limit in 572 s"
    ), line
    late = hung.fault.marker.time + timedelta(seconds=33)
    passed = waiting_for(hung, quiet_s=20, run_left_s=9, sections=sections, now=late)
    assert "(passed 3 s ago)" in passed and passed.endswith("time limit in 9 s"), passed
    killed_marker = replace(hung.fault.marker, fault="kill")
    killed = replace(hung, fault=replace(hung.fault, marker=killed_marker))
    assert "for NVRx to restart the workers after the kill;" in waiting_for(
        killed, quiet_s=10, run_left_s=100
    )
    starting = Progress(elapsed_s=3.0, cycle=None, iteration=None, total=None)
    assert "waiting for the first cycle's log" in waiting_for(starting, quiet_s=10, run_left_s=5)
    training = Progress(elapsed_s=3.0, cycle=1, iteration=16, total=40)
    assert "waiting for the iteration after 16;" in waiting_for(training, quiet_s=10, run_left_s=5)
