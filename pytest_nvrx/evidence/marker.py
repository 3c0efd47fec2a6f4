"""``fault_injected.json``: the once-only injector's claim that it injected a fault.

Written exclusively (O_EXCL) by the worker that injected, just before it faults; a replacement
worker sees it and does not inject again. Fields (walkthrough wrapper and ours): ``fault``
(:data:`~pytest_nvrx.layout.INJECTED_FAULTS`), ``rank``, ``pid``, ``host``, ``signal``,
``tracker_iteration`` (the newest completed checkpoint at injection), ``baseline_iteration``,
``time`` (ISO-8601); ours adds ``local_rank``, ``run_id``, ``tracker`` (the path it watched),
``world_size``, ``restart_count`` and more (pytest_nvrx.worker.injector.build_marker_record).

Schema 2 (issue #10, fault windows) adds ``window`` (step|save|finalize), ``in_flight_iteration``
(the save submitted or being prepared and not yet finalized), ``section`` (the NVRx section open
on the firing thread), ``write_done`` (whether that save's background write had completed),
``trigger`` (the probe that fired) and ``rank_pid`` (the rank's own pid: ``pid`` is the process
the fault was aimed at, the checkpoint worker for ``ckpt-worker``). ``signal`` is null for
``exception``. Every schema-2 marker also carries :data:`SCHEMA_2_REQUIRED` (non-null): one
without them is unusable. A schema-1 marker (no ``schema_version``, or 1) has none of these:
its ``window`` is None, the legacy tracker trigger; one that carries any of them
(:data:`SCHEMA_2_ONLY`) says two things about which injector wrote it and is unusable. ``argv``
is the workload's argv as the rank saw it (its ``--script``/``--module``, then the options after
the injector's ``--``).

``plant`` (issue #25) is the self-test's planted bug the workers ran with (``PYTEST_NVRX_PLANT``),
null without one; a marker written before the key existed has none and means no plant. run.json's
``config.plant`` must name the same (criteria/marker_agreement.py).

A fault schedule's markers (issue #26: ``fault_injected.json`` for the first fault,
``fault_injected_<k>.json`` for the k-th) add ``schedule`` (every fault, ``FAULT@WINDOW``, in
order) and ``schedule_position`` (k, from 1); a fault in window ``restore`` (a replacement
loading its checkpoint; only from the second fault on) records ``load_iteration``, the
checkpoint being loaded, and fires from the trigger ``checkpoint load``. A one-fault run's marker
has none of these.

A marker that exists but cannot be read is evidence of a problem, reported as
:attr:`Marker.error`, never raised. So is a field of the wrong type (``evidence/fields.py``): a
``time`` without its timezone, a ``rank`` that is not a non-negative integer, an unknown
``fault`` or ``window``, a ``pid`` or ``tracker_iteration`` that is not an integer, and a schema-2
marker without its ``window`` or with a fault its window cannot have (``ckpt-worker`` outside
``finalize``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pytest_nvrx.evidence.fields import (
    Fields,
    bool_field,
    int_field,
    str_field,
    strings_field,
    time_field,
)
from pytest_nvrx.evidence.refs import (
    EvidenceRef,
    JsonFile,
    RefusedFile,
    display_path,
    json_key_ref,
    read_json_file,
)
from pytest_nvrx.layout import INJECTED_FAULTS, MARKER_NAME, SCHEDULE_WINDOWS, window_allowed
from pytest_nvrx.settings.schedule import ALL_WINDOWS, windows_at

#: The marker schemas this reader knows (1: the tracker trigger; 2: fault windows).
SCHEMA_VERSIONS = (1, 2)
#: The fields only a schema-2 marker has (pytest_nvrx.worker.injector.build_marker_record).
SCHEMA_2_ONLY = ("window", "trigger", "in_flight_iteration", "section", "write_done", "rank_pid")
#: The fields our injector writes into every schema-2 marker, never null in a run launched
#: through the real launcher (pytest_nvrx.injector.build_marker_record: the launcher's
#: WORLD_SIZE and TORCHELASTIC_RESTART_COUNT, our NVRX_RUN_ID, the process, host, tracker path
#: and argv): the cross-checks of criteria/marker_agreement.py read them, so one missing is a
#: marker that cannot be checked (a transplanted marker stripped of what would betray it).
SCHEMA_2_REQUIRED = ("run_id", "argv", "world_size", "host", "tracker", "pid", "restart_count")
#: The probes a schema-2 marker names as its ``trigger``.
TRIGGERS = (
    "start_section(step)",
    "save submit",
    "start_section(checkpointing)",
    "end_section(checkpointing)",
    "tracker poll",
    "checkpoint load",
)


@dataclass(frozen=True, slots=True)
class Marker:
    file: str
    error: str | None = None  # why the file could not be used; the fields below are then None
    fault: str | None = None
    rank: int | None = None
    local_rank: int | None = None  # written by our injector; absent in the walkthrough's
    pid: int | None = None
    host: str | None = None
    signal: str | None = None
    tracker_iteration: int | None = None
    baseline_iteration: int | None = None
    time: datetime | None = None
    doc: JsonFile | None = None
    # schema 2 (fault windows); None in a schema-1 marker
    schema_version: int = 1
    window: str | None = None
    in_flight_iteration: int | None = None
    section: str | None = None
    write_done: bool | None = None
    trigger: str | None = None
    rank_pid: int | None = None  # the rank's own pid (pid is the worker's for ckpt-worker)
    # the run and the world the injector found itself in (our injector's; absent in the
    # walkthrough's): NVRX_RUN_ID, the tracker path it watched (as the run host named it, never
    # opened), WORLD_SIZE and TORCHELASTIC_RESTART_COUNT
    run_id: str | None = None
    tracker: str | None = None
    world_size: int | None = None
    restart_count: int | None = None
    # the workload's argv as the rank saw it (our injector's; absent in the walkthrough's)
    argv: tuple[str, ...] | None = None
    # the self-test's planted bug in the workers' environment (None: none, or an older marker)
    plant: str | None = None
    # a fault schedule's marker: the whole schedule and this fault's position in it (from 1);
    # the checkpoint a restore-window fault struck the loading of
    schedule: tuple[str, ...] | None = None
    schedule_position: int | None = None
    load_iteration: int | None = None
    # the key of the first field that makes the marker unusable, when one does: its line is
    # the evidence (quoted exactly in JSON, escaped on a terminal)
    error_key: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def rank_process(self) -> int | None:
        """The pid of the faulted rank: ``rank_pid`` (schema 2), else ``pid``."""
        return self.rank_pid if self.rank_pid is not None else self.pid

    def ref(self, key: str | None = None) -> EvidenceRef:
        """The line of ``key`` in the marker (the whole file when no key or unreadable)."""
        if key is None and self.error is not None and self.error_key is not None:
            key = self.error_key
        if self.doc is None or key is None:
            return EvidenceRef(self.file, None, self.error or "injection marker")
        return json_key_ref(self.file, self.doc, key)


# What a marker records; a field of the wrong type makes the marker unusable (issue #9: typed
# fields). Required: fault, rank, time (with its timezone); the rest may be absent or null.
FAULTS = INJECTED_FAULTS


#: How many marker-like names :func:`marker_like_names` returns at most (a schedule writes one
#: marker per fault; more is a directory nobody's injector wrote).
MAX_MARKER_NAMES = 100


def marker_like_names(run_dir: Path) -> tuple[str, ...]:
    """The names in ``run_dir`` that look like a marker (``fault_injected*.json``, whatever their
    kind), sorted, at most :data:`MAX_MARKER_NAMES`; none when the directory cannot be listed
    (the run's loader reports that)."""
    stem, _, suffix = MARKER_NAME.rpartition(".")
    try:
        with os.scandir(run_dir) as entries:
            names = sorted(
                e.name for e in entries if e.name.startswith(stem) and e.name.endswith(f".{suffix}")
            )
    except OSError:
        return ()
    return tuple(names[:MAX_MARKER_NAMES])


def read_marker(path: Path, run_dir: Path) -> Marker | None:
    """The marker, ``None`` when there is none, or a Marker whose ``error`` says what is wrong.

    Only a regular file in the run directory is a marker: a FIFO, device or directory, or a
    symlink leaving ``run_dir``, is an error (never opened for reading).
    """
    file = display_path(path, run_dir)
    if not path.exists() and not path.is_symlink():
        return None
    try:
        doc = read_json_file(path, run_dir, shown=file)
    except RefusedFile as exc:
        return Marker(file, error=str(exc))
    except (OSError, ValueError) as exc:
        return Marker(file, error=f"{file} is unreadable: {exc}")
    data = doc.data
    if not isinstance(data, dict):
        return Marker(file, error=f"{file} is not a JSON object", doc=doc)
    fields = Fields(data)
    fault = fields.get(str_field, "fault", required=True, choices=FAULTS)
    time = fields.get(time_field, "time", required=True)
    rank = fields.get(int_field, "rank", required=True, minimum=0)
    local_rank = fields.get(int_field, "local_rank", minimum=0)
    pid = fields.get(int_field, "pid", minimum=1)
    host = fields.get(str_field, "host")
    signal = fields.get(str_field, "signal")
    tracker_iteration = fields.get(int_field, "tracker_iteration", minimum=0)
    baseline_iteration = fields.get(int_field, "baseline_iteration", minimum=0)
    world_size = fields.get(int_field, "world_size", minimum=1)
    restart_count = fields.get(int_field, "restart_count", minimum=0)
    run_id = fields.get(str_field, "run_id")
    tracker = fields.get(str_field, "tracker")
    schema = fields.get(int_field, "schema_version", minimum=1)
    window = fields.get(str_field, "window", choices=ALL_WINDOWS)
    in_flight = fields.get(int_field, "in_flight_iteration", minimum=0)
    section = fields.get(str_field, "section")
    write_done = fields.get(bool_field, "write_done")
    trigger = fields.get(str_field, "trigger", choices=TRIGGERS)
    rank_pid = fields.get(int_field, "rank_pid", minimum=1)
    argv = fields.get(strings_field, "argv")
    plant = fields.get(str_field, "plant")
    schedule = fields.get(strings_field, "schedule")
    position = fields.get(int_field, "schedule_position", minimum=1)
    load_iteration = fields.get(int_field, "load_iteration", minimum=0)
    problems = fields.problems
    bad_keys = [key for key in fields.bad_keys if key in data]
    version = schema if schema is not None else 1
    first_bad = "window"  # the line a problem of the schema's own fields points at
    if version not in SCHEMA_VERSIONS:
        known = " and ".join(map(str, SCHEMA_VERSIONS))
        problems.append(f"'schema_version' {version} is unknown (this reader knows {known})")
        bad_keys.append("schema_version")
    elif version >= 2 and data.get("window") is None:
        problems.append("a schema 2 marker must record its 'window'")
    elif version == 1 and (newer := [key for key in SCHEMA_2_ONLY if key in data]):
        said = "no 'schema_version'" if schema is None else "'schema_version' 1"
        problems.append(
            f"a schema 1 marker ({said}) carries schema 2's {', '.join(map(repr, newer))}:"
            " which injector wrote it is unknown"
        )
        bad_keys.append(newer[0])
        first_bad = newer[0]
    if version >= 2 and (lacking := [k for k in SCHEMA_2_REQUIRED if data.get(k) is None]):
        problems.append(
            f"a schema 2 marker records {', '.join(map(repr, SCHEMA_2_REQUIRED))} (its injector"
            f" always writes them), this one lacks {', '.join(map(repr, lacking))}"
        )
        if lacking[0] in data:
            bad_keys.append(lacking[0])
    if fault is not None and window is not None and not _allowed(fault, window, position):
        at = f" as fault {position} of a schedule" if position is not None else ""
        problems.append(f"fault {fault!r} cannot be injected in window {window!r}{at}")
        bad_keys.append("window")
    if (schedule is None) != (position is None):
        given = "schedule" if schedule is not None else "schedule_position"
        problems.append(f"{given!r} without its pair: which fault of which schedule is unknown")
        bad_keys.append(given)
    elif schedule is not None and position is not None and position > len(schedule):
        problems.append(f"'schedule_position' {position} is beyond its {len(schedule)} faults")
        bad_keys.append("schedule_position")
    return Marker(
        file=file,
        error=f"{file}: " + ", ".join(problems) if problems else None,
        error_key=next((k for k in fields.bad_keys if k in data), first_bad if problems else None),
        fault=fault,
        rank=rank,
        local_rank=local_rank,
        pid=pid,
        host=host,
        signal=signal,
        tracker_iteration=tracker_iteration,
        baseline_iteration=baseline_iteration,
        time=time,
        doc=doc,
        schema_version=version,
        window=window,
        in_flight_iteration=in_flight,
        section=section,
        write_done=write_done,
        trigger=trigger,
        rank_pid=rank_pid,
        run_id=run_id,
        tracker=tracker,
        world_size=world_size,
        restart_count=restart_count,
        argv=argv,
        plant=plant,
        schedule=schedule,
        schedule_position=position,
        load_iteration=load_iteration,
    )


def _allowed(fault: str, window: str, position: int | None) -> bool:
    """A window the fault exists in; restore only as a schedule's second or later fault."""
    if window in SCHEDULE_WINDOWS:
        return position is not None and window in windows_at(fault, position)
    return window_allowed(fault, window)
