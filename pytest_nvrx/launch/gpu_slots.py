"""The GPUs a scenario uses and one lock per GPU, so sessions on one host never share a GPU.

A GPU scenario holds an exclusive file lock for each GPU it can see while it runs: the devices in
``CUDA_VISIBLE_DEVICES`` when set, else every GPU ``nvidia-smi -L`` lists. Sessions that see
disjoint GPUs (two by-hand "nodes" on one host, ``CUDA_VISIBLE_DEVICES=0`` and ``=1``) run side
by side; sessions that overlap on any GPU run one after the other, under pytest-xdist too.
Locks are taken in sorted order, so two sessions never wait on each other crosswise. No pytest
here.

Devices are compared by the text that names them: a session naming GPUs by UUID and another by
index are not known to overlap.

**Slots** (:class:`GpuSlots`, for scenarios side by side: pytest_nvrx.session.launch_pool). A GPU
scenario runs on a set of GPUs of its own. Each GPU has ``share`` slots, each an exclusive file lock
(``/tmp/pytest-nvrx-gpu-<gpu>.lock`` for the first, the one :func:`gpu_locks` takes, then
``...-<gpu>.s<i>.lock``): a scenario takes one slot on each of the GPUs it needs, never blocking
while it holds others, so sessions, pytest-xdist workers and a pool never wait on each other
crosswise. With ``share`` 1 (the default) scenarios run on disjoint GPUs; a larger ``share`` lets
that many small scenarios use one GPU at once (a tiny GPT run leaves most of an H200 idle). The
scenario's launch gets ``CUDA_VISIBLE_DEVICES`` naming its GPUs.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from pytest_nvrx.megatron.stack import run_nvidia_smi

#: where the locks go unless --nvrx-gpu-lock-dir (NVRX_GPU_LOCK_DIR) names another: a container's
#: /tmp is its own, so containers that share a host's GPUs need a host directory mounted in each
LOCK_DIR = Path("/tmp")
LOCK_PREFIX = "pytest-nvrx-gpu-"


def lock_dir_of(given: Path | None) -> Path:
    """The lock directory of a session given ``given`` (--nvrx-gpu-lock-dir; None: not given)."""
    return LOCK_DIR if given is None else given


def smi_gpus() -> tuple[list[str], str | None]:
    """The GPUs ``nvidia-smi -L`` lists (its ``GPU i: ...`` lines), and why none are, if so:
    the one probe of the host's GPUs (the slots, and the plugin's check before a GPU scenario)."""
    try:
        out = run_nvidia_smi("-L")
    except subprocess.CalledProcessError:
        return [], "nvidia-smi lists no GPU"
    except (OSError, subprocess.SubprocessError) as exc:
        return [], f"nvidia-smi failed: {exc}"
    if out is None:
        return [], "no NVIDIA GPU (nvidia-smi not found)"
    listed = [line for line in out.splitlines() if line.startswith("GPU ")]
    return (listed, None) if listed else ([], "nvidia-smi lists no GPU")


def smi_gpu_count() -> int:
    """GPUs ``nvidia-smi -L`` lists; 0 when it is absent or fails."""
    return len(smi_gpus()[0])


def gpu_available() -> str | None:
    """None when an NVIDIA GPU is visible, else the reason why not."""
    return smi_gpus()[1]


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


def slot_lock_path(gpu: str, index: int, lock_dir: Path = LOCK_DIR) -> Path:
    """Slot ``index`` of ``gpu``; slot 0 is the lock sessions take (gpu_slots.gpu_locks)."""
    if index == 0:
        return lock_path(gpu, lock_dir)
    return lock_dir / f"{lock_path(gpu, lock_dir).stem}.s{index}.lock"


@dataclass
class Slot:
    """GPUs held for one scenario (none for a CPU scenario)."""

    gpus: tuple[str, ...]
    _locks: list[FileLock] = field(default_factory=list, repr=False)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.gpus)


class GpuSlots:
    """Hands out ``count`` GPUs at a time from ``gpus``, ``share`` scenarios per GPU at most."""

    def __init__(self, gpus: Sequence[str], *, share: int = 1, lock_dir: Path = LOCK_DIR) -> None:
        if share < 1:
            raise ValueError(f"share must be a positive integer, got {share}")
        self.gpus = tuple(dict.fromkeys(gpus))
        self.share = share
        self.lock_dir = lock_dir

    def capacity(self, count: int) -> int:
        """How many scenarios of ``count`` GPUs fit at once when nobody else holds a slot."""
        if count <= 0:
            return 0
        return (len(self.gpus) * self.share) // count if count <= len(self.gpus) else 0

    def try_take(self, count: int) -> Slot | None:
        """``count`` GPUs with a free slot each, or None (nothing held then). Never blocks.

        Least shared GPUs first: slot 0 of every GPU before slot 1 of any, so scenarios spread
        over the GPUs before they share one."""
        if count > len(self.gpus):
            raise ValueError(f"a scenario needs {count} GPUs, only {len(self.gpus)} are visible")
        taken: list[tuple[str, FileLock]] = []
        for index in range(self.share):
            for gpu in self.gpus:
                if len(taken) == count:
                    break
                if any(g == gpu for g, _ in taken):
                    continue
                lock = FileLock(str(slot_lock_path(gpu, index, self.lock_dir)), timeout=0)
                try:
                    lock.acquire()
                except Timeout:
                    continue
                taken.append((gpu, lock))
        if len(taken) < count:
            for _, lock in reversed(taken):
                lock.release()
            return None
        order = {gpu: i for i, gpu in enumerate(self.gpus)}
        taken.sort(key=lambda pair: order[pair[0]])
        return Slot(tuple(g for g, _ in taken), [lock for _, lock in taken])

    @staticmethod
    def release(slot: Slot) -> None:
        for lock in reversed(slot._locks):
            lock.release()
        slot._locks.clear()


class GpuLedger:
    """Which runs of the pool held which GPUs when: a run's recovery timings on a GPU that
    another run held meanwhile include that run's memory (NVRx waits until the whole GPU's
    memory is reclaimed) and its load. Thread-safe: the pool's waiting threads report."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # run id -> (its GPUs, started, ended or None while it runs)
        self._held: dict[str, tuple[frozenset[str], float, float | None]] = {}

    def started(self, run_id: str, gpus: Sequence[str]) -> None:
        with self._lock:
            self._held[run_id] = (frozenset(gpus), self._clock(), None)

    def ended(self, run_id: str) -> None:
        with self._lock:
            if run_id in self._held:
                gpus, began, _ = self._held[run_id]
                self._held[run_id] = (gpus, began, self._clock())

    def shared_with(self, run_id: str) -> list[str]:
        """The other runs that held one of ``run_id``'s GPUs at some moment of its run so far."""
        with self._lock:
            if run_id not in self._held:
                return []
            gpus, began, ended = self._held[run_id]
            until = ended if ended is not None else self._clock()
            return sorted(
                other
                for other, (theirs, start, end) in self._held.items()
                if other != run_id
                and gpus & theirs
                and start <= until
                and (end is None or end >= began)
            )
