"""The launcher wrapper kills whole process trees on every exit path, and reports progress."""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_nvrx.launch import (
    STOP_SIGNALS,
    InjectedFault,
    Interrupted,
    Launch,
    Progress,
    ProgressReader,
    RunTimeout,
    interrupt_on_stop_signals,
    kill_tree,
    read_progress,
)
from pytest_nvrx.layout import TMP_ROOT, RunLayout
from pytest_nvrx.recipe import Recipe
from pytest_nvrx.run_dir import prepare_run_dir
from pytest_nvrx.settings import RunConfig

SPAWNER = Path(__file__).parent / "helpers" / "tree_spawner.py"


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def fake_recipe(
    tmp_path: Path, mode: str, argv: tuple[str, ...] | None = None
) -> tuple[Recipe, Path]:
    config = RunConfig(work_dir=tmp_path, run_id=f"fake-{mode}", workload="reference")
    layout = prepare_run_dir(config)
    pidfile = tmp_path / f"{mode}.pids"
    if argv is None:
        argv = (sys.executable, str(SPAWNER), mode, str(pidfile), str(layout.run_dir))
    recipe = Recipe(
        config=config,
        layout=layout,
        launcher_argv=argv,
        workload_argv=(),
        env={"TMPDIR": str(layout.tmp)},
        log_server_port=0,
        profile="default",
    )
    return recipe, pidfile


def read_pids(pidfile: Path, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pidfile.exists() and pidfile.read_text().strip():
            return [int(p) for p in pidfile.read_text().split()]
        time.sleep(0.05)
    raise AssertionError("spawner wrote no PIDs")


def test_orphans_in_other_sessions_are_killed_after_exit(tmp_path: Path) -> None:
    recipe, pidfile = fake_recipe(tmp_path, "exit-orphans")
    with Launch(recipe) as launch:
        result = launch.wait(30, poll_s=0.05)
    pids = read_pids(pidfile)
    assert result.exit_code == 0
    assert wait_gone(pids), "orphaned children in their own sessions survived"
    assert launch.tmpdir is not None and not launch.tmpdir.exists(), "per-run TMPDIR left behind"
    saved = json.loads((recipe.layout.run_dir / "result.json").read_text())
    assert saved["exit_code"] == 0 and saved["timed_out"] is False
    assert json.loads(recipe.layout.manifest.read_text())["run_id"] == "fake-exit-orphans"


def test_timeout_kills_tree_and_explains(tmp_path: Path) -> None:
    recipe, pidfile = fake_recipe(tmp_path, "hang")
    with Launch(recipe) as launch, pytest.raises(RunTimeout, match="Hint:") as info:
        read_pids(pidfile)
        launch.wait(0.5, poll_s=0.05)
    pids = [launch.pid or -1, *read_pids(pidfile)]
    assert wait_gone(pids)
    assert "did not finish within" in str(info.value)
    assert json.loads((recipe.layout.run_dir / "result.json").read_text())["timed_out"] is True


def test_exception_inside_context_kills_tree(tmp_path: Path) -> None:
    recipe, pidfile = fake_recipe(tmp_path, "hang")
    with pytest.raises(KeyError), Launch(recipe) as launch:
        read_pids(pidfile)
        raise KeyError("internal error")
    assert wait_gone([launch.pid or -1, *read_pids(pidfile)])


def test_keyboard_interrupt_kills_tree(tmp_path: Path) -> None:
    recipe, pidfile = fake_recipe(tmp_path, "hang")

    def interrupt(_: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), Launch(recipe) as launch:
        read_pids(pidfile)
        launch.wait(30, sleep=interrupt)
    assert wait_gone([launch.pid or -1, *read_pids(pidfile)])
    assert (
        json.loads((recipe.layout.run_dir / "result.json").read_text())["interrupted"] == "SIGINT"
    )


def test_stopped_process_is_killed(tmp_path: Path) -> None:
    recipe, pidfile = fake_recipe(tmp_path, "hang")
    with Launch(recipe) as launch:
        pids = read_pids(pidfile)
        os.kill(pids[0], 19)  # SIGSTOP, like an injected hang
    assert wait_gone([launch.pid or -1, *pids])


def test_progress_is_reported(tmp_path: Path) -> None:
    recipe, _ = fake_recipe(tmp_path, "progress")
    seen: list[Progress] = []
    with Launch(recipe) as launch:
        launch.wait(30, on_progress=seen.append, poll_s=0.05)
    assert seen, "no progress reported"
    assert any(p.iteration is not None and p.total == 3 for p in seen)
    assert "cycle 0" in seen[-1].describe()


def test_kill_tree_with_nothing_to_kill() -> None:
    assert kill_tree(None, "no-such-tag", grace_s=0.1) == set()


@pytest.fixture
def own_signal_handlers() -> Iterator[None]:
    """These tests change this process's handlers for the stop signals: put them back."""
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@pytest.mark.usefixtures("own_signal_handlers")
def test_sigterm_stops_tree_records_it_and_removes_tmpdir(tmp_path: Path) -> None:
    recipe, pidfile = fake_recipe(tmp_path, "hang")

    def terminate(_: float) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler raises in here

    with pytest.raises(Interrupted) as info, interrupt_on_stop_signals(), Launch(recipe) as launch:
        read_pids(pidfile)
        launch.wait(30, sleep=terminate)
    assert info.value.signal == signal.SIGTERM and info.value.exit_status == 143
    assert wait_gone([launch.pid or -1, *read_pids(pidfile)])
    saved = json.loads((recipe.layout.run_dir / "result.json").read_text())
    assert saved["interrupted"] == "SIGTERM"
    assert launch.tmpdir is not None and not launch.tmpdir.exists()


@pytest.mark.usefixtures("own_signal_handlers")
def test_signals_during_cleanup_do_not_cut_it_short(tmp_path: Path) -> None:
    """A signal every few milliseconds from the first one on: the tree still goes, result.json
    is still written, and only one Interrupted comes out."""
    recipe, pidfile = fake_recipe(tmp_path, "hang")
    done = threading.Event()

    def keep_signalling() -> None:
        while not done.is_set():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.005)

    pinger = threading.Thread(target=keep_signalling)
    try:
        with pytest.raises(Interrupted), interrupt_on_stop_signals(), Launch(recipe) as launch:
            pids = read_pids(pidfile)
            pinger.start()
            launch.wait(30, poll_s=0.01)
        time.sleep(0.2)  # absorbed after the cleanup too
    finally:
        done.set()
        if pinger.is_alive():
            pinger.join()
    assert wait_gone([launch.pid or -1, *pids], timeout=2.0)
    assert json.loads((recipe.layout.run_dir / "result.json").read_text())["interrupted"] == (
        "SIGTERM"
    )
    assert launch.tmpdir is not None and not launch.tmpdir.exists()


# A child that reports which of the stop signals it starts with ignored (/proc's SigIgn mask).
REPORT_IGNORED = """
import signal, sys
mask = int(next(l for l in open("/proc/self/status") if l.startswith("SigIgn:")).split()[1], 16)
names = [s.name for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if mask >> (s - 1) & 1]
open(sys.argv[1], "w").write(" ".join(names))
"""


@pytest.mark.usefixtures("own_signal_handlers")
def test_ignored_sigint_still_stops_and_nohup_is_respected(tmp_path: Path) -> None:
    """Started as a script's background job under nohup (SIGINT and SIGHUP ignored): SIGINT
    still interrupts us and the launcher starts with SIGINT at its default, while the hangup
    that nohup asked to survive stays ignored, here and in the launched tree."""
    report = tmp_path / "ignored.txt"
    recipe, _ = fake_recipe(tmp_path, "report", (sys.executable, "-c", REPORT_IGNORED, str(report)))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with interrupt_on_stop_signals():
        with Launch(recipe) as launch:
            launch.wait(30, poll_s=0.05)
        assert report.read_text() == "SIGHUP"
        os.kill(os.getpid(), signal.SIGHUP)  # ignored: nothing is raised
        time.sleep(0.1)
    with pytest.raises(Interrupted) as info, interrupt_on_stop_signals():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert info.value.signal == signal.SIGINT


def test_failed_start_leaves_no_tmpdir(tmp_path: Path) -> None:
    recipe, _ = fake_recipe(tmp_path, "nostart", (str(tmp_path / "no-such-launcher"),))
    launch = Launch(recipe)
    with pytest.raises(RuntimeError, match="cannot start"), launch:
        pass
    assert not recipe.layout.tmp.exists()
    assert launch.tmpdir is None or not launch.tmpdir.exists()
    assert not list(TMP_ROOT.glob("nvrx-fake-nostart-*"))


# ---------------------------------------------------------------------------------------------
# progress lines, on run dirs grown line by line from committed real logs

DATA = Path(__file__).parent / "data"
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
    assert hit.describe().endswith("cycle 0: fault injected into rank 1 at iteration 20 (kill)")
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
        "cycle 0: fault injected into rank 1 at iteration 20 (kill); cycle 1 starting"
    ), line


def test_marker_being_written_is_read_again(tmp_path: Path) -> None:
    """The injector claims the marker, then writes it: a partial marker is no fault yet."""
    run = GrowingRun(tmp_path, REF_KILL, "reference")
    run.write(0, 28)
    complete = (REF_KILL / "fault_injected.json").read_bytes()
    run.layout.marker.write_bytes(complete[:40])
    assert run.poll().fault is None
    run.layout.marker.write_bytes(complete)
    assert run.poll().fault == InjectedFault(rank=1, fault="kill", cycle=0, iteration=20)


def test_megatron_restore_far_into_the_log(tmp_path: Path) -> None:
    """Megatron prints 'loading ...' 64 KB into a cycle log, after ~950 lines of setup, and
    'successfully loaded' later: restoring, then restored, then its own iterations."""
    run = GrowingRun(tmp_path, GPU_KILL, "megatron")
    run.write(0, len(run.lines(0)))
    run.inject()
    hit = run.poll()
    assert hit.describe().endswith("cycle 0: fault injected into rank 0 at iteration 10 (kill)")
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


def test_wait_sees_the_launcher_exit_at_once(tmp_path: Path) -> None:
    """No fixed sleep between polls: a launcher that exits after 0.2 s is seen then, not at the
    next 30 s poll."""
    recipe, _ = fake_recipe(
        tmp_path, "quick", (sys.executable, "-c", "import time; time.sleep(0.2)")
    )
    with Launch(recipe) as launch:
        started = time.monotonic()
        result = launch.wait(60, poll_s=30)
        waited = time.monotonic() - started
    assert result.exit_code == 0
    assert waited < 5, f"wait took {waited:.1f}s for a 0.2 s launcher"


def test_cycle_log_paths_in_numeric_order(tmp_path: Path) -> None:
    layout = RunLayout.for_run(tmp_path / "run")
    assert layout.cycle_log_paths() == {}  # no logs directory yet
    layout.logs.mkdir(parents=True)
    for name in ("train_cycle10.log", "train_cycle9.log", "train_cycle2.log", "launcher.log",
                 "train_cycle1.log.tmp", "train_cyclex.log"):  # fmt: skip
        (layout.logs / name).write_text("")
    paths = layout.cycle_log_paths()
    assert list(paths) == [2, 9, 10]
    assert paths[10] == layout.cycle_log(10)
