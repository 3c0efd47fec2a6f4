"""The injector's own lines in a cycle log: what the once-only fault wrapper says it did.

The injector (:mod:`pytest_nvrx.worker.injector`) writes to the rank's stderr, so its lines land in
``logs/train_cycle<N>.log`` behind NVRx's rank prefix as
``<rank>: [pytest-nvrx injector] rank R pid P: <message>``. Messages recognised:

* start (schema 2): ``watching <tracker> (baseline B) to inject <fault> in window <W>``;
  schema 1: ``watching <tracker> (baseline B) to inject <fault> (<SIG>) once it advances``;
* fire (schema 2): ``window <W> (<trigger>): in-flight iteration <N|none>, tracker <T>; marker
  <M> written; <action>``, the action one of ``sending <SIG> to pid <P>``, ``raising
  InjectedFault``, ``sending SIGKILL to checkpoint worker pid <P> (rank pid <Q>)``;
  schema 1: ``tracker <tracker> advanced B -> T; marker <M> written; sending <SIG>[ to pid P]``;
* skip: ``marker <M> exists: fault already injected; running the workload without injection``;
* tracker (rank 0, every run): ``checkpoint tracker reads <N> at <ISO time> (<probe>)``, once
  per value it reads at its section/submit probes (``start`` for the value found at start-up);
* observing (rank 0, every process, before its first reading): ``reading checkpoint tracker
  <tracker>; each new value read is logged``; injectors older than that line logged their
  readings without announcing them (the committed runs of 2026-12-01 to 12-05);
* armed (a fault schedule's): ``schedule <S>: arming fault <k> of <n> (<fault>@<window>), marker
  <path>``;
* never (exit 3): ``ERROR: the requested fault (<fault> on rank <R>) never happened: <why>``
  (a schedule's: ``(scheduled fault <k> of <n>, <fault>@<window> on rank <R>)``),
  ``<why>`` e.g. ``window <W> never opened while training ran (baseline B, highest tracker read
  T, saves submitted: ...[; the tracker already named the save in flight when its finalization
  began: ...]; NVRx sections seen)``.

The ``exception`` fault's own exception line (``InjectedFault: pytest-nvrx injected exception on
rank R in window W (in-flight iteration N, tracker T)``, the last line of its traceback) states
the same: :func:`parse_injected_exception`.

These lines corroborate the marker (the file a criterion judges by); runs made with the
walkthrough's wrapper have none, so each is required only where the run says our injector printed
it (criteria/required_evidence.py, criteria/marker_agreement.py). Nothing here judges.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple

from pytest_nvrx.evidence.refs import EvidenceRef, LineCursor, read_int
from pytest_nvrx.evidence.tracebacks import split_tag

TAG = "[pytest-nvrx injector] "
#: the head of rank 0's announcement that it logs its tracker readings (the injector's
#: OBSERVER_ANNOUNCEMENT; tests/worker/test_tracker_readers_agree.py holds the two equal)
OBSERVER_ANNOUNCEMENT = "reading checkpoint tracker"
#: Injector lines a cycle log keeps: a few per cycle, plus rank 0's tracker readings, one per
#: checkpoint the cycle finalized (a longer cycle keeps the first ones).
MAX_INJECTOR_LINES = 4096

InjectorLineKind = Literal["watching", "fired", "skipped", "never", "tracker", "armed", "observing"]

_HEAD = re.compile(re.escape(TAG) + r"rank (?P<rank>\d+) pid (?P<pid>\d+): (?P<msg>.*)$")
_WATCHING = re.compile(
    r"watching (?P<tracker>.+) \(baseline (?P<base>\d+)\) to inject (?P<fault>[\w-]+)"
    r"(?: \((?P<how>SIG\w+|InjectedFault)\))?"
    r"(?: in window (?P<window>\w+)| \((?P<sig>SIG\w+)\) once it advances)$"
)
_FIRED = re.compile(
    r"window (?P<window>\w+) \((?P<trigger>[^)]*\)?)\): in-flight iteration (?P<n>\d+|none),"
    r" tracker (?P<t>\d+); marker (?P<marker>.+) written; (?P<action>.*)$"
)
_FIRED_V1 = re.compile(
    r"tracker (?P<tracker>.+) advanced (?P<base>\d+) -> (?P<t>\d+); marker (?P<marker>.+)"
    r" written; (?P<action>sending (?P<sig>SIG\w+)(?: to pid (?P<target>\d+))?)$"
)
_SIGNAL_TO_PID = re.compile(r"sending (?P<sig>SIG\w+) to pid (?P<target>\d+)$")
_TO_WORKER = re.compile(
    r"sending (?P<sig>SIG\w+) to checkpoint worker pid (?P<target>\d+) \(rank pid (?P<rp>\d+)\)"
    r"(?:; .*)?$"
)
_RAISING = "raising InjectedFault"
_ARMED = re.compile(
    r"schedule (?P<schedule>\S+): arming fault (?P<k>\d+) of (?P<n>\d+) \((?P<entry>[\w-]+@\w+)\),"
    r" marker "
)
_SKIPPED = re.compile(r"marker (?P<marker>.+) exists: fault already injected")
_NEVER = re.compile(
    r"ERROR: the requested fault \((?:scheduled fault \d+ of \d+, (?P<entry>[\w-]+)@\w+|"
    r"(?P<fault>[\w-]+)) on rank (?P<rank>\d+)\) never happened: (?P<why>.*)$"
)
_TRACKER_READ = re.compile(
    r"checkpoint tracker reads (?P<t>\d+) at (?P<ts>\S+)"
    r" \((?P<where>[^()]*(?:\([^()]*\))?[^()]*)\)$",
    re.ASCII,
)
_OBSERVING = re.compile(
    re.escape(OBSERVER_ANNOUNCEMENT) + r" (?P<tracker>.+); each new value read is logged$"
)
_NEVER_WINDOW = re.compile(r"window (?P<window>\w+) never opened ")
_NEVER_BASELINE = re.compile(r"\(baseline (?P<base>\d+)[,)]")


@dataclass(frozen=True, slots=True)
class InjectorLine:
    """One recognised injector line; fields the line does not state are None.

    ``legacy`` marks the schema-1 formats (no window). For a fire line, ``target_pid`` is the
    process the action names (the rank, or its checkpoint worker), ``signal`` None when the
    action raises InjectedFault.
    """

    kind: InjectorLineKind
    rank: int
    pid: int
    ref: EvidenceRef
    fault: str | None = None
    window: str | None = None
    trigger: str | None = None
    in_flight_iteration: int | None = None
    tracker_iteration: int | None = None
    baseline_iteration: int | None = None
    action: str | None = None
    signal: str | None = None
    target_pid: int | None = None
    raises: bool = False
    legacy: bool = False
    # fire (ckpt-worker): the rank's own pid the action names beside its worker's
    rank_pid: int | None = None
    # never: the injector's reason, as it wrote it (its first line)
    reason: str | None = None
    # tracker: when the value was read (an aware datetime), the probe in ``trigger``
    time: datetime | None = None
    # armed (a fault schedule's): the schedule as the injector read it, the position it armed
    schedule: str | None = None
    position: int | None = None


class _Head(NamedTuple):
    """What every injector line states first, and its reference: an InjectorLine's first fields
    after its kind."""

    rank: int
    pid: int
    ref: EvidenceRef


def _tracker_read(m: re.Match[str], head: _Head, at: LineCursor) -> InjectorLine | None:
    when = at.aware_time(m["ts"])
    if when is None:
        return None
    return InjectorLine(
        "tracker",
        *head,
        tracker_iteration=read_int(m["t"]),
        trigger=m["where"],
        time=when,
    )


def _observing(m: re.Match[str], head: _Head, at: LineCursor) -> InjectorLine:
    return InjectorLine("observing", *head)


def _fired(m: re.Match[str], head: _Head, at: LineCursor) -> InjectorLine:
    action = m["action"]
    signal: str | None = None
    target: int | None = None
    named_rank: int | None = None
    if (a := _TO_WORKER.match(action)) is not None:
        signal, target, named_rank = a["sig"], read_int(a["target"]), read_int(a["rp"])
    elif (a := _SIGNAL_TO_PID.match(action)) is not None:
        signal, target = a["sig"], read_int(a["target"])
    return InjectorLine(
        "fired",
        *head,
        window=m["window"],
        trigger=m["trigger"],
        in_flight_iteration=None if m["n"] == "none" else read_int(m["n"]),
        tracker_iteration=read_int(m["t"]),
        action=action,
        signal=signal,
        target_pid=target,
        raises=action.startswith(_RAISING),
        rank_pid=named_rank,
    )


def _fired_v1(m: re.Match[str], head: _Head, at: LineCursor) -> InjectorLine:
    return InjectorLine(
        "fired",
        *head,
        tracker_iteration=read_int(m["t"]),
        baseline_iteration=read_int(m["base"]),
        action=m["action"],
        signal=m["sig"],
        target_pid=read_int(m["target"]) if m["target"] else head.pid,
        legacy=True,
    )


def _watching(m: re.Match[str], head: _Head, at: LineCursor) -> InjectorLine:
    return InjectorLine(
        "watching",
        *head,
        fault=m["fault"],
        window=m["window"],
        baseline_iteration=read_int(m["base"]),
        signal=m["sig"],
        legacy=m["window"] is None,
    )


def _armed(m: re.Match[str], head: _Head, at: LineCursor) -> InjectorLine:
    fault, _, window = m["entry"].partition("@")
    return InjectorLine(
        "armed",
        *head,
        schedule=m["schedule"],
        position=read_int(m["k"]),
        fault=fault,
        window=window,
    )


def _skipped(m: re.Match[str], head: _Head, at: LineCursor) -> InjectorLine:
    return InjectorLine("skipped", *head)


def _never(m: re.Match[str], head: _Head, at: LineCursor) -> InjectorLine:
    why = m["why"]
    window = _NEVER_WINDOW.match(why)
    base = _NEVER_BASELINE.search(why)
    return InjectorLine(
        "never",
        *head,
        fault=m["fault"] or m["entry"],
        window=window["window"] if window is not None else None,
        baseline_iteration=read_int(base["base"]) if base is not None else None,
        reason=why,
    )


#: Each message the injector writes, by its first word (no two messages share one): the pattern
#: the whole message must match (each spells the message from its first word on; a message that
#: does not match is no injector line), and what is made of its match (with the line's head and
#: the cursor on it): the line, or None where a value it states is not read.
_MESSAGES: dict[
    str, tuple[re.Pattern[str], Callable[[re.Match[str], _Head, LineCursor], InjectorLine | None]]
] = {
    "checkpoint": (_TRACKER_READ, _tracker_read),
    OBSERVER_ANNOUNCEMENT.partition(" ")[0]: (_OBSERVING, _observing),
    "window": (_FIRED, _fired),
    "tracker": (_FIRED_V1, _fired_v1),
    "watching": (_WATCHING, _watching),
    "schedule": (_ARMED, _armed),
    "marker": (_SKIPPED, _skipped),
    "ERROR:": (_NEVER, _never),
}


def parse_injector_line(body: str, at: LineCursor) -> InjectorLine | None:
    """The injector line in ``body`` (the text after NVRx's rank prefix), else None."""
    _, text = split_tag(body)
    head = _HEAD.match(text)
    if head is None:
        return None
    rank, pid, msg = read_int(head["rank"]), read_int(head["pid"]), head["msg"]
    message = _MESSAGES.get(msg.partition(" ")[0])
    if message is None:
        return None
    pattern, build = message
    m = pattern.match(msg)
    return build(m, _Head(rank, pid, at.ref()), at) if m is not None else None


@dataclass(frozen=True, slots=True)
class InjectedException:
    """What the ``exception`` fault's InjectedFault message states (the injector raises it with
    ``pytest-nvrx injected exception on rank R in window W (in-flight iteration N|none, tracker
    T)``); ``in_flight_iteration`` None: none was in flight."""

    rank: int
    window: str
    in_flight_iteration: int | None
    tracker_iteration: int


_INJECTED = re.compile(
    r"(?:\w+\.)*InjectedFault: pytest-nvrx injected exception on rank (?P<rank>\d+) in window"
    r" (?P<window>\w+) \(in-flight iteration (?P<n>\d+|none), tracker (?P<t>\d+)\)$",
    re.ASCII,
)


def parse_injected_exception(text: str) -> InjectedException | None:
    """The statement of an InjectedFault exception line (its text without prefixes), else None."""
    m = _INJECTED.match(text.strip())
    if m is None:
        return None
    return InjectedException(
        rank=read_int(m["rank"]),
        window=m["window"],
        in_flight_iteration=None if m["n"] == "none" else read_int(m["n"]),
        tracker_iteration=read_int(m["t"]),
    )
