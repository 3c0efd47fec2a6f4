"""Scenarios side by side: a pool of concurrent launches on GPU slots
(:class:`pytest_nvrx.launch.gpu_slots.GpuSlots`). No pytest here.

**Pool.** :class:`LaunchPool` starts the queued jobs that fit (``max_parallel``, GPU slots), waits
for each in a thread of its own (``Launch.wait`` only polls and sleeps) and hands out the outcome
of the job asked for, starting queued jobs as others end. Every launch is started and stopped
from the calling thread; on an interruption (Ctrl-C, SIGTERM raised as ``Interrupted``) every
running launch's tree is stopped before the exception goes on.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_nvrx.launch.gpu_slots import GpuSlots, Slot

#: how often a waiting pool looks for a free slot or a finished job
POLL_S = 0.2


class Waitable(Protocol):
    """What the pool needs of a launch (pytest_nvrx.launch.launcher.Launch)."""

    def __enter__(self) -> Waitable: ...

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None: ...

    def stop(self, grace_s: float = 5.0) -> None: ...


@dataclass
class Job[L: Waitable, R]:
    """One launch to run: ``make(slot)`` builds it (``L``, not yet started) for the slot it got;
    ``wait(launch)`` (in a thread of the pool's) waits for it to end and returns its result
    (``R``, what the pool's outcome carries)."""

    key: str
    gpus: int  # GPUs it needs; 0: a CPU scenario
    make: Callable[[Slot], L]
    wait: Callable[[L], R]


@dataclass
class Outcome[R]:
    key: str
    slot: Slot
    launch: Waitable | None  # None when make() or starting it failed
    result: R | None = None  # what wait() returned
    error: BaseException | None = None  # what make(), start or wait() raised
    started_at: float = 0.0
    ended_at: float = 0.0


def _safe_key(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)


class LaunchPool[R]:
    """Runs queued jobs side by side; :meth:`wait_for` returns one job's outcome (``R``: what
    the jobs' ``wait`` returns)."""

    def __init__(
        self,
        *,
        max_parallel: int,
        slots: GpuSlots | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_parallel < 1:
            raise ValueError(f"max_parallel must be a positive integer, got {max_parallel}")
        self.max_parallel = max_parallel
        self.slots = slots
        self.clock = clock
        self._queue: list[Job[Any, R]] = []
        self._running: dict[str, tuple[Outcome[R], threading.Thread]] = {}
        self._done: dict[str, Outcome[R]] = {}
        self._changed = threading.Condition()

    @property
    def keys(self) -> set[str]:
        return {job.key for job in self._queue} | set(self._running) | set(self._done)

    def submit(self, job: Job[Any, R]) -> None:
        if job.key in self.keys:
            raise ValueError(f"job {job.key!r} was submitted already")
        if job.gpus and self.slots is None:
            raise ValueError(f"job {job.key!r} needs GPUs but the pool has no GPU slots")
        self._queue.append(job)

    def running(self) -> list[str]:
        return list(self._running)

    def _start_what_fits(self) -> None:
        for job in list(self._queue):
            if len(self._running) >= self.max_parallel:
                return
            if job.gpus:
                assert self.slots is not None
                slot = self.slots.try_take(job.gpus)
                if slot is None:
                    continue  # a smaller job behind it may fit
            else:
                slot = Slot(())
            self._queue.remove(job)
            self._start(job, slot)

    def _start(self, job: Job[Any, R], slot: Slot) -> None:
        outcome: Outcome[R] = Outcome(job.key, slot, None, started_at=self.clock())
        try:
            launch = job.make(slot)
            launch.__enter__()
        except BaseException as exc:
            outcome.error, outcome.ended_at = exc, self.clock()
            self._finish(outcome)
            if not isinstance(exc, Exception):
                raise
            return
        outcome.launch = launch

        def wait() -> None:
            try:
                outcome.result = job.wait(launch)
            except BaseException as exc:  # handed to the waiting caller
                outcome.error = exc
            finally:
                outcome.ended_at = self.clock()
                with self._changed:
                    self._changed.notify_all()

        thread = threading.Thread(target=wait, name=f"nvrx-{_safe_key(job.key)}", daemon=True)
        self._running[job.key] = (outcome, thread)
        thread.start()

    def _finish(self, outcome: Outcome[R]) -> None:
        if outcome.slot.gpus:
            GpuSlots.release(outcome.slot)
        self._done[outcome.key] = outcome

    def _reap(self) -> None:
        """Close the launches whose wait() returned; give their slots back."""
        for key, (outcome, thread) in list(self._running.items()):
            if thread.is_alive():
                continue
            thread.join()
            del self._running[key]
            try:
                assert outcome.launch is not None
                outcome.launch.__exit__(None, None, None)
            finally:
                self._finish(outcome)

    def wait_for(self, key: str) -> Outcome[R]:
        """The outcome of job ``key``, running the pool until it has one."""
        if key not in self.keys:
            raise KeyError(f"no job {key!r} in the pool")
        try:
            while key not in self._done:
                self._reap()
                self._start_what_fits()
                if key in self._done:
                    break
                with self._changed:
                    if not any(not t.is_alive() for _, t in self._running.values()):
                        self._changed.wait(POLL_S)
            # start the next ones before the caller judges this one
            self._reap()
            self._start_what_fits()
        except BaseException as exc:
            self.stop_all(exc)
            raise
        return self._done[key]

    def stop_all(self, cause: BaseException | None = None) -> None:
        """Stop every running launch's tree (the waiting threads then see it exit); a launch
        with ``stop_for`` is told the cause (a stop signal its result then names)."""
        for outcome, _ in self._running.values():
            if outcome.launch is None:
                continue
            stop_for = getattr(outcome.launch, "stop_for", None)
            if stop_for is not None:
                stop_for(cause)
            else:
                outcome.launch.stop()
        for key, (outcome, thread) in list(self._running.items()):
            thread.join(timeout=30)
            del self._running[key]
            if outcome.launch is not None:
                outcome.launch.__exit__(None, None, None)
            self._finish(outcome)
        self._queue.clear()
