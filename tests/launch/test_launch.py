"""The launcher wrapper kills whole process trees on every exit path, and reports progress."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_nvrx.evidence.progress import Progress
from pytest_nvrx.launch.launcher import Launch, RunTimeout
from pytest_nvrx.launch.process_tree import kill_tree
from pytest_nvrx.launch.recipe import Recipe
from pytest_nvrx.launch.run_dir_setup import prepare_run_dir
from pytest_nvrx.launch.stop_signals import STOP_SIGNALS, Interrupted, interrupt_on_stop_signals
from pytest_nvrx.layout import TMP_ROOT, RunLayout
from pytest_nvrx.settings import RunConfig, WorkloadKind

SPAWNER = Path(__file__).parents[1] / "helpers" / "tree_spawner.py"


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
    tmp_path: Path,
    mode: str,
    argv: tuple[str, ...] | None = None,
    workload: WorkloadKind = "reference",
) -> tuple[Recipe, Path]:
    megatron_path = None
    if workload == "megatron":  # a stand-in checkout, as the launcher is a stand-in
        megatron_path = tmp_path / "megatron"
        megatron_path.mkdir()
        (megatron_path / "pretrain_gpt.py").write_text("")
    config = RunConfig(
        work_dir=tmp_path, run_id=f"fake-{mode}", workload=workload, megatron_path=megatron_path
    )
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
    # the spawner writes Megatron's iteration lines: progress reads them in the workload's format
    recipe, _ = fake_recipe(tmp_path, "progress", workload="megatron")
    seen: list[Progress] = []
    with Launch(recipe) as launch:
        launch.wait(30, on_progress=seen.append, poll_s=0.05)
    assert seen, "no progress reported"
    assert any(p.iteration is not None and p.total == 3 for p in seen)
    assert "cycle 0" in seen[-1].describe()


def test_a_quiet_wait_says_what_it_waits_for_every_10_seconds(tmp_path: Path) -> None:
    """A run that shows nothing new (a hung launcher here) still gets a line at least every
    10 s of the wait, saying what it waits for and how long is left of its time limit; a
    hang waited ~18 s for its deadline without a line."""
    recipe, pidfile = fake_recipe(tmp_path, "hang")
    now = [0.0]

    def sleep(seconds: float) -> None:  # the wait's own clock: 35 s pass in no time
        now[0] += seconds

    seen: list[Progress] = []
    with Launch(recipe) as launch, pytest.raises(RunTimeout):
        read_pids(pidfile)
        launch.wait(35, on_progress=seen.append, poll_s=1.0, clock=lambda: now[0], sleep=sleep)
    lines = [p.describe() for p in seen]
    assert lines[0].endswith("launcher starting") and seen[0].waiting is None, lines
    waits = [p.waiting for p in seen[1:]]
    assert waits == [
        f"nothing new for 10 s, waiting for the first cycle's log (rendezvous, workers"
        f" starting); the run's time limit in {left} s"
        for left in (25, 15, 5)
    ], lines
    assert all(
        line.split("] ", 1)[1].startswith("launcher starting; nothing new") for line in lines[1:]
    )


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
