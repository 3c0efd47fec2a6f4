"""Fault schedules: several faults, one per training cycle, in order (issue #26).

``kill@step,hang@finalize,kill@restore`` injects a kill in a step of cycle 0, a hang in the
finalization of a save of cycle 1 (the first replacement), and a kill into cycle 2 while it loads
its checkpoint. ``random:3,seed=7`` draws such a list from the fault catalogue and the windows each
fault exists in; the draw is a pure function of the count and the seed, and the run records the
faults drawn, never the form.

Each fault is claimed once, on shared storage, before it is delivered: the injector
(pytest_nvrx.worker.injector, which repeats the syntax stdlib-only) writes the k-th fault's marker
(:func:`pytest_nvrx.layout.marker_name`) and arms the first fault whose marker is absent, so a
replacement never repeats a fault and never skips one. Pure: no file system, no clock.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Literal

from pytest_nvrx.layout import FAULT_WINDOWS, INJECTED_FAULTS, SCHEDULE_WINDOWS, windows_of
from pytest_nvrx.settings.values import ConfigError, quote

#: Every window a scheduled fault can have (restore only from the second fault on).
ALL_WINDOWS: tuple[str, ...] = (*FAULT_WINDOWS, *SCHEDULE_WINDOWS)
#: The faults that can strike a replacement while it loads: the checkpoint worker is idle then
#: (no save is in flight before the first iteration), so ckpt-worker has nothing to kill.
RESTORE_FAULTS: tuple[str, ...] = tuple(f for f in INJECTED_FAULTS if f != "ckpt-worker")
#: A random schedule's length is bounded (each fault costs a cycle and a restart).
MAX_SCHEDULE = 32

#: NVRx's progress tracker stops a job after this many consecutive cycles without progress
#: (``--ft-max-no-progress-cycles``, 3 in NVRx 0.7; the recipe leaves it at its default).
NVRX_NO_PROGRESS_LIMIT = 3
#: How a schedule's run ends: every fault recovered, the restart budget spent, NVRx's stop.
EndingKind = Literal["finished", "budget", "no-progress"]

_RANDOM_RE = re.compile(r"random:(?P<count>[0-9]+),seed=(?P<seed>[0-9]+)")


@dataclass(frozen=True, slots=True)
class ScheduledFault:
    """One fault of a schedule: what is injected and where in the training loop."""

    fault: str
    window: str

    def __str__(self) -> str:
        return f"{self.fault}@{self.window}"


def windows_at(fault: str, position: int) -> tuple[str, ...]:
    """The windows ``fault`` can have as the schedule's ``position``-th fault (1-based)."""
    windows = windows_of(fault)
    if position >= 2 and fault in RESTORE_FAULTS:
        windows = (*windows, *SCHEDULE_WINDOWS)
    return windows


def parse_schedule(raw: str, what: str) -> tuple[ScheduledFault, ...]:
    """``F@W[,F@W...]`` or ``random:N,seed=S``; ConfigError names ``what`` and the entry."""
    text = raw.strip()
    if text.startswith("random"):
        return _random_schedule(text, raw, what)
    if not text:
        raise ConfigError(f"{what}: give one or more FAULT@WINDOW, e.g. kill@step,kill@restore")
    out: list[ScheduledFault] = []
    for position, part in enumerate((p.strip() for p in text.split(",")), start=1):
        fault, at, window = part.partition("@")
        if not at or fault not in INJECTED_FAULTS or window not in ALL_WINDOWS:
            raise ConfigError(
                f"{what}: entry {position} {quote(part)} is not FAULT@WINDOW with FAULT one of "
                f"{', '.join(INJECTED_FAULTS)} and WINDOW one of {', '.join(ALL_WINDOWS)} "
                f"(e.g. kill@step,kill@restore), in {quote(raw)}"
            )
        allowed = windows_at(fault, position)
        if window not in allowed:
            raise ConfigError(f"{what}: entry {position} {quote(part)}: {_why_not(fault, window)}")
        out.append(ScheduledFault(fault, window))
    if len(out) > MAX_SCHEDULE:
        raise ConfigError(f"{what}: {len(out)} faults; a schedule has at most {MAX_SCHEDULE}")
    return tuple(out)


def _why_not(fault: str, window: str) -> str:
    if window in SCHEDULE_WINDOWS and fault in RESTORE_FAULTS:
        return (
            f"window {window} is a replacement's checkpoint load, so it needs a fault before it;"
            " it can be the second or a later fault of a schedule, never the first"
        )
    allowed = " or ".join(windows_of(fault))
    return f"fault {fault} is injected only in window {allowed}, not {window}"


def _random_schedule(text: str, raw: str, what: str) -> tuple[ScheduledFault, ...]:
    m = _RANDOM_RE.fullmatch(text)
    if m is None:
        raise ConfigError(
            f"{what}: the random form is random:COUNT,seed=SEED (e.g. random:3,seed=7), "
            f"got {quote(raw)}"
        )
    count = int(m["count"])
    if not 1 <= count <= MAX_SCHEDULE:
        raise ConfigError(f"{what}: random:{count}: draw 1 to {MAX_SCHEDULE} faults")
    return draw_schedule(count, int(m["seed"]))


def draw_schedule(count: int, seed: int) -> tuple[ScheduledFault, ...]:
    """``count`` faults drawn uniformly, position by position, from every (fault, window) pair
    that position allows; the same count and seed always draw the same schedule."""
    rng = random.Random(seed)
    out = []
    for position in range(1, count + 1):
        pairs = [(f, w) for f in INJECTED_FAULTS for w in windows_at(f, position)]
        fault, window = pairs[rng.randrange(len(pairs))]
        out.append(ScheduledFault(fault, window))
    return tuple(out)


def render_schedule(schedule: tuple[ScheduledFault, ...]) -> str:
    """The schedule as the injector's ``--schedule`` and run.json spell it."""
    return ",".join(map(str, schedule))


def schedule_ending(
    schedule: tuple[ScheduledFault, ...], max_restarts: int | None, limit: int
) -> tuple[int, EndingKind]:
    """After how many faults the run of ``schedule`` ends, and why, as NVRx decides after each
    failure: first whether ``limit`` cycles in a row made no progress (a fault in a
    replacement's restore ends a cycle whose tracker never moved), then whether a restart is
    left (``max_restarts``; None: unknown, never the reason)."""
    without = 0
    for position, entry in enumerate(schedule, start=1):
        without = without + 1 if entry.window in SCHEDULE_WINDOWS else 0
        if without >= limit:
            return position, "no-progress"
        if max_restarts is not None and position > max_restarts:
            return position, "budget"
    return len(schedule), "finished"


def reference_iterations_needed(
    schedule: tuple[ScheduledFault, ...], save_interval: int
) -> list[int]:
    """The iteration by which the reference workload opens each fault's window (its checkpoint
    behaviour: save N is finalized, and the tracker names it, when save N + interval is
    submitted). A cycle resumed from R reaches a tracker above R at the submit of R + 2
    intervals: ``save`` fires there, ``step`` at the step after it, ``finalize`` at the next
    save's checkpointing section (R + 3 intervals); each restores R + 1 interval. ``restore``
    needs no iteration and restores R again."""
    out = []
    restored = 0
    for entry in schedule:
        if entry.window in SCHEDULE_WINDOWS:
            out.append(0)
            continue
        after = {"step": 2 * save_interval + 1, "save": 2 * save_interval}.get(
            entry.window, 3 * save_interval
        )
        if entry.fault == "ckpt-worker":
            after = 2 * save_interval  # fires as its save is submitted
        out.append(restored + after)
        restored += save_interval
    return out
