"""The injector as ft_launcher runs it, for tests: a plain script in a subprocess of its own
session (:class:`Launcher`, :class:`Scenario`, :class:`Run`), and an armed selected rank in this
process (:class:`Windows`: the probes, with fault "exception" raising instead of killing us).
Shared by tests/worker/test_injector.py, tests/worker/test_injector_schedule.py and
tests/conftest.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.layout import MARKER_NAME, TRACKER_NAME
from pytest_nvrx.worker import injector

INJECTOR = Path(injector.__file__).resolve()


REPO = Path(__file__).resolve().parents[2]


HELPERS = Path(__file__).resolve().parent


TRAINER = HELPERS / "injector_trainer.py"


WAIT_S = 30.0


MARKER_KEYS = {
    "schema_version",
    "fault",
    "signal",
    "rank",
    "local_rank",
    "world_size",
    "restart_count",
    "run_id",
    "plant",
    "pid",
    "host",
    "tracker",
    "tracker_iteration",
    "baseline_iteration",
    "time",
    "argv",
    "rank_pid",
    "window",
    "trigger",
    "in_flight_iteration",
    "section",
    "write_done",
}


@dataclass
class Run:
    """One injector process and the files it wrote."""

    cmd: list[str]
    proc: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def describe(self) -> str:
        return f"command: {self.cmd}\nstderr tail:\n{self.stderr[-3000:]}"

    def wait(self, timeout: float = WAIT_S) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            pytest.fail(f"injector still running after {timeout} s\n{self.describe()}")


@dataclass
class Scenario:
    """The paths of one run: checkpoint dir with tracker, run dir with marker."""

    root: Path
    ckpt: Path = field(init=False)
    run_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.ckpt = self.root / "checkpoints"
        self.run_dir = self.root / "run"
        self.ckpt.mkdir()
        self.run_dir.mkdir()

    @property
    def tracker(self) -> Path:
        return self.ckpt / TRACKER_NAME

    @property
    def marker(self) -> Path:
        return self.run_dir / MARKER_NAME

    @property
    def started(self) -> Path:
        return self.root / "started.json"

    @property
    def finished(self) -> Path:
        return self.root / "finished"

    def marker_record(self) -> dict[str, Any]:
        data = json.loads(self.marker.read_text())
        assert isinstance(data, dict)
        return data


class Launcher:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: list[Run] = []

    def start(
        self,
        sc: Scenario,
        *,
        fault: str = "kill",
        rank: int | None = 1,
        fault_rank: int = 1,
        trainer: Sequence[str] = (),
        module: bool = False,
        extra_env: dict[str, str] | None = None,
        checkpoint_dir: Path | None = None,
        schedule: str | None = None,
    ) -> Run:
        entry = ["--module", TRAINER.stem] if module else ["--script", str(TRAINER)]
        what = ["--fault", fault] if schedule is None else ["--schedule", schedule]
        cmd = [
            sys.executable,
            str(INJECTOR),
            "--checkpoint-dir",
            str(checkpoint_dir or sc.ckpt),
            "--fault-marker",
            str(sc.marker),
            *what,
            "--fault-rank",
            str(fault_rank),
            *entry,
            "--",
            "--tracker",
            str(sc.tracker),
            "--started",
            str(sc.started),
            "--finished",
            str(sc.finished),
            *trainer,
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if rank is not None:
            env["RANK"] = str(rank)
        env.update(extra_env or {})
        n = len(self.runs)
        out, err = self.root / f"injector{n}.out", self.root / f"injector{n}.err"
        with out.open("wb") as fo, err.open("wb") as fe:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=fo,
                stderr=fe,
                env=env,
                cwd=HELPERS if module else self.root,
                start_new_session=True,
            )
        run = Run(cmd, proc, out, err)
        self.runs.append(run)
        return run

    def kill_all(self) -> None:
        for run in self.runs:
            kill_group(run.proc)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    # The process leads its own session, so its pid is the group id; SIGKILL ends stopped ones too.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def proc_state(pid: int) -> str:
    stat_line = Path(f"/proc/{pid}/stat").read_text()
    return stat_line[stat_line.rindex(")") + 2]


@dataclass
class Windows:
    """An armed selected rank in this process: the injection, its probes and its files."""

    tmp: Path
    window: str
    fault: str = "exception"
    baseline: int = 0

    def __post_init__(self) -> None:
        self.tracker = self.tmp / TRACKER_NAME
        self.marker = self.tmp / MARKER_NAME
        opts = injector.Options(
            checkpoint_dir=str(self.tmp),
            fault_marker=str(self.marker),
            fault=self.fault,
            fault_rank=1,
            window=self.window,
            script=None,
            module="train",
            poll_interval=0.05,
            workload_args=(),
        )
        self.injection = injector.Injection(opts, rank=1, baseline=self.baseline)
        self.probes = injector.WindowProbes(self.injection)

    def complete(self, iteration: int) -> None:
        self.tracker.write_text(str(iteration))

    def submit(self, iteration: int, result: Any = None) -> None:
        path = self.tmp / f"iter_{iteration:07d}"
        self.probes.submit_entry(path)
        self.probes.submit_return(path, result)

    def save(self, iteration: int, result: Any = None) -> None:
        """A save as both workloads do it: the submit inside a checkpointing section."""
        self.probes.section_started("checkpointing")
        self.submit(iteration, result)
        self.probes.section_ended("checkpointing")

    def record(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.marker.read_text())
        return data
