"""One lock per GPU: sessions on disjoint GPUs run side by side, overlapping ones wait."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import Timeout

from pytest_nvrx.launch.gpu_slots import gpu_locks, lock_path, visible_gpus


@pytest.mark.parametrize(
    ("cvd", "gpus"),
    [("0", ["0"]), ("1, 0", ["1", "0"]), ("GPU-3f2a", ["GPU-3f2a"]), (None, ["0", "1", "2"])],
)
def test_visible_gpus(cvd: str | None, gpus: list[str]) -> None:
    env = {} if cvd is None else {"CUDA_VISIBLE_DEVICES": cvd}
    assert visible_gpus(env, count=3) == gpus


def test_lock_names_are_safe(tmp_path: Path) -> None:
    assert lock_path("../x", tmp_path).parent == tmp_path


def _holder(tmp_path: Path, gpus: list[str]) -> subprocess.Popen[str]:
    """Another session holding the locks of ``gpus`` until its stdin closes."""
    code = (
        "import sys; from pathlib import Path; from pytest_nvrx.launch.gpu_slots import gpu_locks\n"
        f"with gpu_locks({gpus!r}, lock_dir=Path({str(tmp_path)!r})):\n"
        "    print('held', flush=True); sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_disjoint_sessions_run_together_overlapping_ones_wait(tmp_path: Path) -> None:
    other = _holder(tmp_path, ["1"])
    try:
        with gpu_locks(["0"], lock_dir=tmp_path, timeout=0.5) as held:
            assert held == [tmp_path / "pytest-nvrx-gpu-0.lock"]
        t0 = time.monotonic()
        with pytest.raises(Timeout), gpu_locks(["0", "1"], lock_dir=tmp_path, timeout=0.5):
            pass
        assert time.monotonic() - t0 >= 0.5
        # what a failed attempt took is given back: GPU 0 is free again
        with gpu_locks(["0"], lock_dir=tmp_path, timeout=0.5):
            pass
    finally:
        assert other.stdin is not None
        other.stdin.close()
        other.wait(timeout=30)
    with gpu_locks(["0", "1"], lock_dir=tmp_path, timeout=0.5):
        pass
