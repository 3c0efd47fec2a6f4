"""GPU slots and the launch pool (pytest_nvrx.session.launch_pool), with real processes and real
file locks.

The pool's launches here are plain child processes that wait for a file, so the order of events is
decided by the test, never by timing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_nvrx.launch.gpu_slots import GpuSlots, Slot, slot_lock_path
from pytest_nvrx.session.launch_pool import Job, LaunchPool


class FileWaiter:
    """A child process that exits once ``release`` exists (at once when it is None); with
    ``announce``, it first creates that file (another job's release: that job then cannot end
    before this one has started, however loaded the machine)."""

    def __init__(
        self, release: Path | None, log: list[str], key: str, announce: Path | None = None
    ) -> None:
        self.release = release
        self.announce = announce
        self.log = log
        self.key = key
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> FileWaiter:
        code = (
            "import os, sys, time\n"
            "p, a = sys.argv[1:3]\n"
            "if a: open(a, 'w').close()\n"
            "while p and not os.path.exists(p): time.sleep(0.02)\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(self.release or ""), str(self.announce or "")],
            start_new_session=True,
        )
        self.log.append(f"start {self.key}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.log.append(f"exit {self.key}")

    def wait(self) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=120)

    def stop(self, grace_s: float = 5.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def _job(
    key: str,
    gpus: int,
    release: Path | None,
    log: list[str],
    slots: dict[str, Slot],
    announce: Path | None = None,
) -> Job[FileWaiter, int]:
    def make(slot: Slot) -> FileWaiter:
        slots[key] = slot
        return FileWaiter(release, log, key, announce)

    return Job(key, gpus, make, lambda launch: launch.wait())


def test_slots_spread_before_they_share(tmp_path: Path) -> None:
    slots = GpuSlots(["0", "1"], share=2, lock_dir=tmp_path)
    assert slots.capacity(1) == 4 and slots.capacity(2) == 2 and slots.capacity(3) == 0
    a, b, c = slots.try_take(1), slots.try_take(1), slots.try_take(1)
    assert a is not None and b is not None and c is not None
    assert [a.gpus, b.gpus, c.gpus] == [("0",), ("1",), ("0",)]
    d = slots.try_take(1)
    assert d is not None and d.gpus == ("1",)
    assert slots.try_take(1) is None
    GpuSlots.release(b)
    e = slots.try_take(1)
    assert e is not None and e.gpus == ("1",)


def test_slot_zero_is_the_sessions_gpu_lock(tmp_path: Path) -> None:
    from pytest_nvrx.launch.gpu_slots import lock_path

    assert slot_lock_path("3", 0, tmp_path) == lock_path("3", tmp_path)
    assert slot_lock_path("3", 1, tmp_path) == tmp_path / "pytest-nvrx-gpu-3.s1.lock"


def test_a_multi_gpu_take_that_does_not_fit_holds_nothing(tmp_path: Path) -> None:
    slots = GpuSlots(["0", "1"], lock_dir=tmp_path)
    one = slots.try_take(1)
    assert one is not None and one.gpus == ("0",)
    assert slots.try_take(2) is None
    # GPU 1 was taken and given back by the failed attempt
    two = slots.try_take(1)
    assert two is not None and two.gpus == ("1",)
    with pytest.raises(ValueError, match="needs 3 GPUs, only 2"):
        slots.try_take(3)


def test_another_process_holding_a_gpu_is_respected(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from pytest_nvrx.launch.gpu_slots import gpu_locks\n"
        f"with gpu_locks(['0'], lock_dir=Path({str(tmp_path)!r})):\n"
        "    print('held', flush=True); sys.stdin.read()\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
        slots = GpuSlots(["0", "1"], lock_dir=tmp_path)
        got = slots.try_take(1)
        assert got is not None and got.gpus == ("1",)
        assert slots.try_take(1) is None
    finally:
        assert other.stdin is not None
        other.stdin.close()
        other.wait(timeout=30)


def test_pool_runs_what_fits_and_starts_the_next_when_one_ends(tmp_path: Path) -> None:
    log: list[str] = []
    got: dict[str, Slot] = {}
    release = tmp_path / "release-b"
    pool: LaunchPool[int] = LaunchPool(
        max_parallel=4, slots=GpuSlots(["0", "1"], lock_dir=tmp_path)
    )
    b_started = tmp_path / "b-started"
    # a ends once b's process runs: started together, whatever the load (a that ended before
    # the pool recorded b's start made the clock check below fail on a loaded CI machine)
    pool.submit(_job("a", 1, b_started, log, got))
    pool.submit(_job("b", 1, release, log, got, announce=b_started))
    pool.submit(_job("c", 1, None, log, got))
    a = pool.wait_for("a")
    assert a.error is None and a.result == 0
    # a and b started together on the two GPUs; c waited for a's GPU and got it
    assert log[:2] == ["start a", "start b"]
    assert got["a"].gpus == ("0",) and got["b"].gpus == ("1",)
    assert "start c" in log and log.index("start c") > log.index("exit a")
    assert got["c"].gpus == ("0",)
    assert "exit b" not in log and "b" in pool.running()
    release.touch()
    b, c = pool.wait_for("b"), pool.wait_for("c")
    assert (b.result, c.result) == (0, 0)
    assert b.started_at < a.ended_at  # side by side, measured by the pool's own clock
    assert not pool.running()


def test_pool_max_parallel_holds_cpu_jobs_back(tmp_path: Path) -> None:
    log: list[str] = []
    got: dict[str, Slot] = {}
    release = tmp_path / "release"
    pool: LaunchPool[int] = LaunchPool(max_parallel=1)
    pool.submit(_job("x", 0, release, log, got))
    pool.submit(_job("y", 0, None, log, got))
    release.touch()
    y = pool.wait_for("y")
    assert y.result == 0 and got["x"].gpus == ()
    assert log == ["start x", "exit x", "start y", "exit y"]


def test_a_job_that_cannot_start_gives_its_slot_back(tmp_path: Path) -> None:
    slots = GpuSlots(["0"], lock_dir=tmp_path)

    def broken(slot: Slot) -> FileWaiter:
        raise RuntimeError("cannot start 'ft_launcher'")

    pool: LaunchPool[None] = LaunchPool(max_parallel=2, slots=slots)
    pool.submit(Job("bad", 1, broken, lambda launch: None))
    out = pool.wait_for("bad")
    assert isinstance(out.error, RuntimeError) and out.launch is None
    assert slots.try_take(1) is not None


def test_stop_all_stops_running_trees(tmp_path: Path) -> None:
    log: list[str] = []
    got: dict[str, Slot] = {}
    pool: LaunchPool[int] = LaunchPool(max_parallel=2)
    never = tmp_path / "never"
    pool.submit(_job("a", 0, never, log, got))
    pool.submit(_job("b", 0, None, log, got))
    pool.wait_for("b")
    assert pool.running() == ["a"]
    waiter = pool._running["a"][0].launch
    assert isinstance(waiter, FileWaiter) and waiter.proc is not None
    t0 = time.monotonic()
    pool.stop_all()
    assert waiter.proc.poll() is not None
    assert not pool.running() and "exit a" in log
    assert time.monotonic() - t0 < 60


def test_bad_pool_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="share"):
        GpuSlots(["0"], share=0)
    with pytest.raises(ValueError, match="max_parallel"):
        LaunchPool(max_parallel=0)
    pool: LaunchPool[None] = LaunchPool(max_parallel=1)
    with pytest.raises(ValueError, match="needs GPUs"):
        pool.submit(Job("g", 1, lambda s: FileWaiter(None, [], "g"), lambda launch: None))
    with pytest.raises(KeyError):
        pool.wait_for("missing")


class CauseRecorder(FileWaiter):
    causes: list[BaseException | None]

    def stop_for(self, cause: BaseException | None) -> None:
        self.causes.append(cause)
        self.stop()


def test_stop_all_tells_each_launch_the_cause(tmp_path: Path) -> None:
    log: list[str] = []
    made: list[CauseRecorder] = []

    def make(slot: Slot) -> CauseRecorder:
        waiter = CauseRecorder(tmp_path / "never", log, "a")
        waiter.causes = []
        made.append(waiter)
        return waiter

    pool: LaunchPool[int] = LaunchPool(max_parallel=2)
    pool.submit(Job("a", 0, make, lambda launch: launch.wait()))
    pool.submit(_job("b", 0, None, log, {}))
    pool.wait_for("b")
    cause = KeyboardInterrupt("SIGTERM")
    pool.stop_all(cause)
    assert made[0].causes == [cause]
    assert made[0].proc is not None and made[0].proc.poll() is not None


#: A session's test that takes a slot on GPU 0 through the pool its settings build (the lock
#: directory from --nvrx-gpu-lock-dir or NVRX_GPU_LOCK_DIR), says whether it got one, and holds
#: it until told to let go.
SLOT_TAKER = """
import os, time
from pathlib import Path
from pytest_nvrx.fixtures import nvrx_settings
from pytest_nvrx.session.scenario_pool import ScenarioPool

def test_take_gpu_0(pytestconfig):
    pool = ScenarioPool(nvrx_settings(pytestconfig), max_parallel=1, write=print, gpus=["0"])
    assert pool.pool.slots is not None
    slot = pool.pool.slots.try_take(1)
    Path(os.environ["TAKER_OUT"]).write_text("took" if slot is not None else "waits")
    release = Path(os.environ["TAKER_RELEASE"])
    while slot is not None and not release.exists():
        time.sleep(0.05)
"""


def test_two_sessions_with_one_gpu_lock_dir_never_share_a_gpu(
    tmp_path: Path, clean_env: None
) -> None:
    """Two pytest sessions given one --nvrx-gpu-lock-dir (containers of one host, each with its
    own /tmp, the directory mounted into both) see each other's GPU locks: the second cannot
    take the GPU the first holds; a session with another lock directory can."""
    (tmp_path / "test_taker.py").write_text(SLOT_TAKER)
    shared, other = tmp_path / "shared-locks", tmp_path / "other-locks"
    shared.mkdir()
    other.mkdir()
    (tmp_path / "at-once").touch()  # the later sessions let a GPU they took go at once
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    argv += ["-p", "no:xdist", str(tmp_path / "test_taker.py")]

    def env_of(name: str, release: str = "at-once", **more: str) -> dict[str, str]:
        files = {"TAKER_OUT": str(tmp_path / name), "TAKER_RELEASE": str(tmp_path / release)}
        return {**env, **files, **more}

    first = subprocess.Popen(
        [*argv, "--nvrx-gpu-lock-dir", str(shared)],
        env=env_of("first", release="release-first"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "first").exists() and first.poll() is None:
            assert time.monotonic() < deadline, "the first session never took GPU 0"
            time.sleep(0.1)
        assert (tmp_path / "first").read_text() == "took"
        assert (shared / "pytest-nvrx-gpu-0.lock").exists()
        later = [
            ("second", ["--nvrx-gpu-lock-dir", str(shared)], env_of("second")),
            ("by-env", [], env_of("by-env", NVRX_GPU_LOCK_DIR=str(shared))),
            ("elsewhere", ["--nvrx-gpu-lock-dir", str(other)], env_of("elsewhere")),
        ]
        for _, args, run_env in later:
            done = subprocess.run(
                [*argv, *args], env=run_env, cwd=tmp_path, capture_output=True, timeout=120
            )
            assert done.returncode == 0, done.stdout.decode()[-2000:]
        said = {name: (tmp_path / name).read_text() for name, _, _ in later}
        assert said == {"second": "waits", "by-env": "waits", "elsewhere": "took"}
    finally:
        (tmp_path / "release-first").touch()
        out, _ = first.communicate(timeout=60)
    assert first.returncode == 0, out.decode()[-2000:]
