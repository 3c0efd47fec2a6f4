"""Whether a run can finish within its run timeout, decided before anything launches.

Each fault of a run (its schedule's, or its one fault) needs time to be detected and recovered:
a process that exits (kill, term, segv, exception, the checkpoint worker's death) is seen at
once, but a ``hang`` only when NVRx's deadline for the section it stopped in passes, counted
from that section's start (``rank_monitor_server.py``: ``_is_section_timeout_elapsed``): the
``step`` section in window step, ``checkpointing`` in save and finalize, ``setup`` in restore,
where the replacement loads its checkpoint (docs/windows.md). On a run of several ranks a peer
waiting for the stopped rank in a collective fails at the workload's collective timeout, which
the launcher sees as a process exit: the hang is detected at the sooner of the two. Every
window lies inside a section, so the out-of-section timeout detects none of them. The reference
workload under ``--no-ft`` never connects to NVRx's rank monitor, which checks section timeouts
only for a connected rank (``_periodic_rank_check``): there a hang is seen by no section, only by
a peer's collective timeout, and on one rank by nothing at all (such a run is always refused).

:func:`least_time` adds, cycle by cycle, what no run can do without: a cycle that trains starts
up, a fault waits for its detection, a failure the launcher restarts costs its restart, and a
run that recovered from every fault due starts up once more (which faults are due, the restart
budget and NVRx's no-progress stop decide: :func:`~pytest_nvrx.settings.schedule.schedule_ending`).
Training itself, save writes and NVRx's check interval are left out, and the start-ups are
estimates below every one measured: the sum is a lower bound, so a run it refuses cannot
finish in time, while one it accepts may still not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pytest_nvrx.settings.record import REFERENCE_NO_FT_FLAG, RunConfig, WorkloadKind
from pytest_nvrx.settings.schedule import (
    NVRX_NO_PROGRESS_LIMIT,
    ScheduledFault,
    schedule_ending,
)
from pytest_nvrx.settings.table import option_hint
from pytest_nvrx.settings.values import ConfigError, EntryPoint, finite_float

#: Seconds from a cycle's start to its first training step, a lower-bound estimate per workload.
#: Measured in the committed runs (tests/data, cycle record start to the cycle's first
#: iteration): the reference 3.9-15.4 s on the 2-core CPU host (40 cycles), Megatron 19.2-61.6 s
#: on H200s (154 cycles, 1 and 2 ranks); taken well below the least seen, for faster hosts.
STARTUP_S: dict[WorkloadKind, float] = {"reference": 2.0, "megatron": 10.0}
#: Seconds from a failure's detection to the replacement's start (NVRx stops the workers and
#: meets again): 2.3-52.7 s in the same runs (97 recoveries), an estimate below the least seen.
RESTART_S = 1.0
#: Both workloads' collective timeout unless the workload's arguments give one: Megatron's
#: ``--distributed-timeout-minutes`` (default 10) and the reference's option of that name.
COLLECTIVE_TIMEOUT_S = 600.0
_COLLECTIVE_MINUTES_FLAG = "--distributed-timeout-minutes"
#: Megatron lowers the collective timeout to this after the first iteration; the restore window
#: comes before it.
_AFTER_INIT_FLAG = "--distributed-timeout-seconds-after-init"

#: The NVRx section open when a fault of each window strikes (docs/windows.md): a hang there
#: is detected by that section's timeout.
WINDOW_SECTION: dict[str, str] = {
    "step": "step",
    "save": "checkpointing",
    "finalize": "checkpointing",
    "restore": "setup",
}


@dataclass(frozen=True, slots=True)
class FaultCost:
    """What one fault of a run costs at least: its position, the seconds before it strikes
    (its cycle's start-up; none in restore, which strikes during it), its detection and the
    restart after it (none where the run ends there)."""

    position: int
    entry: ScheduledFault
    before_s: float
    detection_s: float
    restart_s: float
    #: the section it strikes in, for a hang (None: its process exits)
    section: str | None
    #: that section's timeout (None: no NVRx section watches the rank, ``--no-ft``), and the
    #: peers' collective timeout (None: one rank); the detection is the sooner (``inf``:
    #: nothing detects it)
    section_s: float | None = None
    collective_s: float | None = None
    #: the workload's option that sets that collective timeout
    collective_option: str | None = None


@dataclass(frozen=True, slots=True)
class LeastTime:
    """A run's least duration, a lower bound: each due fault's cost, then a last start-up where
    the run recovers from every fault due."""

    faults: tuple[FaultCost, ...]
    #: the start-up after the last recovery (0 where the restart budget or NVRx ends the run)
    final_s: float
    startup_s: float
    #: how many faults the run asks for (those after a spent budget included)
    scheduled: int = 0

    @property
    def seconds(self) -> float:
        return sum(f.before_s + f.detection_s + f.restart_s for f in self.faults) + self.final_s

    @property
    def slowest(self) -> FaultCost | None:
        """The fault whose detection takes longest (None: none waits for a deadline)."""
        waiting = [f for f in self.faults if f.section is not None]
        return max(waiting, key=lambda f: f.detection_s, default=None)

    def named(self, fault: FaultCost) -> str:
        """``hang@restore``; in a schedule of several faults ``hang@restore (fault 2 of 3)``."""
        if self.scheduled > 1:
            return f"{fault.entry} (fault {fault.position} of {self.scheduled})"
        return str(fault.entry)

    def breakdown(self) -> str:
        """``2 start-ups of ~10 s, 2 restarts of ~1 s, hang@restore's detection 900 s``."""
        startups = sum(1 for f in self.faults if f.before_s) + (1 if self.final_s else 0)
        restarts = sum(1 for f in self.faults if f.restart_s)
        parts = [f"{_count(startups, 'start-up')} of ~{_secs(self.startup_s)}"] if startups else []
        if restarts:
            parts.append(f"{_count(restarts, 'restart')} of ~{_secs(RESTART_S)}")
        for f in self.faults:
            if f.section is not None:
                parts.append(f"{f.entry}'s detection {_secs(f.detection_s)}")
        return ", ".join(parts)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _secs(value: float) -> str:
    return f"{value:.0f} s" if float(value).is_integer() or value >= 10 else f"{value:.1f} s"


def _faults(config: RunConfig) -> tuple[ScheduledFault, ...]:
    """The run's faults in order: its schedule, else its one fault (none for a baseline)."""
    if config.schedule:
        return config.schedule
    window = config.fault_window
    if config.fault == "none" or window is None:
        return ()
    return (ScheduledFault(config.fault, window),)


def _collective_timeout(config: RunConfig, window: str) -> tuple[float, str] | None:
    """The collective timeout a peer of a hung rank waits out, and the workload option that
    sets it (None: one rank, no peer).

    The last value the workload's arguments give wins, as argparse takes it; an unreadable one
    leaves the default (the rules do not own workload arguments). Megatron's lower timeout after
    the first iteration counts outside the restore window."""
    if config.world_size < 2:
        return None
    seconds = COLLECTIVE_TIMEOUT_S
    after_init: float | None = None
    args = config.extra_args
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        minutes = finite_float(value) if flag == _COLLECTIVE_MINUTES_FLAG else None
        if minutes is not None:
            seconds = 60.0 * minutes
        elif flag == _AFTER_INIT_FLAG and config.workload == "megatron":
            after_init = finite_float(value)
    if after_init is not None and 0 < after_init < seconds and window != "restore":
        return after_init, _AFTER_INIT_FLAG
    return (seconds, _COLLECTIVE_MINUTES_FLAG) if seconds > 0 else None


def no_nvrx_sections(config: RunConfig) -> bool:
    """Whether no NVRx section watches the workload's ranks: the reference under ``--no-ft``."""
    return config.workload == "reference" and REFERENCE_NO_FT_FLAG in config.extra_args


def least_time(config: RunConfig) -> LeastTime:
    """The least time ``config``'s run takes (a lower bound; see the module's docstring)."""
    startup = STARTUP_S[config.workload]
    faults = _faults(config)
    if not faults:
        return LeastTime((), startup, startup)
    due, ending = schedule_ending(faults, config.max_restarts, NVRX_NO_PROGRESS_LIMIT)
    unmonitored = no_nvrx_sections(config)
    costs = []
    for position, entry in enumerate(faults[:due], start=1):
        section = WINDOW_SECTION.get(entry.window) if entry.fault == "hang" else None
        section_s = (
            getattr(config.section_timeouts, section)
            if section is not None and not unmonitored
            else None
        )
        peers = _collective_timeout(config, entry.window) if section is not None else None
        collective, option = peers if peers is not None else (None, None)
        detection = 0.0
        if section is not None:
            detection = min(s for s in (section_s, collective, math.inf) if s is not None)
        ends_run = position == due and ending != "finished"
        costs.append(
            FaultCost(
                position=position,
                entry=entry,
                before_s=0.0 if entry.window == "restore" else startup,
                detection_s=detection,
                restart_s=0.0 if ends_run else RESTART_S,
                section=section,
                section_s=section_s,
                collective_s=collective,
                collective_option=option,
            )
        )
    final = startup if ending == "finished" else 0.0
    return LeastTime(tuple(costs), final, startup, len(faults))


def check_run_timeout(config: RunConfig, run_timeout_s: float) -> None:
    """Refuse a run whose run timeout is below its least time (:func:`least_time`), with one
    line that shows the arithmetic and names the option to change, in the entry point's
    spelling (ConfigError.message_for)."""
    least = least_time(config)
    need = least.seconds
    if need <= run_timeout_s:
        return
    slowest = least.slowest
    if slowest is not None and slowest.section_s is None:
        _refuse_unmonitored(config, slowest, least, run_timeout_s)
    above = f"~{need:.0f} s"
    estimate = f"(a lower-bound estimate: {least.breakdown()})"
    timeout = _secs(run_timeout_s)

    def message(entry: EntryPoint) -> str:
        raise_it = f"raise {_run_timeout_option(entry)} above {above}"
        if slowest is None:
            what, alone = "the baseline", "start-up alone needs"
            if least.faults:
                what, alone = f"the run of {_faults_text(least)}", "start-ups and restarts need"
            return (
                f"the run timeout {timeout} cannot fit {what}: the {config.workload} workload's"
                f" {alone} {above}; {raise_it} {estimate}"
            )
        assert slowest.section is not None and slowest.section_s is not None
        detected = (
            f"{least.named(slowest)} is detected only by the {slowest.section} section's timeout"
            f" ({_secs(slowest.section_s)})"
        )
        if slowest.collective_s is not None and slowest.collective_s < slowest.section_s:
            detected += (
                " or, sooner, by the other ranks' collective timeout"
                f" ({_secs(slowest.collective_s)}: the workload's {slowest.collective_option})"
            )
        sections = option_hint("section-timeouts", entry)
        return (
            f"{detected}; the run timeout {timeout} cannot fit it: {raise_it} or lower"
            f" {slowest.section} in {sections} {estimate}"
        )

    raise ConfigError.naming(message)


def _refuse_unmonitored(
    config: RunConfig, slowest: FaultCost, least: LeastTime, run_timeout_s: float
) -> None:
    """A hang no NVRx section sees (``--no-ft``): only a peer's collective timeout detects it,
    and on one rank nothing does."""
    unseen = (
        f"{least.named(slowest)} is seen by no NVRx section: under {REFERENCE_NO_FT_FLAG} the"
        f" {config.workload} workload's ranks do not connect to NVRx's rank monitor"
    )
    if slowest.collective_s is None:
        raise ConfigError(
            f"{unseen}, and on one rank no peer's collective timeout detects it either: the run"
            f" could only end at its run timeout; drop {REFERENCE_NO_FT_FLAG} from the"
            " workload's arguments, or run it on several ranks"
        )
    need = least.seconds
    if need <= run_timeout_s:
        return
    raise ConfigError.naming(
        lambda entry: (
            f"{unseen}; only the other ranks' collective timeout"
            f" ({_secs(slowest.collective_s or 0.0)}: the workload's"
            f" {slowest.collective_option}) detects it; the run timeout {_secs(run_timeout_s)}"
            f" cannot fit it: raise {_run_timeout_option(entry)} above ~{need:.0f} s, lower"
            f" {slowest.collective_option} or drop {REFERENCE_NO_FT_FLAG} (a lower-bound"
            f" estimate: {least.breakdown()})"
        )
    )


def _faults_text(least: LeastTime) -> str:
    return ",".join(str(f.entry) for f in least.faults)


def _run_timeout_option(entry: EntryPoint) -> str:
    """The run timeout is two settings: the CLI's --timeout, the plugin's --nvrx-run-timeout."""
    return option_hint("run-timeout" if entry == "plugin" else "timeout", entry)
