"""``run.json`` (what was asked for) and ``result.json`` (how the launcher ended).

Both are written by our launcher (:mod:`pytest_nvrx.launch.recipe`,
:mod:`pytest_nvrx.launch.launcher`); runs made by hand (the walkthrough's script, tests/data/gpu)
have neither, so every field is optional and the criteria fall back to the logs. Keys read here::

    run.json     schema (must be MANIFEST_SCHEMA), config.run_id, config.fault, config.window,
                 config.fault_rank, config.train_iters, config.workload, config.gpus_per_node,
                 config.nnodes, config.world_size, config.tp, config.pp, config.checkpoint_dir,
                 config.selftest, config.plant, config.save_interval,
                 config.distributed_optimizer, config.section_timeouts,
                 config.out_of_section_timeout, tracker_readings, workload_argv, start_time,
                 stack
    result.json  exit_code, start_time, end_time, wall_s, timed_out, interrupted

run.json states some settings twice, and the two must agree: what it says against itself is
evidence/manifest_contradictions.py's (:attr:`Manifest.contradictions`, fatal in
criteria/consistency.py, naming both lines).

``interrupted`` is the stop signal's name (``"SIGTERM"``) or null; ``false`` (runs recorded
before it named the signal) means not interrupted, ``true`` interrupted by an unnamed signal.

Top-level ``fault``/``train_iters``/``workload``/``exit_code`` are accepted as well. Each is
typed (``evidence/fields.py``): ``exit_code`` an integer (``"0"`` and ``true`` are not), times
ISO-8601 with their timezone, ``train_iters``/``gpus_per_node`` positive integers, ``fault`` one
of :data:`~pytest_nvrx.layout.INJECTED_FAULTS` or none, ``window`` one of
:data:`~pytest_nvrx.layout.FAULT_WINDOWS` (absent in runs made before fault windows: the legacy
tracker trigger); null means "not recorded". A value of another type makes the file unusable.
``plant`` (the self-test's planted bug, issue #25) is a name of the catalogue
(:data:`pytest_nvrx.settings.plants.PLANTS`) or null: a name this version does not know makes the
file unusable, so that a planted run can never be judged as an unplanted one. ``selftest`` is a
boolean. What the recorded launch environment (``env``, and the ``command`` it was spelled in) says
of a plant is read as well (:attr:`Manifest.plant_labels`): the plant it names
(``PYTEST_NVRX_PLANT``), where its records go (``PYTEST_NVRX_PLANT_RECORDS``), the plant hook on the
workers' ``PYTHONPATH``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pytest_nvrx.evidence.fields import (
    FieldError,
    Fields,
    bool_field,
    int_field,
    names_field,
    seconds_field,
    shown,
    str_field,
    strings_field,
    time_field,
)
from pytest_nvrx.evidence.manifest_contradictions import argv_option, contradictions
from pytest_nvrx.evidence.refs import (
    NO_INSTANT,
    EvidenceRef,
    Instant,
    JsonFile,
    Problem,
    RefusedFile,
    clip_line,
    display_path,
    json_key_ref,
    read_json_file,
)
from pytest_nvrx.layout import (
    FAULT_WINDOWS,
    INJECTED_FAULTS,
    MANIFEST_SCHEMA,
    RESULT_NAME,
)
from pytest_nvrx.settings.plants import PLANTS
from pytest_nvrx.settings.schedule import ScheduledFault, parse_schedule
from pytest_nvrx.settings.values import ConfigError
from pytest_nvrx.worker.plant_hook import nvrx_plants
from pytest_nvrx.worker.plant_hook.nvrx_plants import PLANT_ENV, RECORDS_ENV


class ManifestError(ValueError):
    """run.json or result.json exists but cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One manifest value with the line that states it."""

    value: Any
    ref: EvidenceRef


@dataclass(frozen=True, slots=True)
class PlantLabel:
    """What run.json's recorded launch environment says of a plant: ``name``, the plant it names
    (None: it installs or records one without naming it), ``what`` it says, and its line."""

    name: str | None
    what: str
    ref: EvidenceRef


#: the plant hook's directory name (pytest_nvrx/plant_hook): first on a planted Megatron run's
#: PYTHONPATH
PLANT_HOOK_DIR = Path(nvrx_plants.__file__).parent.name


@dataclass(frozen=True, slots=True)
class Manifest:
    file: str
    run_id: Setting | None = None
    fault: Setting | None = None
    window: Setting | None = None  # None: not recorded (a baseline, or a run before windows)
    fault_rank: Setting | None = None
    train_iters: Setting | None = None
    workload: Setting | None = None
    gpus_per_node: Setting | None = None
    nnodes: Setting | None = None
    world_size: Setting | None = None
    tp: Setting | None = None
    pp: Setting | None = None
    checkpoint_dir: Setting | None = None  # as the run host named it (never opened)
    host: Setting | None = None  # the host the harness launched on (run.json ``host``)
    node_index: Setting | None = None  # this node's index in a run of several nodes
    # the self-test (issue #25): a self-test run (control or planted), and its planted bug: a
    # Setting whose value is None where run.json records ``"plant": null`` (with that line), None
    # where it records nothing (a run before plants); a planted run is never a qualification run
    selftest: Setting | None = None
    plant: Setting | None = None
    # the plant labels of the launch environment run.json records (``env``, ``command``)
    plant_labels: tuple[PlantLabel, ...] = ()
    # a fault schedule's run (issue #26): its faults in order (an empty list: one fault), and
    # the launcher's restart budget they are judged against
    schedule: Setting | None = None
    max_restarts: Setting | None = None
    # what the workers are asked to run with: compared with what they print
    # (criteria/manifest_agreement.py)
    save_interval: Setting | None = None
    distributed_optimizer: Setting | None = None
    section_timeouts: Setting | None = None  # as the launcher is given it: "setup:120,step:10"
    out_of_section_timeout: Setting | None = None
    # True: the injector this run launched logs rank 0's tracker readings in every cycle, after
    # its announcement (criteria/required_evidence.py requires both); None: not recorded (the
    # runs before the harness said so)
    tracker_readings: Setting | None = None
    # run.json's start_time (written as the launch began), with its line
    start: Instant = NO_INSTANT
    stack: dict[str, Any] = field(default_factory=dict)
    # the line of each of the stack's keys
    stack_refs: dict[str, EvidenceRef] = field(default_factory=dict)
    # the workload's own arguments (after the injector's ``--``), with the line that lists them
    workload_argv: tuple[str, ...] = ()
    workload_argv_ref: EvidenceRef | None = None
    # the injector's --script/--module (the workload's argv[0] as the rank saw it)
    workload_entry: str | None = None
    # run.json stating one setting two ways (module doc): fatal where judged
    contradictions: tuple[Problem, ...] = ()
    # from result.json
    exit_code: Setting | None = None
    end: Instant = NO_INSTANT
    result_start: Instant = NO_INSTANT
    # the launch's duration on the harness's monotonic clock (result.json's wall_s)
    wall_s: Setting | None = None
    # the runs that held one of this run's GPUs while it ran (result.json; a pool's record):
    # its recovery timings include their memory and load. None: not recorded
    gpu_shared_with: Setting | None = None
    timed_out: Setting | None = None  # True: our launch deadline stopped the launcher
    interrupted: Setting | None = None  # the stop signal's name (True: unnamed); None: not
    # the keys result.json holds (None: there is no result.json)
    result_keys: frozenset[str] | None = None
    # the keys of RESULT_VALUES result.json records as null, each with its line
    result_nulls: tuple[tuple[str, EvidenceRef], ...] = ()

    @property
    def planted(self) -> str | None:
        """The plant run.json names; None: no plant."""
        return self.plant.value if self.plant is not None else None

    @property
    def scheduled_faults(self) -> tuple[ScheduledFault, ...]:
        """The schedule run.json records (empty: a run of one fault, or of none)."""
        if self.schedule is None or not self.schedule.value:
            return ()
        return parse_schedule(",".join(self.schedule.value), "run.json's schedule")

    @property
    def is_selftest(self) -> bool:
        return self.selftest is not None and self.selftest.value is True


def _schedule_field(data: Mapping[str, object], key: str) -> tuple[str, ...] | None:
    """A list of ``FAULT@WINDOW`` strings, each a fault the injector takes at its position."""
    entries = strings_field(data, key)
    if entries:
        try:
            parse_schedule(",".join(entries), repr(key))
        except ConfigError as exc:
            raise FieldError(str(exc)) from None
    return entries


#: result.json's values that the harness (launch.RunResult) and its watchdog always know and
#: write: never null in their record
RESULT_VALUES = ("timed_out", "wall_s", "start_time", "end_time")


# run.json keys read here (config.<key> or top level) and the type each must have.
_TYPED: dict[str, tuple[Callable[..., object], dict[str, Any]]] = {
    "run_id": (str_field, {}),
    "fault": (str_field, {"choices": (*INJECTED_FAULTS, "none")}),
    "window": (str_field, {"choices": FAULT_WINDOWS}),
    "fault_rank": (int_field, {"minimum": 0}),
    "train_iters": (int_field, {"minimum": 1}),
    "workload": (str_field, {}),
    "gpus_per_node": (int_field, {"minimum": 1}),
    "nnodes": (int_field, {"minimum": 1}),
    "world_size": (int_field, {"minimum": 1}),
    "tp": (int_field, {"minimum": 1}),
    "pp": (int_field, {"minimum": 1}),
    "checkpoint_dir": (str_field, {}),
    "host": (str_field, {}),
    "node_index": (int_field, {"minimum": 0}),
    "selftest": (bool_field, {}),
    "plant": (str_field, {"choices": tuple(p.name for p in PLANTS)}),
    "schedule": (_schedule_field, {}),
    "max_restarts": (int_field, {"minimum": 0}),
    "save_interval": (int_field, {"minimum": 1}),
    "distributed_optimizer": (bool_field, {}),
    "tracker_readings": (bool_field, {}),
    "section_timeouts": (str_field, {}),
    "out_of_section_timeout": (seconds_field, {}),
}


def _lookup(data: dict[str, Any], key: str, *, doc: JsonFile, file: str) -> Setting | None:
    """``config.<key>`` or top-level ``key``; the ref points at the key's line.

    Raises :class:`~pytest_nvrx.evidence.fields.FieldError` when the value has the wrong type.
    """
    config = data.get("config")
    where, source = "", data
    if isinstance(config, dict) and config.get(key) is not None:
        # the first '"key":' line: for recipe.manifest's flat config object, the config entry
        where, source = " (in config)", config
    elif data.get(key) is None:
        return None
    read, kwargs = _TYPED[key]
    try:
        read(source, key, **kwargs)
    except FieldError as exc:
        raise FieldError(f"{exc}{where}") from None
    return Setting(source[key], json_key_ref(file, doc, key))


def _load(path: Path, run_dir: Path) -> tuple[JsonFile, str] | None:
    if not path.exists() and not path.is_symlink():
        return None
    file = display_path(path, run_dir)
    try:
        doc = read_json_file(path, run_dir, shown=file)
    except RefusedFile as exc:  # a FIFO, device, directory, or a link out of the run dir
        raise ManifestError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{file} is unreadable: {exc}") from None
    if not isinstance(doc.data, dict):
        raise ManifestError(f"{file} is not a JSON object")
    return doc, file


def read_manifest(path: Path, run_dir: Path, result_path: Path | None = None) -> Manifest | None:
    """The manifest (merged with result.json when there is one); None if neither exists.

    Raises :class:`ManifestError` when a file exists but is not a usable JSON object, or a field
    it holds has the wrong type: the run's own statement of what it was and how it ended cannot
    be ignored silently.
    """
    result_path = result_path if result_path is not None else path.with_name(RESULT_NAME)
    manifest = _load(path, run_dir)
    result = _load(result_path, run_dir)
    if manifest is None and result is None:
        return None
    out: dict[str, Any] = {"file": display_path(path, run_dir)}
    if manifest is not None:
        doc, file = manifest
        data: dict[str, Any] = doc.data  # type: ignore[assignment]
        _check_schema(data, file)
        fields = Fields(data)
        for key in _TYPED:
            out[key] = fields.get(_lookup, key, doc=doc, file=file)
        if out["plant"] is None:
            out["plant"] = _recorded_null(data, doc, file, "plant")
        out["plant_labels"] = _plant_labels(data, doc, file)
        out["start"] = _instant(fields.get(time_field, "start_time"), file, doc, "start_time")
        stack = data.get("stack")
        out["stack"] = dict(stack) if isinstance(stack, dict) else {}
        out["stack_refs"] = {k: json_key_ref(file, doc, k) for k in out["stack"]}
        argv = data.get("workload_argv")
        if isinstance(argv, list) and all(isinstance(a, str) for a in argv):
            # the injector's own options come first, the workload's after its "--"
            out["workload_argv"] = tuple(argv[argv.index("--") + 1 :] if "--" in argv else argv)
            out["workload_argv_ref"] = json_key_ref(file, doc, "workload_argv")
            if "--" in argv:
                out["workload_entry"] = argv_option(
                    argv[: argv.index("--")], "--script", "--module"
                )
        out["contradictions"] = contradictions(data, path, run_dir, file)
        if result is None:
            # a manifest that records the exit code itself
            out["exit_code"] = _exit_code(fields, doc, file)
        _raise_if_wrong(file, fields)
    if result is not None:
        rdoc, rfile = result
        # _load made sure it is a JSON object
        out["result_keys"] = frozenset(rdoc.data if isinstance(rdoc.data, dict) else ())
        rfields = Fields(rdoc.data)  # type: ignore[arg-type]
        out["exit_code"] = _exit_code(rfields, rdoc, rfile)
        out["end"] = _instant(rfields.get(time_field, "end_time"), rfile, rdoc, "end_time")
        start = rfields.get(time_field, "start_time")
        out["result_start"] = _instant(start, rfile, rdoc, "start_time")
        wall = rfields.get(seconds_field, "wall_s")
        if wall is not None:
            out["wall_s"] = Setting(wall, json_key_ref(rfile, rdoc, "wall_s"))
        shared = rfields.get(names_field, "gpu_shared_with")
        if shared is not None:
            own = out.get("run_id")
            if isinstance(own, Setting) and own.value in shared:
                rfields.problems.append(f"'gpu_shared_with' names the run itself ({own.value})")
            out["gpu_shared_with"] = Setting(shared, json_key_ref(rfile, rdoc, "gpu_shared_with"))
        timed_out = rfields.get(bool_field, "timed_out")
        if timed_out is not None:
            out["timed_out"] = Setting(timed_out, json_key_ref(rfile, rdoc, "timed_out"))
        out["interrupted"] = _interrupted(rdoc, rfile)
        out["result_nulls"] = tuple(
            (key, json_key_ref(rfile, rdoc, key))
            for key in RESULT_VALUES
            if isinstance(rdoc.data, dict) and key in rdoc.data and rdoc.data[key] is None
        )
        _raise_if_wrong(rfile, rfields)
    return Manifest(**out)


def _plant_labels(data: dict[str, Any], doc: JsonFile, file: str) -> tuple[PlantLabel, ...]:
    """The plant labels of the recorded launch environment: ``env``'s variables, then the same
    variables as ``command`` spells them (``NAME=value`` words before the launcher)."""
    found: list[PlantLabel] = []
    env = data.get("env")
    if isinstance(env, dict):
        found += _env_labels(
            {k: v for k, v in env.items() if isinstance(v, str)},
            lambda key: json_key_ref(file, doc, key),
            "env",
        )
    command = data.get("command")
    if isinstance(command, str):
        words: dict[str, str] = {}
        for word in command.split():
            name, eq, value = word.partition("=")
            if not eq or not name.isidentifier():
                break  # the assignments end where the launcher's path begins
            words[name] = value
        found += _env_labels(words, lambda _: json_key_ref(file, doc, "command"), "command")
    return tuple(found)


def _env_labels(
    env: Mapping[str, str], ref: Callable[[str], EvidenceRef], where: str
) -> list[PlantLabel]:
    out: list[PlantLabel] = []
    plant = env.get(PLANT_ENV)
    if plant:
        out.append(PlantLabel(plant, f"{where} {PLANT_ENV}={clip_line(plant, 40)}", ref(PLANT_ENV)))
    if env.get(RECORDS_ENV):
        out.append(
            PlantLabel(None, f"{where} {RECORDS_ENV} (where plant records go)", ref(RECORDS_ENV))
        )
    path = env.get("PYTHONPATH", "")
    if any(Path(entry).name == PLANT_HOOK_DIR for entry in path.split(":") if entry):
        out.append(
            PlantLabel(
                None,
                f"{where} PYTHONPATH with the plant hook ({PLANT_HOOK_DIR})",
                ref("PYTHONPATH"),
            )
        )
    return out


def _recorded_null(data: dict[str, Any], doc: JsonFile, file: str, key: str) -> Setting | None:
    """``config.<key>`` recorded as null, with its line (what a contradiction quotes); None when
    run.json does not record the key."""
    config = data.get("config")
    if isinstance(config, dict) and key in config and config[key] is None:
        return Setting(None, json_key_ref(file, doc, key))
    return None


def _instant(time: datetime | None, file: str, doc: JsonFile, key: str) -> Instant:
    """A time ``key`` records, with its line (none: no time)."""
    return Instant(time, json_key_ref(file, doc, key)) if time is not None else NO_INSTANT


def _check_schema(data: dict[str, Any], file: str) -> None:
    """run.json's ``schema`` must be the one this version writes and reads: another (a newer
    tool's, a hand-written file's) may mean other things by the same keys."""
    schema = data.get("schema")
    if schema is None:
        raise ManifestError(f"{file} has no schema number (this version reads {MANIFEST_SCHEMA})")
    if type(schema) is not int or schema != MANIFEST_SCHEMA:  # True == 1, "1" != 1
        what = repr(schema) if type(schema) in (int, str) else shown(schema)
        raise ManifestError(
            f"{file} schema {what} is not one this version reads ({MANIFEST_SCHEMA})"
        )


def _interrupted(doc: JsonFile, file: str) -> Setting | None:
    """result.json's ``interrupted``: the signal's name, or True; None when not interrupted."""
    value = doc.data.get("interrupted") if isinstance(doc.data, dict) else None
    if value is None or value is False:
        return None
    if value is True or (isinstance(value, str) and value):
        return Setting(value, json_key_ref(file, doc, "interrupted"))
    raise ManifestError(
        f"{file}: 'interrupted' must be a signal name, a boolean or null, not {shown(value)}"
    )


def _exit_code(fields: Fields, doc: JsonFile, file: str) -> Setting | None:
    code = fields.get(int_field, "exit_code")
    return Setting(code, json_key_ref(file, doc, "exit_code")) if code is not None else None


def _raise_if_wrong(file: str, fields: Fields) -> None:
    if fields.problems:
        raise ManifestError(f"{file}: " + ", ".join(fields.problems))
