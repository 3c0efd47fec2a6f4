"""Fault schedules (``--schedule F@W[,F@W...]``) and the ``restore`` window of the injector.

Like tests/worker/test_injector.py, the injector runs as ft_launcher runs it: a plain script in a
subprocess of its own session, over tiny workloads. One process is one training cycle; a cycle's
replacement is the next process started on the same run directory. The ``restore`` window is
driven by fake library modules placed beside the workload script (its directory comes first on
sys.path, so they shadow the real torch and Megatron) and, for the name bindings that matter, by
real torch in a fresh interpreter.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.layout import MARKER_NAME
from pytest_nvrx.worker import injector
from pytest_nvrx.worker.injector import Firing, build_marker_record, scheduled_marker_path
from tests.helpers.injector_launcher import (
    INJECTOR,
    MARKER_KEYS,
    REPO,
    TRAINER,
    WAIT_S,
    Launcher,
    Run,
    Scenario,
    Windows,
)

SCHEDULE_KEYS = {"schedule", "schedule_position"}


@pytest.fixture(autouse=True)
def _no_late_stack_dump() -> Iterator[None]:
    """The exception fault arms faulthandler's one-shot stack dump; never in this process."""
    yield
    faulthandler.cancel_dump_traceback_later()


def marker_at(sc: Scenario, position: int) -> Path:
    return Path(scheduled_marker_path(str(sc.marker), position))


def read_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


def schedule_argv(sc: Scenario, *what: str) -> list[str]:
    return [
        "--checkpoint-dir",
        str(sc.ckpt),
        "--fault-marker",
        str(sc.marker),
        *what,
        "--fault-rank",
        "1",
        "--script",
        str(TRAINER),
    ]


# --- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("what", "message"),
    [
        (["--schedule", ""], "entry 1 is empty"),
        (["--schedule", "kill@step,,kill@step"], "entry 2 is empty"),
        (["--schedule", "kill@step,"], "entry 2 is empty"),
        (["--schedule", "kill"], "entry 1 'kill' is not FAULT@WINDOW"),
        (["--schedule", "kill@step,crash@step"], "entry 2 'crash@step': unknown fault 'crash'"),
        (["--schedule", "none@step"], "entry 1 'none@step': unknown fault 'none'"),
        (["--schedule", "kill@step,kill@later"], "unknown window 'later'"),
        (["--schedule", "kill@restore"], "window restore needs an earlier fault"),
        (["--schedule", "kill@restore,kill@step"], "so it cannot come first"),
        (
            ["--schedule", "kill@step,ckpt-worker@save"],
            "entry 2 'ckpt-worker@save': fault ckpt-worker needs window finalize",
        ),
        (["--schedule", "kill@step", "--window", "step"], "--window goes only with --fault"),
        (
            ["--fault", "kill", "--window", "restore"],
            "--window restore exists only in a --schedule, as its 2nd or later entry",
        ),
        (["--schedule", "kill@step", "--fault", "kill"], "not allowed with argument"),
        ([], "one of the arguments --fault --schedule is required"),
    ],
    ids=[
        "empty",
        "empty-middle",
        "empty-last",
        "no-at",
        "unknown-fault",
        "fault-none",
        "unknown-window",
        "restore-alone",
        "restore-first",
        "ckpt-worker-outside-finalize",
        "window-with-schedule",
        "restore-with-fault",
        "fault-and-schedule",
        "neither",
    ],
)
def test_bad_schedules_exit_2(
    sc: Scenario, what: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        injector.main(schedule_argv(sc, *what))
    assert exc.value.code == injector.EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err, err
    assert not sc.started.exists()


def test_a_schedule_parses_into_ordered_entries(sc: Scenario) -> None:
    opts = injector.parse_args(
        schedule_argv(sc, "--schedule", "kill@step,exception@restore,ckpt-worker@finalize")
    )
    assert opts.schedule == (
        ("kill", "step"),
        ("exception", "restore"),
        ("ckpt-worker", "finalize"),
    )
    assert opts.schedule_names == ["kill@step", "exception@restore", "ckpt-worker@finalize"]
    assert (opts.fault, opts.window, opts.schedule_position) == ("kill", "step", 0)
    assert opts.fault_marker == str(sc.marker)
    armed = opts.armed(2)
    assert (armed.fault, armed.window, armed.schedule_position) == ("exception", "restore", 2)
    assert armed.fault_marker == str(sc.run_dir / "fault_injected_2.json")
    assert armed.schedule == opts.schedule


def test_a_plain_fault_parses_as_before(sc: Scenario) -> None:
    opts = injector.parse_args(schedule_argv(sc, "--fault", "kill"))
    assert (opts.fault, opts.window, opts.schedule, opts.schedule_position) == (
        "kill",
        "step",
        (),
        0,
    )
    assert opts.describe_fault() == "kill on rank 1"
    assert injector.SCHEDULE_WINDOWS == ("restore",)
    assert not set(injector.SCHEDULE_WINDOWS) & set(injector.WINDOWS)


def test_scheduled_marker_path() -> None:
    first = "/run/fault_injected.json"
    assert scheduled_marker_path(first, 1) == first
    assert scheduled_marker_path(first, 2) == "/run/fault_injected_2.json"
    assert scheduled_marker_path(first, 12) == "/run/fault_injected_12.json"
    assert scheduled_marker_path("/a.b/marker", 3) == "/a.b/marker_3"
    assert scheduled_marker_path("/r/m.tar.gz", 2) == "/r/m.tar_2.gz"
    with pytest.raises(ValueError, match="start at 1"):
        scheduled_marker_path(first, 0)


# --- which fault a selected rank arms ----------------------------------------------------------


def _armed(sc: Scenario, schedule: str) -> injector.Injection | None:
    opts = injector.parse_args(schedule_argv(sc, "--schedule", schedule))
    return injector._prepare_injection(opts, rank=1)


def test_position_1_is_armed_without_markers(
    sc: Scenario, capfd: pytest.CaptureFixture[str]
) -> None:
    armed = _armed(sc, "kill@step,hang@save,term@restore")
    assert armed is not None
    assert (armed.opts.schedule_position, armed.opts.fault, armed.opts.window) == (
        1,
        "kill",
        "step",
    )
    assert armed.opts.fault_marker == str(sc.marker)
    err = capfd.readouterr().err
    assert "arming fault 1 of 3 (kill@step)" in err
    assert "to inject kill (SIGKILL) in window step" in err


def test_position_k_is_the_first_absent_marker(
    sc: Scenario, capfd: pytest.CaptureFixture[str]
) -> None:
    sc.marker.write_text("{}\n")
    armed = _armed(sc, "kill@step,hang@save,term@restore")
    assert armed is not None
    assert (armed.opts.schedule_position, armed.opts.fault, armed.opts.window) == (
        2,
        "hang",
        "save",
    )
    assert armed.opts.fault_marker == str(marker_at(sc, 2))
    marker_at(sc, 2).write_text("{}\n")
    armed = _armed(sc, "kill@step,hang@save,term@restore")
    assert armed is not None
    assert (armed.opts.schedule_position, armed.opts.window) == (3, "restore")
    assert armed.opts.fault_marker == str(sc.run_dir / "fault_injected_3.json")
    err = capfd.readouterr().err
    assert "arming fault 3 of 3 (term@restore)" in err
    assert "to inject term (SIGTERM) in window restore" in err


def test_every_marker_present_means_no_injection(
    sc: Scenario, capfd: pytest.CaptureFixture[str]
) -> None:
    for k in (1, 2):
        marker_at(sc, k).write_text("{}\n")
    assert _armed(sc, "kill@step,kill@step") is None
    err = capfd.readouterr().err
    assert f"marker {marker_at(sc, 2)} exists: fault already injected (all 2 scheduled" in err


@pytest.mark.parametrize(
    ("present", "absent", "later"),
    [((2,), 1, 2), ((1, 3), 2, 3)],
    ids=["2-without-1", "3-without-2"],
)
def test_a_later_marker_without_an_earlier_one_exits_2(
    sc: Scenario,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    present: tuple[int, ...],
    absent: int,
    later: int,
) -> None:
    monkeypatch.setenv("RANK", "1")
    for k in present:
        marker_at(sc, k).write_text("{}\n")
    argv = [*schedule_argv(sc, "--schedule", "kill@step,kill@step,kill@step"), "--"]
    assert injector.main(argv) == injector.EXIT_USAGE
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "ERROR" in line]
    assert len(lines) == 1, err
    assert (
        f"schedule markers out of order: {marker_at(sc, later)} exists but "
        f"{marker_at(sc, absent)} does not" in lines[0]
    )
    assert not sc.started.exists()


def test_a_symlink_at_a_later_marker_exits_2(
    sc: Scenario, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANK", "1")
    marker_at(sc, 2).symlink_to(sc.root / "elsewhere.json")
    assert injector.main(schedule_argv(sc, "--schedule", "kill@step,kill@step")) == 2
    assert f"marker path {marker_at(sc, 2)} is a symbolic link" in capfd.readouterr().err
    assert not (sc.root / "elsewhere.json").exists()


# --- consecutive cycles over a real subprocess each ------------------------------------------


def test_a_two_fault_schedule_over_three_cycles(launcher: Launcher, sc: Scenario) -> None:
    schedule = "kill@step,kill@step"
    # cycle 1: fault 1 fires once the tracker advanced past 0
    first = launcher.start(
        sc,
        schedule=schedule,
        trainer=["--values", "1,2,3", "--delay", "0.2", "--interval", "0.5", "--hold", "20"],
    )
    assert first.wait() == -signal.SIGKILL, first.describe()
    one = read_json(sc.marker)
    assert set(one) == MARKER_KEYS | SCHEDULE_KEYS
    assert (one["schedule"], one["schedule_position"]) == (["kill@step", "kill@step"], 1)
    assert (one["fault"], one["window"], one["baseline_iteration"]) == ("kill", "step", 0)
    assert one["pid"] == first.proc.pid
    assert not marker_at(sc, 2).exists()
    assert "arming fault 1 of 2 (kill@step)" in first.stderr
    one_bytes = sc.marker.read_bytes()

    # cycle 2: the replacement arms fault 2; its baseline is the tracker it starts with, so the
    # restored checkpoint (written again, as a resuming trainer might) does not fire it: only
    # the checkpoint this cycle completes, written last, does
    start = int(sc.tracker.read_text())
    assert start >= one["tracker_iteration"]
    second = launcher.start(
        sc,
        schedule=schedule,
        trainer=[
            *("--values", f"{start},{start},{start},{start + 1}"),
            *("--delay", "0.2", "--interval", "0.3", "--hold", "20"),
        ],
    )
    assert second.wait() == -signal.SIGKILL, second.describe()
    two = read_json(marker_at(sc, 2))
    assert set(two) == MARKER_KEYS | SCHEDULE_KEYS
    assert (two["schedule"], two["schedule_position"]) == (["kill@step", "kill@step"], 2)
    assert (two["baseline_iteration"], two["tracker_iteration"]) == (start, start + 1)
    assert (two["window"], two["trigger"], two["pid"]) == ("step", "tracker poll", second.proc.pid)
    assert sc.marker.read_bytes() == one_bytes
    assert "arming fault 2 of 2 (kill@step)" in second.stderr
    assert f"baseline {start}" in second.stderr
    assert not sc.finished.exists()

    # cycle 3: every fault of the schedule happened: the workload runs to its end
    two_bytes = marker_at(sc, 2).read_bytes()
    third = launcher.start(
        sc,
        schedule=schedule,
        trainer=["--values", f"{start + 2},{start + 3}", "--interval", "0.2", "--hold", "0.3"],
    )
    assert third.wait() == 0, third.describe()
    assert sc.finished.exists()
    assert (sc.marker.read_bytes(), marker_at(sc, 2).read_bytes()) == (one_bytes, two_bytes)
    assert sorted(p.name for p in sc.run_dir.iterdir()) == [MARKER_NAME, "fault_injected_2.json"]
    assert "fault already injected (all 2 scheduled faults)" in third.stderr
    assert third.stderr.count("\n") == 1


def test_a_scheduled_fault_that_never_happens_exits_3_naming_it(
    launcher: Launcher, sc: Scenario
) -> None:
    sc.marker.write_text("{}\n")
    sc.tracker.write_text("4")
    run = launcher.start(sc, schedule="kill@step,kill@step,kill@step", trainer=["--hold", "0.2"])
    assert run.wait() == injector.EXIT_FAULT_NOT_INJECTED, run.describe()
    assert (
        "ERROR: the requested fault (scheduled fault 2 of 3, kill@step on rank 1) never happened: "
        "window step never opened while training ran (baseline 4, highest tracker read none"
    ) in run.stderr
    assert sc.finished.exists()
    assert not marker_at(sc, 2).exists()


def test_a_schedule_on_another_rank_never_injects(launcher: Launcher, sc: Scenario) -> None:
    run = launcher.start(
        sc,
        rank=0,
        schedule="kill@step,kill@step",
        trainer=["--values", "1,2", "--interval", "0.2", "--hold", "0.3"],
    )
    assert run.wait() == 0, run.describe()
    assert list(sc.run_dir.iterdir()) == []
    assert sc.finished.exists()
    # rank 0's one line: it observes the tracker (none there, nothing read), never a fault's
    assert run.stderr.count("\n") == 1
    assert f"rank 0 pid {run.proc.pid}: reading checkpoint tracker {sc.tracker};" in run.stderr


# --- the restore window: fake checkpoint libraries beside the workload --------------------------


FAKE_DCP_PACKAGE = """\
# like torch.distributed.checkpoint: the package re-exports the loader's load
from .state_dict_loader import load
"""

FAKE_DCP_LOADER = """\
import os


def load(state_dict, *, checkpoint_id=None, storage_reader=None, planner=None,
         process_group=None, no_dist=False):
    with open(os.environ["FAKE_LOAD_RAN"], "a") as f:
        f.write(f"dcp {checkpoint_id}\\n")
"""

FAKE_MEGATRON = """\
import os


def save(sharded_state_dict, checkpoint_dir, *args, **kwargs):
    return None


def load(sharded_state_dict, checkpoint_dir, *args, **kwargs):
    with open(os.environ["FAKE_LOAD_RAN"], "a") as f:
        f.write(f"megatron {checkpoint_dir}\\n")
    return sharded_state_dict
"""

FAKE_WORKLOAD = """\
import json
import os
import sys

mode, ckpt_dir, finished = sys.argv[1:4]
path = os.path.join(ckpt_dir, "iter_0000005")
if mode == "dcp":  # as pytest_nvrx/workloads/ref_trainer.py imports and calls it
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    dcp_load({}, checkpoint_id=str(path), process_group=None)
elif mode == "dcp-package":
    import torch.distributed.checkpoint as dcp

    dcp.load({}, checkpoint_id=path)
elif mode == "dcp-reader":
    from torch.distributed.checkpoint import load

    class Reader:
        def __init__(self, path):
            self.path = path

    load({}, storage_reader=Reader(path))
elif mode == "megatron":
    from megatron.core import dist_checkpointing

    dist_checkpointing.load({}, path)
elif mode == "megatron-kw":
    from megatron.core import dist_checkpointing

    dist_checkpointing.load({}, checkpoint_dir=path)
elif mode == "release":
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    dcp_load({}, checkpoint_id=os.path.join(ckpt_dir, "release"))
elif mode == "wrapped":
    import torch.distributed.checkpoint as dcp
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint import state_dict_loader

    with open(os.environ["FAKE_REPORT"], "w") as f:
        json.dump(
            {
                "dcp_loader": hasattr(state_dict_loader.load, "__wrapped__"),
                "dcp_package": hasattr(dcp.load, "__wrapped__"),
                "megatron_load": hasattr(dist_checkpointing.load, "__wrapped__"),
                "megatron_save": hasattr(dist_checkpointing.save, "__wrapped__"),
            },
            f,
        )
elif mode != "none":
    raise SystemExit(f"unknown mode {mode}")
with open(finished, "w"):
    pass
"""


class FakeLibraries:
    """A workload directory with fake torch DCP and Megatron modules; runs the injector on it."""

    def __init__(self, launcher: Launcher, sc: Scenario) -> None:
        self.launcher = launcher
        self.sc = sc
        self.dir = sc.root / "workload"
        files = {
            "train.py": FAKE_WORKLOAD,
            "torch/__init__.py": "",
            "torch/distributed/__init__.py": "",
            "torch/distributed/checkpoint/__init__.py": FAKE_DCP_PACKAGE,
            "torch/distributed/checkpoint/state_dict_loader.py": FAKE_DCP_LOADER,
            "megatron/__init__.py": "",
            "megatron/core/__init__.py": "",
            "megatron/core/dist_checkpointing/__init__.py": FAKE_MEGATRON,
        }
        for name, text in files.items():
            path = self.dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        self.load_ran = sc.root / "load-ran"
        self.report = sc.root / "report.json"

    def start(self, mode: str, what: Sequence[str], *, rank: int = 1) -> Run:
        sc = self.sc
        cmd = [
            sys.executable,
            str(INJECTOR),
            *("--checkpoint-dir", str(sc.ckpt), "--fault-marker", str(sc.marker)),
            *what,
            *("--fault-rank", "1", "--script", str(self.dir / "train.py"), "--"),
            *(mode, str(sc.ckpt), str(sc.finished)),
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        env.update(
            PYTHONDONTWRITEBYTECODE="1",
            RANK=str(rank),
            FAKE_LOAD_RAN=str(self.load_ran),
            FAKE_REPORT=str(self.report),
        )
        n = len(self.launcher.runs)
        out, err = sc.root / f"fake{n}.out", sc.root / f"fake{n}.err"
        with out.open("wb") as fo, err.open("wb") as fe:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=fo,
                stderr=fe,
                env=env,
                cwd=sc.root,
                start_new_session=True,
            )
        run = Run(cmd, proc, out, err)
        self.launcher.runs.append(run)
        return run


@pytest.fixture
def fake(launcher: Launcher, sc: Scenario) -> FakeLibraries:
    return FakeLibraries(launcher, sc)


def _resumed(sc: Scenario, iteration: int = 5) -> None:
    """A replacement's start: fault 1 happened, the tracker names the checkpoint to resume."""
    sc.marker.write_text('{"fault": "kill"}\n')
    sc.tracker.write_text(str(iteration))


@pytest.mark.parametrize("mode", ["dcp", "dcp-package", "dcp-reader", "megatron", "megatron-kw"])
def test_restore_kills_the_replacement_as_it_starts_loading(
    fake: FakeLibraries, sc: Scenario, mode: str
) -> None:
    _resumed(sc)
    run = fake.start(mode, ["--schedule", "kill@step,kill@restore"])
    assert run.wait() == -signal.SIGKILL, run.describe()
    assert not fake.load_ran.exists(), "the original load ran before the fault"
    assert not sc.finished.exists()
    record = read_json(marker_at(sc, 2))
    assert set(record) == MARKER_KEYS | SCHEDULE_KEYS | {"load_iteration"}
    assert (record["window"], record["trigger"], record["load_iteration"]) == (
        "restore",
        "checkpoint load",
        5,
    )
    assert (record["tracker_iteration"], record["baseline_iteration"]) == (5, 5)
    assert (record["in_flight_iteration"], record["section"], record["write_done"]) == (
        None,
        None,
        None,
    )
    assert (record["schedule"], record["schedule_position"]) == (["kill@step", "kill@restore"], 2)
    assert (record["fault"], record["signal"], record["pid"]) == ("kill", "SIGKILL", run.proc.pid)
    assert (
        "window restore (checkpoint load): in-flight iteration none, tracker 5; marker "
        f"{marker_at(sc, 2)} written; sending SIGKILL to pid {run.proc.pid}"
    ) in run.stderr
    assert sc.marker.read_text() == '{"fault": "kill"}\n'


def test_restore_raises_the_exception_fault_before_the_load(
    fake: FakeLibraries, sc: Scenario
) -> None:
    _resumed(sc)
    run = fake.start("dcp", ["--schedule", "kill@step,exception@restore"])
    assert run.wait() == 1, run.describe()
    assert not fake.load_ran.exists()
    assert run.stderr.rstrip().splitlines()[-1] == (
        "InjectedFault: pytest-nvrx injected exception on rank 1 in window restore "
        "(in-flight iteration none, tracker 5)"
    )
    record = read_json(marker_at(sc, 2))
    assert (record["window"], record["signal"], record["load_iteration"]) == ("restore", None, 5)


def test_restore_never_opened_without_a_load_exits_3(fake: FakeLibraries, sc: Scenario) -> None:
    _resumed(sc)
    run = fake.start("none", ["--schedule", "kill@step,kill@restore,kill@step"])
    assert run.wait() == injector.EXIT_FAULT_NOT_INJECTED, run.describe()
    assert (
        "ERROR: the requested fault (scheduled fault 2 of 3, kill@restore on rank 1) never "
        "happened: window restore never opened: no checkpoint load started while training ran"
    ) in run.stderr
    assert sc.finished.exists()
    assert not marker_at(sc, 2).exists()


def test_restore_ignores_a_load_of_no_iteration_directory(
    fake: FakeLibraries, sc: Scenario
) -> None:
    _resumed(sc)
    run = fake.start("release", ["--schedule", "kill@step,kill@restore"])
    assert run.wait() == injector.EXIT_FAULT_NOT_INJECTED, run.describe()
    assert fake.load_ran.read_text() == f"dcp {sc.ckpt / 'release'}\n"
    assert (
        "(scheduled fault 2 of 2, kill@restore on rank 1) never happened: window restore never "
        f"opened: no checkpoint load could fire it (loads: {sc.ckpt / 'release'} (no iter_N "
        "directory))"
    ) in run.stderr


@pytest.mark.parametrize(
    ("what", "resumed", "loads"),
    [
        (["--fault", "kill"], False, False),
        (["--fault", "kill", "--window", "save"], False, False),
        (["--schedule", "kill@step,kill@restore"], False, False),  # arms kill@step
        (["--schedule", "kill@step,kill@restore"], True, True),
    ],
    ids=["fault-step", "fault-save", "schedule-step-armed", "schedule-restore-armed"],
)
def test_load_probes_only_for_the_restore_window(
    fake: FakeLibraries, sc: Scenario, what: list[str], resumed: bool, loads: bool
) -> None:
    if resumed:
        _resumed(sc)
    run = fake.start("wrapped", what)
    run.wait()  # exit 3: nothing fired (the report is what this test reads)
    assert read_json(fake.report) == {
        "dcp_loader": loads,
        "dcp_package": loads,
        "megatron_load": loads,
        "megatron_save": True,
    }


# --- the restore window's logic in-process (fault "exception" raises instead of killing us) ----


def test_restore_window_fires_at_the_load_entry_whatever_the_baseline(tmp_path: Path) -> None:
    w = Windows(tmp_path, "restore", baseline=5)
    w.complete(5)  # the checkpoint the replacement resumes from: no advance needed
    w.probes.section_started("step")  # a restore window never fires at a step or save
    w.save(10)
    w.probes.section_ended("step")
    assert not w.marker.exists()
    w.probes.section_started("checkpointing")
    with pytest.raises(injector.InjectedFault, match=r"window restore \(in-flight iteration none"):
        w.probes.load_entry(tmp_path / "iter_0000005")
    rec = w.record()
    assert set(rec) == MARKER_KEYS | {"load_iteration"}  # Windows arms no schedule
    assert (rec["window"], rec["trigger"], rec["section"]) == (
        "restore",
        "checkpoint load",
        "checkpointing",
    )
    assert (rec["tracker_iteration"], rec["baseline_iteration"], rec["load_iteration"]) == (
        5,
        5,
        5,
    )
    w.probes.load_entry(tmp_path / "iter_0000005")  # once only


def test_restore_window_needs_an_integer_tracker(tmp_path: Path) -> None:
    w = Windows(tmp_path, "restore")
    w.probes.load_entry(tmp_path / "iter_0000005")  # tracker absent
    w.tracker.write_text("release")
    w.probes.load_entry(tmp_path / "iter_0000005")
    w.probes.load_entry("/somewhere/else")
    assert not w.marker.exists()
    assert w.injection.error is None
    assert w.probes.never_fired() == (
        "window restore never opened: no checkpoint load could fire it (loads: iteration 5 "
        "(tracker absent); iteration 5 (tracker invalid: not an integer: 'release'); "
        "/somewhere/else (no iter_N directory))"
    )


def test_restore_window_never_opened_without_a_load(tmp_path: Path) -> None:
    w = Windows(tmp_path, "restore")
    w.complete(5)
    w.probes.section_started("step")
    assert w.probes.never_fired() == (
        "window restore never opened: no checkpoint load started while training ran"
    )


@pytest.mark.parametrize("window", ["step", "save", "finalize"])
def test_other_windows_never_fire_at_a_load(tmp_path: Path, window: str) -> None:
    w = Windows(tmp_path, window)
    w.complete(5)
    w.probes.load_entry(tmp_path / "iter_0000005")
    assert not w.marker.exists()
    assert w.probes.loads == []


# --- the marker record ------------------------------------------------------------------------


def _record(firing: Firing, **schedule: Any) -> dict[str, Any]:
    return build_marker_record(
        fault="kill",
        rank=1,
        firing=firing,
        baseline_iteration=5,
        tracker="/c/t",
        argv=["train.py"],
        env={},
        pid=7,
        rank_pid=7,
        host="h",
        now=datetime(2026, 1, 2, tzinfo=UTC),
        **schedule,
    )


def test_marker_record_of_a_schedule() -> None:
    step = Firing(window="step", trigger="tracker poll", tracker_iteration=10)
    assert set(_record(step)) == MARKER_KEYS
    rec = _record(step, schedule=["kill@step", "kill@restore"], schedule_position=1)
    assert set(rec) == MARKER_KEYS | SCHEDULE_KEYS
    assert (rec["schedule"], rec["schedule_position"]) == (["kill@step", "kill@restore"], 1)
    restore = Firing(
        window="restore", trigger="checkpoint load", tracker_iteration=5, load_iteration=5
    )
    rec = _record(restore, schedule=("kill@step", "kill@restore"), schedule_position=2)
    assert set(rec) == MARKER_KEYS | SCHEDULE_KEYS | {"load_iteration"}
    assert (rec["schedule"], rec["schedule_position"], rec["load_iteration"]) == (
        ["kill@step", "kill@restore"],
        2,
        5,
    )
    assert rec["schema_version"] == injector.MARKER_SCHEMA_VERSION == 2
    json.dumps(rec)


# --- real torch: the names the reference workload binds are the probed ones ---------------

REAL_DCP = """
import json, os, sys
from pathlib import Path

tmp, order = Path(sys.argv[1]), sys.argv[2]
if order == "before":  # the package imported before the finder was installed
    import torch.distributed.checkpoint
from pytest_nvrx.worker import injector

(tmp / "latest_checkpointed_iteration.txt").write_text("5")
opts = injector.Options(
    checkpoint_dir=str(tmp),
    fault_marker=str(tmp / "fault_injected.json"),
    fault="kill",
    fault_rank=1,
    window="step",
    script=None,
    module="train",
    poll_interval=0.05,
    workload_args=(),
    schedule=(("kill", "step"), ("exception", "restore")),
).armed(2)
injection = injector.Injection(opts, rank=1, baseline=5)
injector.install_probes(injector.Probes(injector.WindowProbes(injection), None))

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import state_dict_loader
from pytest_nvrx.workloads import ref_trainer

wrapped = state_dict_loader.load
out = {
    "module_wrapped": hasattr(wrapped, "__wrapped__"),
    "package_is_module": dcp.load is wrapped,
    "ref_trainer_is_module": ref_trainer.dcp_load is wrapped,
}
try:
    ref_trainer.dcp_load(
        {"x": torch.zeros(2)}, checkpoint_id=str(tmp / "iter_0000005"), no_dist=True
    )
except injector.InjectedFault as exc:
    out["raised"] = str(exc)
except Exception as exc:  # the original ran: the checkpoint does not exist
    out["raised"] = f"original load ran: {exc!r}"
print(json.dumps(out))
"""


@pytest.mark.parametrize("order", ["before", "after"])
def test_real_dcp_load_names_are_probed(tmp_path: Path, order: str) -> None:
    """The package re-export ``torch.distributed.checkpoint.load`` and the reference workload's
    ``from ...state_dict_loader import load as dcp_load`` are the wrapped function, whether the
    package was imported before the probes were installed or after."""
    proc = subprocess.run(
        [sys.executable, "-c", REAL_DCP, str(tmp_path), order],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=WAIT_S * 4,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {
        "module_wrapped": True,
        "package_is_module": True,
        "ref_trainer_is_module": True,
        "raised": "pytest-nvrx injected exception on rank 1 in window restore (in-flight "
        "iteration none, tracker 5)",
    }
    record = read_json(tmp_path / "fault_injected_2.json")
    assert (record["window"], record["load_iteration"], record["schedule_position"]) == (
        "restore",
        5,
        2,
    )
    assert record["schedule"] == ["kill@step", "exception@restore"]
