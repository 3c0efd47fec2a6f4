"""``logs/launcher.log``: what ft_launcher (NVRx 0.7), its rank monitors and torchelastic said.

Line formats seen in real runs (tests/data/gpu):

* NVRx logger: ``2026-11-29 11:03:56,241 [INFO] [vm] [workload:?(?) infra:?(?)] launcher.py:636
  <message>``, optionally behind a rank prefix (``"0: "``). Rank monitors log with
  ``workload:?(<local rank>)``.
* torchelastic (glog): ``E1129 11:03:56.239000 547 torch/.../api.py:986] failed (exitcode: -9)
  local_rank: 0 (pid: 585) of binary: ...`` (no year, local time).
* Profiling events: ``- Cycle: 1 Event: failure_detected Node: n Rank: 0 Time: ... UTC``. NVRx
  bumps its cycle counter *at* ``failure_detected``, so that event carries the number of the
  cycle about to start, not the one that failed.
* Continuation lines (the launch-config block) have no timestamp.

Log timestamps are the launcher host's local time; profiling events also carry UTC, which gives
the host's UTC offset (:attr:`LauncherLog.utc_offset`). Every time here is returned as UTC.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, timezone
from enum import StrEnum
from pathlib import Path
from typing import Any

from pytest_nvrx.evidence.refs import (
    NO_INSTANT,
    EvidenceRef,
    Instant,
    UnreadableNumber,
    check_numbers,
    clip_line,
    is_ascii_number,
    iter_lines,
    parse_time,
    read_float,
    read_int,
    says_disk_full,
    time_in_range,
)


class LauncherEventKind(StrEnum):
    WORKERS_STARTING = "workers_starting"  # "[default] starting workers for entrypoint: ..."
    PROFILING = "profiling"  # "- Cycle: N Event: <name> ..."
    WORKER_FAILED = "worker_failed"  # torchelastic "failed (exitcode: X) local_rank: R (pid: P)"
    # torchelastic "Sending process P closing signal SIGTERM": stopping the group, it signals
    # only the workers still running (name: the signal)
    CLOSING_SIGNAL = "closing_signal"
    GROUP_FAILED = "group_failed"  # "Worker group FAILED. n/m attempts left; will restart ..."
    JOIN_RESTART = "join_restart"  # "Joining cluster restart (group_rank=..)"
    SECTION_TIMEOUT = "section_timeout"  # "[Cycle N] Section 'step' has been open for ..."
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"  # "[Cycle N] Did not get subsequent heartbeat ..."
    SECTIONS_OPEN = "sections_open"  # "Section(s) ['step'] were still open."
    PROGRESS = "progress"  # "Training cycle #0 made progress: 0 → 5 (5 iterations)"
    NO_PROGRESS = "no_progress"  # "Training cycle #1 made NO progress: ..."
    EARLY_TERMINATION = "early_termination"  # "EARLY TERMINATION: ..."
    NO_RESTART = "no_restart"  # "... no progress across restarts. No more restarts ..." etc.
    GROUP_SUCCEEDED = "group_succeeded"  # "[default] worker group successfully finished."
    RUN_OK = "run_ok"  # "Agent .run() is OK. No failures in the result."
    RUN_FAILED = "run_failed"  # "Agent .run() ended with ...", "Some rank(s) exited with ..."
    AGENT_EXIT = "agent_exit"  # "Agent's exit code = 93", "Agent exits with exit code = 0."
    # "GPU 0 memory reclaimed in 38s (20 samples): ..." (name "reclaimed"), or "Timeout waiting
    # for GPU memory to be reclaimed after 512.0s" (name "timeout"): NVRx waits, after stopping
    # the workers and before the next rendezvous, until every GPU of the node is nearly empty,
    # whoever holds the memory (other runs on a shared GPU included)
    GPU_RECLAIM = "gpu_reclaim"
    # "Received 15 death signal, shutting down workers, timeout 1800 sec.": the launcher was told
    # to stop (our run timeout, a stop signal); every failure it records after it is its own
    # shutdown's, no fault's
    STOP_SIGNAL = "stop_signal"


# How torchelastic's launcher says a signal stopped it (its signal handler's exception).
_SIGNALLED = "raised SignalException"

# Events that say a worker (group) failed or was judged hung.
FAILURE_KINDS = frozenset(
    {
        LauncherEventKind.WORKER_FAILED,
        LauncherEventKind.GROUP_FAILED,
        LauncherEventKind.SECTION_TIMEOUT,
        LauncherEventKind.HEARTBEAT_TIMEOUT,
    }
)


@dataclass(frozen=True, slots=True)
class LauncherEvent:
    kind: LauncherEventKind
    time: datetime | None
    ref: EvidenceRef
    # profiling event name (failure_detected, worker_start_completed, ...) or section name
    name: str | None = None
    cycle: int | None = None
    # worker local rank (torchelastic, rank monitors) or the node's group rank (profiling)
    rank: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    will_restart: bool | None = None
    # GPU_RECLAIM: how long NVRx waited (whole seconds as it logs them: the wait took at least
    # this and less than a second more); the GPU index is ``rank``
    duration_s: float | None = None
    # the group rank of the node whose launcher wrote the line (NVRx's ``infra:N(..)``; a glog
    # line's launcher pid mapped through the profiling events' ``Node: host_<pid>_..``); None
    # where the line does not say. On several nodes local ranks repeat: this tells them apart.
    node: int | None = None
    # the pid of the launcher (torch elastic agent) that wrote a glog line (``E1205 16:42:42.63
    # 10721 torch/...``); None for other lines. Several nodes' launchers on one host may write
    # one log, and their pids tell their records apart where no node id does.
    launcher_pid: int | None = None
    # a profiling event's own stamp (its ``Time: ... UTC``), in UTC; ``time`` is its line's
    # stamp. NVRx takes both at once: they agree within milliseconds (clocks.py)
    utc: datetime | None = None

    @property
    def is_failure_detected(self) -> bool:
        return self.kind is LauncherEventKind.PROFILING and self.name == "failure_detected"


@dataclass(frozen=True, slots=True)
class BackStep:
    """A launcher line stamped before a line above it that the same writer wrote: ``later`` (in
    the file) at ``later_time``, ``earlier`` at ``earlier_time`` (both UTC)."""

    later: EvidenceRef
    later_time: datetime
    earlier: EvidenceRef
    earlier_time: datetime

    @property
    def by(self) -> timedelta:
        return self.earlier_time - self.later_time


@dataclass(frozen=True, slots=True)
class LauncherLog:
    file: str
    exists: bool
    events: tuple[LauncherEvent, ...] = ()
    line_count: int = 0
    # the first and the last stamped line (by position)
    first: Instant = NO_INSTANT
    last: Instant = NO_INSTANT
    # the earliest and the latest stamp of any line (by time, not by position): every line the
    # launcher wrote lies between them, and they must lie inside the launch (clocks.py)
    earliest: Instant = NO_INSTANT
    latest: Instant = NO_INSTANT
    # "Starting elastic_operator with launch configs:" block (nproc_per_node, max_restarts, ...)
    config: dict[str, str] = field(default_factory=dict)
    config_refs: dict[str, EvidenceRef] = field(default_factory=dict)
    # the first line of every such block: one per node's launcher (each prints its own into
    # the shared log), which ``config`` holds the first of
    config_blocks: tuple[EvidenceRef, ...] = ()
    # the first line of a later block that says another value than the first block (or a key
    # it lacks), with the first block's line: (later, first or the first block's head)
    config_conflict: tuple[EvidenceRef, EvidenceRef] | None = None
    # local time minus UTC on the launcher host, from profiling events; None if none were seen
    utc_offset: timedelta | None = None
    read_error: str | None = None
    # the first line whose stamp is no time (impossible, or outside refs.TIME_RANGE; a profiling
    # event's "Time:" included): the run's clocks cannot be checked
    bad_stamp: EvidenceRef | None = None
    # the first line of evidence (an event, a launch setting) unread for a number past
    # refs.MAX_DIGITS: it is left out, and the run cannot be judged
    bad_number: EvidenceRef | None = None
    # the first line that says a write failed for a full disk or quota (refs.says_disk_full)
    disk_full: EvidenceRef | None = None
    # the largest step back in time between a line and one above it of the same writer: on one
    # node every stamped line (one launcher and the processes it started, writing as they log);
    # on several, each launcher's own lines (its glog lines by their pid, its profiling events
    # by their node id), the others' order being the file system's. None: never back
    back_step: BackStep | None = None
    # the launcher pids the profiling events' node ids name (``Node: host_<pid>_<n>``): the
    # torch elastic agents that wrote this log, whose glog lines carry the same pids
    launchers: frozenset[int] = frozenset()
    # the hosts NVRx's own lines name (``[INFO] [<host>] [workload:...``): where the launchers ran
    hosts: frozenset[str] = frozenset()

    def of_kind(self, *kinds: LauncherEventKind) -> tuple[LauncherEvent, ...]:
        return tuple(e for e in self.events if e.kind in kinds)

    def profiling(self, name: str) -> tuple[LauncherEvent, ...]:
        return tuple(
            e for e in self.events if e.kind is LauncherEventKind.PROFILING and e.name == name
        )

    def signalled(self) -> LauncherEvent | None:
        """The launcher's first record of the signal that stopped it (``Received 15 death
        signal, shutting down workers``, else ``Agent .run() raised SignalException: Process P
        got signal: 15``): what our run timeout, a stop signal or a scheduler sends. The
        workers' exits recorded after it (-15) are that stop's, no fault's detection. None:
        nothing signalled the launcher."""
        return next(
            (
                e
                for e in self.events
                if e.kind is LauncherEventKind.STOP_SIGNAL
                or (e.kind is LauncherEventKind.RUN_FAILED and _SIGNALLED in e.ref.text)
            ),
            None,
        )

    @property
    def nproc_per_node(self) -> int | None:
        value = self.config.get("nproc_per_node", "")
        return read_int(value) if is_ascii_number(value) else None


_PREFIX = r"(?:(?:\d+|\?)\s*: )?"
_NVRX_LINE = re.compile(
    _PREFIX
    + r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+) \[(?P<level>\w+)\] \[(?P<host>[^\]]*)\] "
    r"\[workload:(?P<wrank>[^(\s]*)\((?P<wlocal>[^)\s]*)\) infra:(?P<infra>[^(\s\]]*)[^\]]*\] "
    r"(?P<src>\S+?):\d+ (?P<msg>.*)"
)
# A plainer NVRx/python logging line without the workload/infra block.
_PLAIN_LINE = re.compile(
    _PREFIX + r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+) \[(?P<level>\w+)\] (?P<msg>.*)"
)
_GLOG_LINE = re.compile(
    _PREFIX
    + r"[IWEF](?P<mon>\d\d)(?P<day>\d\d) (?P<time>\d\d:\d\d:\d\d(?:\.\d+)?)\s+(?P<lpid>\d+)\s+"
    r"\S+\] (?P<msg>.*)"
)
_PROFILING = re.compile(
    r"-\s*Cycle: (?P<cycle>\d+) Event: (?P<name>\w+) Node: (?P<node>\S+) Rank: (?P<rank>\S+)"
    r" Time: (?P<utc>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) UTC"
)
# a profiling event's node id: <host>_<launcher pid>_<n>, and the node's group rank
_PROFILING_NODE = re.compile(r"Node: \S*_(?P<pid>\d+)_\d+ (?:Rank: (?P<rank>\d+)\b)?")
_WORKER_FAILED = re.compile(
    r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<rank>\d+) \(pid: (?P<pid>\d+)\)"
)
_CLOSING_SIGNAL = re.compile(r"Sending process (?P<pid>\d+) closing signal (?P<sig>SIG\w+)")
_GROUP_FAILED = re.compile(
    r"Worker group (?P<state>FAILED|UNHEALTHY)\. (?P<left>\d+)/(?P<max>\d+) attempts left;"
    r" will restart"
)
_SECTION_TIMEOUT = re.compile(
    r"\[Cycle (?P<cycle>\d+)\] (?:Section '(?P<section>[^']+)' has been open|"
    r"Was out of section) for [\d.]+ seconds"
)
_HEARTBEAT = re.compile(r"\[Cycle (?P<cycle>\d+)\] Did not get (?:initial|subsequent) heartbeat")
_GPU_RECLAIMED = re.compile(r"GPU (?P<gpu>\d+) memory reclaimed in (?P<s>\d+(?:\.\d+)?)s\b")
# any line that says a GPU's memory was (or was not) reclaimed: one the patterns above do not
# read is no measurement of the wait (cannot judge), never a wait of 0
_RECLAIM_SAID = re.compile(r"memory (?:reclaimed in|to be reclaimed after)")
_GPU_RECLAIM_TIMEOUT = re.compile(
    r"Timeout waiting for GPU memory to be reclaimed after (?P<s>\d+(?:\.\d+)?)s"
)
_EXIT_CODE = re.compile(r"(?:Agent's exit code = |Agent exits with exit code = )(?P<code>-?\d+)")
_CONFIG_LINE = re.compile(r"\s{2}(?P<key>\w+)\s*: (?P<value>.*)")
_NPROC = re.compile(r"Using nproc_per_node=(?P<n>\d+)")


def _int(value: str | None) -> int | None:
    return read_int(value) if value is not None and value.lstrip("-").isdigit() else None


#: Lines told apart by a phrase alone, tried in this order ("made NO progress" before "made
#: progress"), after the lines that carry values and before the exit-code lines.
_TOLD_BY_PHRASE: tuple[tuple[str, LauncherEventKind], ...] = (
    ("were still open", LauncherEventKind.SECTIONS_OPEN),
    ("EARLY TERMINATION", LauncherEventKind.EARLY_TERMINATION),
    ("made NO progress", LauncherEventKind.NO_PROGRESS),
    ("made progress", LauncherEventKind.PROGRESS),
    ("starting workers for entrypoint", LauncherEventKind.WORKERS_STARTING),
    ("worker group successfully finished", LauncherEventKind.GROUP_SUCCEEDED),
    ("Agent .run() is OK", LauncherEventKind.RUN_OK),
    ("death signal, shutting down workers", LauncherEventKind.STOP_SIGNAL),
)


def _classify(msg: str, ref: EvidenceRef) -> tuple[LauncherEvent, str | None] | None:
    """The event a launcher message stands for (time still unset), and a profiling event's UTC
    stamp; None for messages that mean nothing to the criteria."""
    kinds = LauncherEventKind

    def ev(kind: LauncherEventKind, **fields: Any) -> tuple[LauncherEvent, None]:
        return LauncherEvent(kind, None, ref, **fields), None

    if "Event: " in msg:
        m = _PROFILING.search(msg)
        if m is not None:
            event = LauncherEvent(
                kinds.PROFILING,
                None,
                ref,
                name=m["name"],
                cycle=read_int(m["cycle"]),
                rank=_int(m["rank"]),
            )
            return event, m["utc"]
    if "failed (exitcode" in msg:
        m = _WORKER_FAILED.search(msg)
        if m is not None:
            return ev(
                kinds.WORKER_FAILED,
                exit_code=read_int(m["code"]),
                rank=read_int(m["rank"]),
                pid=read_int(m["pid"]),
            )
    if "closing signal" in msg:
        m = _CLOSING_SIGNAL.search(msg)
        if m is not None:
            return ev(kinds.CLOSING_SIGNAL, name=m["sig"], pid=read_int(m["pid"]))
    if "Worker group" in msg:
        m = _GROUP_FAILED.search(msg)
        if m is not None:
            return ev(kinds.GROUP_FAILED, name=m["state"], will_restart=True)
    if "Joining cluster restart" in msg:
        return ev(kinds.JOIN_RESTART, will_restart=True)
    if "[Cycle " in msg:
        m = _SECTION_TIMEOUT.search(msg)
        if m is not None:
            return ev(
                kinds.SECTION_TIMEOUT,
                name=m["section"] or "out_of_section",
                cycle=read_int(m["cycle"]),
            )
        m = _HEARTBEAT.search(msg)
        if m is not None:
            return ev(kinds.HEARTBEAT_TIMEOUT, name="heartbeat", cycle=read_int(m["cycle"]))
    if "reclaimed" in msg:
        m = _GPU_RECLAIMED.search(msg)
        if m is not None:
            return ev(
                kinds.GPU_RECLAIM,
                name="reclaimed",
                rank=read_int(m["gpu"]),
                duration_s=read_float(m["s"]),
            )
        m = _GPU_RECLAIM_TIMEOUT.search(msg)
        if m is not None:
            return ev(kinds.GPU_RECLAIM, name="timeout", duration_s=read_float(m["s"]))
        if _RECLAIM_SAID.search(msg):
            return ev(kinds.GPU_RECLAIM, name="unreadable")
    for phrase, kind in _TOLD_BY_PHRASE:
        if phrase in msg:
            return ev(kind)
    if "exit code" in msg:
        m = _EXIT_CODE.search(msg)
        if m is not None:
            kind = kinds.NO_RESTART if "must not be restarted" in msg else kinds.AGENT_EXIT
            return ev(kind, exit_code=read_int(m["code"]))
        if "Some rank(s) exited with non-zero exit code" in msg:
            return ev(kinds.RUN_FAILED)
    if (
        "no progress across restarts" in msg
        or "must not be restarted" in msg
        or "Attribution recommended stopping" in msg
        or "reported a no-restart decision" in msg
    ):
        return ev(kinds.NO_RESTART)
    if "Agent .run() ended with" in msg or "Agent .run() raised" in msg:
        return ev(kinds.RUN_FAILED)
    return None


_IS_HOST = re.compile(r"'is_host': '(?:true|false)'")


def _node_neutral(value: str) -> str:
    """A launch setting as every node's launcher prints it: ``rdzv_configs`` names whether this
    node hosts the rendezvous store (``'is_host': 'true'`` on one node only)."""
    return _IS_HOST.sub("'is_host': ?", value)


def _naive(ts: str) -> datetime | None:
    return parse_time(ts.replace(",", "."))


def parse_launcher_log(path: Path, *, file: str | None = None) -> LauncherLog:
    """Parse the launcher log; a missing or unreadable file is reported, never raised."""
    name = file if file is not None else path.name
    if not path.is_file():
        return LauncherLog(name, exists=False)
    events: list[LauncherEvent] = []
    naive_times: list[datetime | None] = []
    config: dict[str, str] = {}
    config_refs: dict[str, EvidenceRef] = {}
    blocks: list[EvidenceRef] = []
    first_block: dict[str, tuple[str, EvidenceRef]] = {}
    conflict: tuple[EvidenceRef, EvidenceRef] | None = None
    offsets: list[timedelta] = []
    in_config = False
    last_year: int | None = None
    first: tuple[datetime, EvidenceRef] | None = None
    last: tuple[datetime, EvidenceRef] | None = None
    # glog lines lack the year; they take it from the nearest NVRx line (fixed up at the end).
    pending_year: list[int] = []
    # the profiling events' own UTC stamps (naive), by event index
    utc_stamps: dict[int, datetime] = {}
    # the earliest and latest stamped lines, of known year and of glog lines still waiting
    # for their year (year 1 placeholder: compared among themselves until it is known)
    known_span: list[tuple[datetime, EvidenceRef]] = []
    pending_span: list[tuple[datetime, EvidenceRef]] = []
    bad_stamp: EvidenceRef | None = None
    bad_number: EvidenceRef | None = None
    disk_full: EvidenceRef | None = None
    # which node's launcher a glog line's pid is (from the profiling events' node ids): by
    # their NVRx line's ``infra:N``, else (NVRx 0.7 prints ``infra:?``) by the event's ``Rank``
    node_of_pid: dict[int, int] = {}
    profiled_node_of_pid: dict[int, int] = {}
    named_launchers: set[int] = set()
    named_hosts: set[str] = set()
    launcher_pids: list[int | None] = []
    # the latest stamp so far and the largest step back: over every line (one node) and per
    # launcher pid (several nodes); (naive time, ref) pairs, years known
    newest: dict[int | None, tuple[datetime, EvidenceRef]] = {}
    steps: dict[int | None, tuple[datetime, EvidenceRef, datetime, EvidenceRef]] = {}
    lineno = 0
    try:
        for lineno, text in iter_lines(path):
            if disk_full is None and says_disk_full(text) is not None:
                disk_full = EvidenceRef(name, lineno, clip_line(text))
            try:
                ts: datetime | None = None
                msg: str
                wlocal: str | None = None
                node: int | None = None
                launcher_pid: int | None = None
                m = _NVRX_LINE.match(text) or _PLAIN_LINE.match(text)
                if m is not None:
                    ts = _naive(m["ts"])
                    msg = m["msg"]
                    if m.groupdict().get("host"):
                        named_hosts.add(m["host"])
                    wlocal = m.groupdict().get("wlocal")
                    node = _int(m.groupdict().get("infra"))
                    if ts is not None:
                        last_year = ts.year
                    elif bad_stamp is None:
                        bad_stamp = EvidenceRef(name, lineno, clip_line(text))
                else:
                    g = _GLOG_LINE.match(text)
                    if g is not None:
                        try:
                            ts = datetime.fromisoformat(
                                f"{last_year or 1:04d}-{g['mon']}-{g['day']} {g['time']}"
                            )
                        except ValueError:  # month 13; Feb 29 waits for its year (below)
                            ts = None
                            if last_year is not None and bad_stamp is None:
                                bad_stamp = EvidenceRef(name, lineno, clip_line(text))
                        if last_year is None and ts is not None:
                            pending_year.append(len(events))
                        msg = g["msg"]
                        launcher_pid = read_int(g["lpid"])
                    else:
                        # An untimestamped line: the launch-config block, or junk.
                        if in_config:
                            c = _CONFIG_LINE.match(text)
                            if c is not None:
                                value = c["value"].strip()
                                if value.isdigit():  # read as a number later (max_restarts)
                                    read_int(value)
                                here = EvidenceRef(name, lineno, clip_line(text))
                                if len(blocks) <= 1:
                                    first_block.setdefault(c["key"], (value, here))
                                elif conflict is None:
                                    said = first_block.get(c["key"])
                                    if said is None:
                                        conflict = (here, blocks[0])
                                    elif _node_neutral(said[0]) != _node_neutral(value):
                                        conflict = (here, said[1])
                                config.setdefault(c["key"], value)
                                config_refs.setdefault(
                                    c["key"], EvidenceRef(name, lineno, clip_line(text))
                                )
                                continue
                            in_config = False
                        continue
                in_config = "Starting elastic_operator with launch configs" in msg
                if in_config:
                    blocks.append(EvidenceRef(name, lineno, clip_line(text)))
                # a profiling event's node id (``Node: <host>_<launcher pid>_<n> Rank: <node>``)
                profiled = _PROFILING_NODE.search(msg) if "Event: " in msg else None
                if ts is not None:
                    ref = EvidenceRef(name, lineno, clip_line(text))
                    if first is None:
                        first = (ts, ref)
                    last = (ts, ref)
                    pending = launcher_pid is not None and last_year is None
                    _widen(pending_span if pending else known_span, ts, ref)
                    if not pending:
                        writer = launcher_pid
                        if writer is None and profiled is not None:
                            writer = read_int(profiled["pid"])
                        keys: tuple[int | None, ...] = (None,) if writer is None else (None, writer)
                        for key in keys:
                            _step(newest, steps, key, ts, ref)
                if "nproc_per_node=" in msg:
                    n = _NPROC.search(msg)
                    if n is not None:
                        read_int(n["n"])  # read as a number later
                        config.setdefault("nproc_per_node", n["n"])
                        config_refs.setdefault(
                            "nproc_per_node", EvidenceRef(name, lineno, clip_line(text))
                        )
                found = _classify(msg, EvidenceRef(name, lineno, clip_line(text)))
                if found is None:
                    continue
                # the criteria read an event's line again for its other numbers (restart
                # attempts, a cycle's progress): none may be past MAX_DIGITS either
                check_numbers(msg)
                event, utc_text = found
                if utc_text is not None and ts is not None:
                    stamp = _naive(utc_text)
                    if stamp is not None:
                        offsets.append(ts - stamp)
                        utc_stamps[len(events)] = stamp
                    elif bad_stamp is None:
                        bad_stamp = EvidenceRef(name, lineno, clip_line(text))
                if event.kind in (
                    LauncherEventKind.SECTION_TIMEOUT,
                    LauncherEventKind.HEARTBEAT_TIMEOUT,
                ):
                    # rank monitors log as workload:?(<local rank>)
                    event = replace(event, rank=_int(wlocal))
                if event.kind is LauncherEventKind.PROFILING and profiled is not None:
                    pid = read_int(profiled["pid"])
                    named_launchers.add(pid)
                    if node is not None:
                        node_of_pid.setdefault(pid, node)
                    elif profiled["rank"] is not None:
                        profiled_node_of_pid.setdefault(pid, read_int(profiled["rank"]))
                if node is not None:
                    event = replace(event, node=node)
                events.append(event)
                naive_times.append(ts)
                launcher_pids.append(launcher_pid)
            except UnreadableNumber:
                # a line of evidence that cannot be read: the run cannot be judged by it
                if bad_number is None:
                    bad_number = EvidenceRef(name, lineno, clip_line(text))
    except OSError as exc:
        return LauncherLog(name, exists=True, line_count=lineno, read_error=str(exc))

    offset = _host_offset(offsets)
    zone = timezone(offset) if offset is not None else UTC

    def utc(naive: datetime | None, fix_year: bool = False) -> datetime | None:
        if naive is None:
            return None
        if fix_year and last_year is not None:
            try:
                naive = naive.replace(year=last_year)
            except ValueError:  # not reached: year 1 has no Feb 29 to carry over
                return None
        if not time_in_range(naive):  # a glog line's year 1 placeholder, never fixed
            return None
        return naive.replace(tzinfo=zone).astimezone(UTC)

    def _node_of(pid: int | None) -> int | None:
        if pid is None:
            return None
        found = node_of_pid.get(pid)
        return found if found is not None else profiled_node_of_pid.get(pid)

    fix = set(pending_year)
    events = [
        replace(
            ev,
            time=utc(naive_times[i], i in fix),
            node=ev.node if ev.node is not None else _node_of(launcher_pids[i]),
            launcher_pid=launcher_pids[i],
            utc=_as_utc(utc_stamps.get(i)),
        )
        for i, ev in enumerate(events)
    ]
    span = [(t, r) for n, r in known_span if (t := utc(n)) is not None] + [
        (t, r) for n, r in pending_span if (t := utc(n, True)) is not None
    ]
    pids = {key for key in newest if key is not None}
    mine = [steps[k] for k in ((None,) if len(pids) <= 1 else pids) if k in steps]
    back = max(mine, key=lambda s: s[0] - s[2]) if mine else None
    back_step = None
    if back is not None:
        earlier_t, earlier_r, later_t, later_r = back
        a, b = utc(later_t), utc(earlier_t)
        if a is not None and b is not None:
            back_step = BackStep(later_r, a, earlier_r, b)
    earliest = min(span, key=lambda s: s[0]) if span else None
    latest = max(span, key=lambda s: s[0]) if span else None
    return LauncherLog(
        file=name,
        exists=True,
        events=tuple(events),
        line_count=lineno,
        first=Instant(utc(first[0]), first[1]) if first else NO_INSTANT,
        last=Instant(utc(last[0]), last[1]) if last else NO_INSTANT,
        config=config,
        config_refs=config_refs,
        config_blocks=tuple(blocks),
        config_conflict=conflict,
        utc_offset=offset,
        bad_stamp=bad_stamp,
        bad_number=bad_number,
        disk_full=disk_full,
        earliest=Instant(*earliest) if earliest else NO_INSTANT,
        latest=Instant(*latest) if latest else NO_INSTANT,
        back_step=back_step,
        launchers=frozenset(named_launchers),
        hosts=frozenset(named_hosts),
    )


def _widen(span: list[tuple[datetime, EvidenceRef]], ts: datetime, ref: EvidenceRef) -> None:
    """Keep ``span`` as [earliest, latest] stamped line seen so far (the first of equal ones)."""
    if not span:
        span += [(ts, ref), (ts, ref)]
    elif ts < span[0][0]:
        span[0] = (ts, ref)
    elif ts > span[1][0]:
        span[1] = (ts, ref)


def _step(
    newest: dict[int | None, tuple[datetime, EvidenceRef]],
    steps: dict[int | None, tuple[datetime, EvidenceRef, datetime, EvidenceRef]],
    key: int | None,
    ts: datetime,
    ref: EvidenceRef,
) -> None:
    """One more stamped line of writer ``key``: keep its latest stamp, and its largest step back
    as (the earlier line's time, its ref, the later line's time, its ref)."""
    before = newest.get(key)
    if before is None or ts >= before[0]:
        newest[key] = (ts, ref)
        return
    worst = steps.get(key)
    if worst is None or before[0] - ts > worst[0] - worst[2]:
        steps[key] = (before[0], before[1], ts, ref)


def _as_utc(naive: datetime | None) -> datetime | None:
    """A profiling event's ``Time: ... UTC`` as an aware time."""
    return naive.replace(tzinfo=UTC) if naive is not None else None


def _host_offset(offsets: list[timedelta]) -> timedelta | None:
    """The host's UTC offset, rounded to 15 minutes (log and profiling stamps differ by ms)."""
    if not offsets:
        return None
    quarter = timedelta(minutes=15)
    day = timedelta(hours=24)
    # a stamp 2000 years off its line (a glog line's year placeholder) is no zone
    rounded = [r for o in offsets if -day < (r := round(o / quarter) * quarter) < day]
    return max(set(rounded), key=rounded.count) if rounded else None
