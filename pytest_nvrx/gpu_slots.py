"""The GPUs a scenario uses and one lock per GPU, so sessions on one host never share a GPU.

A GPU scenario holds an exclusive file lock for each GPU it can see while it runs: the devices in
``CUDA_VISIBLE_DEVICES`` when set, else every GPU ``nvidia-smi -L`` lists. Sessions that see
disjoint GPUs (two by-hand "nodes" on one host, ``CUDA_VISIBLE_DEVICES=0`` and ``=1``) run side
by side; sessions that overlap on any GPU run one after the other, under pytest-xdist too.
Locks are taken in sorted order, so two sessions never wait on each other crosswise. No pytest
here.

Devices are compared by the text that names them: a session naming GPUs by UUID and another by
index are not known to overlap.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

LOCK_DIR = Path("/tmp")
LOCK_PREFIX = "pytest-nvrx-gpu-"


def smi_gpu_count() -> int:
    """GPUs ``nvidia-smi -L`` lists; 0 when it is absent or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if out.returncode != 0:
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def visible_gpus(environ: Mapping[str, str] | None = None, count: int | None = None) -> list[str]:
    """The names of the GPUs a run started with ``environ`` can use."""
    env = os.environ if environ is None else environ
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is not None and raw.strip():
        return [part.strip() for part in raw.split(",") if part.strip()]
    n = smi_gpu_count() if count is None else count
    return [str(i) for i in range(n)]


def lock_path(gpu: str, lock_dir: Path = LOCK_DIR) -> Path:
    return lock_dir / f"{LOCK_PREFIX}{re.sub(r'[^A-Za-z0-9_.-]', '_', gpu)}.lock"


@contextmanager
def gpu_locks(
    gpus: Sequence[str], *, lock_dir: Path = LOCK_DIR, timeout: float = -1
) -> Iterator[list[Path]]:
    """Hold the lock of every GPU in ``gpus`` (``timeout`` < 0: wait as long as it takes;
    filelock.Timeout otherwise). Released on every exit path."""
    paths = [lock_path(gpu, lock_dir) for gpu in sorted(set(gpus))]
    held: list[FileLock] = []
    try:
        for path in paths:
            lock = FileLock(str(path), timeout=timeout)
            lock.acquire()
            held.append(lock)
        yield paths
    finally:
        for lock in reversed(held):
            lock.release()
