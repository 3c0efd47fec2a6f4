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

run.json states some settings twice, and the two must agree (:attr:`Manifest.contradictions`,
fatal in criteria/consistency.py, naming both lines): a top-level key and the same key under
``config``; ``workload_argv``'s ``--train-iters``/``--save-interval`` and config's
``train_iters``/``save_interval``; ``launcher_argv``'s ``--nproc-per-node``/``--nnodes`` and
config's ``gpus_per_node``/``nnodes``; config's ``world_size`` is ``nnodes * gpus_per_node``;
and the launcher's and the injector's arguments, the paths they name, ``env.NVRX_RUN_ID`` and
``command`` against config (:func:`_launch_contradictions`).

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

import json
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePath
from typing import Any, TypeGuard

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
from pytest_nvrx.evidence.refs import (
    MAX_JSON_BYTES,
    EvidenceRef,
    JsonFile,
    Problem,
    RefusedFile,
    clip_line,
    display_path,
    json_key_ref,
    read_capped,
    read_json_file,
)
from pytest_nvrx.layout import (
    APPLOG_PREFIX_NAME,
    CYCLE_INFOS_DIR,
    FAULT_WINDOWS,
    INJECTED_FAULTS,
    LAUNCHER_LOG_NAME,
    LOGS_DIR,
    MANIFEST_SCHEMA,
    MARKER_NAME,
    RESULT_NAME,
    TRACKER_NAME,
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
    start_time: datetime | None = None
    start_ref: EvidenceRef | None = None
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
    end_time: datetime | None = None
    result_start_time: datetime | None = None
    result_start_ref: EvidenceRef | None = None
    end_ref: EvidenceRef | None = None
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
        out["start_time"] = fields.get(time_field, "start_time")
        out["start_ref"] = _ref_if(out["start_time"], file, doc, "start_time")
        stack = data.get("stack")
        out["stack"] = dict(stack) if isinstance(stack, dict) else {}
        out["stack_refs"] = {k: json_key_ref(file, doc, k) for k in out["stack"]}
        argv = data.get("workload_argv")
        if isinstance(argv, list) and all(isinstance(a, str) for a in argv):
            # the injector's own options come first, the workload's after its "--"
            out["workload_argv"] = tuple(argv[argv.index("--") + 1 :] if "--" in argv else argv)
            out["workload_argv_ref"] = json_key_ref(file, doc, "workload_argv")
            if "--" in argv:
                out["workload_entry"] = _option(argv[: argv.index("--")], "--script", "--module")
        lines = _key_lines(_text(path, run_dir, file))
        out["contradictions"] = tuple(_contradictions(data, file, lines))
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
        out["end_time"] = rfields.get(time_field, "end_time")
        out["result_start_time"] = rfields.get(time_field, "start_time")
        out["end_ref"] = _ref_if(out["end_time"], rfile, rdoc, "end_time")
        out["result_start_ref"] = _ref_if(out["result_start_time"], rfile, rdoc, "start_time")
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


def _ref_if(value: object, file: str, doc: JsonFile, key: str) -> EvidenceRef | None:
    return json_key_ref(file, doc, key) if value is not None else None


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


# ---------------------------------------------------------------------------------------------
# run.json against itself


def _text(path: Path, run_dir: Path, file: str) -> str:
    """run.json's text again (already read and parsed once), for the line of a nested key."""
    try:
        return read_capped(path, MAX_JSON_BYTES, run_dir, shown=file).decode("utf-8", "replace")
    except OSError:
        return ""


_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|[{}\[\]\n]')
_COLON = re.compile(r"\s*:")


def _key_lines(text: str) -> dict[tuple[str, ...], tuple[int, str]]:
    """The line of each object key, by its path (``("config", "run_id")``; the first of
    repeated ones): a top-level key and the same key under ``config`` are told apart."""
    found: dict[tuple[str, ...], tuple[int, str]] = {}
    rows = text.splitlines()
    path: list[str | None] = []  # the key each open container is the value of
    key: str | None = None
    line = 1
    for m in _TOKEN.finditer(text):
        token = m[0]
        if token == "\n":
            line += 1
        elif token in "{[":
            path.append(key)
            key = None
        elif token in "}]":
            if path:
                path.pop()
            key = None
        elif _COLON.match(text, m.end()) is not None:
            try:
                key = json.loads(token)
            except ValueError:
                key = None
            outer = [k for k in path[1:] if k is not None]
            if isinstance(key, str) and len(outer) == len(path[1:]):
                row = rows[line - 1] if line <= len(rows) else ""
                found.setdefault((*outer, key), (line, clip_line(row)))
    return found


def _option(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last ``--name=value`` or ``--name value`` of ``names`` (what argparse
    reads); None when none is given."""
    value: str | None = None
    for i, arg in enumerate(argv):
        name, eq, given = arg.partition("=")
        if name in names:
            value = given if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return value


def _shown(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _contradictions(
    data: dict[str, Any], file: str, lines: dict[tuple[str, ...], tuple[int, str]]
) -> list[Problem]:
    """Each setting run.json states twice with two values (module doc), naming both lines."""
    out: list[Problem] = []

    def ref(*path: str) -> EvidenceRef:
        found = lines.get(path)
        if found is None:
            return EvidenceRef(file, None, f"({'.'.join(path)})")
        return EvidenceRef(file, found[0], found[1])

    def say(text: str, at: EvidenceRef) -> None:
        out.append(Problem("fatal", f"{text}: run.json contradicts itself", at))

    config = data.get("config")
    config = config if isinstance(config, dict) else {}
    for key, value in data.items():
        other = config.get(key) if key != "config" else None
        if value is None or other is None or json.dumps(value) == json.dumps(other):
            continue
        top, inner = ref(key), ref("config", key)
        say(
            f"{top.location} says {key} {_shown(value)}, but {inner.location} (config.{key})"
            f" says {_shown(other)}",
            inner,
        )
    for name, options in (
        (
            "workload_argv",
            ((("--train-iters",), "train_iters"), (("--save-interval",), "save_interval")),
        ),
        (
            "launcher_argv",
            (
                (("--nproc-per-node", "--nproc_per_node"), "gpus_per_node"),
                (("--nproc-per-node", "--nproc_per_node"), "nproc_per_node"),
                (("--nnodes",), "nnodes"),
            ),
        ),
    ):
        argv = data.get(name)
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            continue
        if name == "workload_argv" and "--" in argv:
            argv = argv[argv.index("--") + 1 :]  # the workload's own options
        for names, key in options:
            _argv_against_config(argv, ref(name), config, ref, say, names, key)
    _launch_contradictions(data, config, ref, say)
    # runs recorded before gpus_per_node named it nproc_per_node
    per_node = "gpus_per_node" if config.get("gpus_per_node") is not None else "nproc_per_node"
    world, nnodes, gpus = (config.get(k) for k in ("world_size", "nnodes", per_node))
    if _is_int(world) and _is_int(nnodes) and _is_int(gpus) and world != nnodes * gpus:
        say(
            f"{ref('config', 'world_size').location} says world_size {world}, but"
            f" {ref('config', 'nnodes').location} and {ref('config', per_node).location}"
            f" say {nnodes} node(s) of {gpus} GPU(s): {nnodes * gpus} rank(s)",
            ref("config", "world_size"),
        )
    return out


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _argv_against_config(
    argv: Sequence[str],
    argv_ref: EvidenceRef,
    config: dict[str, Any],
    ref: Callable[..., EvidenceRef],
    say: Callable[[str, EvidenceRef], None],
    names: tuple[str, ...],
    key: str,
) -> None:
    """Says (``say``) when an option of ``argv`` is given a value other than config's ``key``
    (``--nnodes`` may be a ``MIN:MAX`` range that holds it)."""
    wanted = config.get(key)
    given = _option(argv, *names)
    if given is None or not _is_int(wanted):
        return
    assert isinstance(wanted, int)
    low, colon, high = given.partition(":")
    try:
        if colon and key == "nnodes":
            agrees = int(low) <= wanted <= int(high)
        else:
            agrees = given.isascii() and given.isdigit() and int(given) == wanted
    except ValueError:
        agrees = False
    if not agrees:
        inner = ref("config", key)
        say(
            f"{argv_ref.location} passes {names[0]} {given!r}, but {inner.location}"
            f" (config.{key}) says {wanted}",
            inner,
        )


#: what ft_launcher is given, each the ``launcher_argv`` option recipe.launcher_argv spells from
#: a config key (a number compared as one: ``60`` and ``60.0`` are the same deadline)
_LAUNCHER_FROM_CONFIG: tuple[tuple[str, str, bool], ...] = (
    ("--rdzv-id", "run_id", False),
    ("--rdzv-endpoint", "rdzv_endpoint", False),
    ("--max-restarts", "max_restarts", True),
    ("--ft-rank-section-timeouts", "section_timeouts", False),
    ("--ft-rank-out-of-section-timeout", "out_of_section_timeout", True),
    ("--ft-workload-check-interval", "workload_check_interval", True),
)

#: the injector's options (``workload_argv`` before its ``--``), each spelled by
#: recipe.injector_argv from a config key
_INJECTOR_FROM_CONFIG: tuple[tuple[str, str, bool], ...] = (
    ("--fault-rank", "fault_rank", True),
    ("--checkpoint-dir", "checkpoint_dir", False),
)


def _same_value(given: str, wanted: object, numeric: bool) -> bool:
    if numeric:
        if not (isinstance(wanted, int | float) and not isinstance(wanted, bool)):
            return False
        try:
            return given.isascii() and float(given) == float(wanted)
        except ValueError:
            return False
    return isinstance(wanted, str) and given == wanted


def _launch_contradictions(
    data: dict[str, Any],
    config: dict[str, Any],
    ref: Callable[..., EvidenceRef],
    say: Callable[[str, EvidenceRef], None],
) -> None:
    """run.json's record of the launch against its own config: the launcher's and the
    injector's arguments (recipe.launcher_argv, recipe.injector_argv spell them from config),
    the paths they name (all in one run directory), the environment, and ``command``, which is
    ``env`` and both argvs shell-quoted (recipe.Recipe.shell_command). The harness writes all
    of them from one recipe, so a difference is an edited record, never a run: the launcher or
    the injector would have been given something else than the config that is judged. A key
    that runs recorded before it existed (config.run_id, rdzv_endpoint, checkpoint_dir,
    work_dir; the injector of the first baselines) is compared only where recorded."""
    launcher = data.get("launcher_argv")
    workload = data.get("workload_argv")
    launcher = launcher if _strings(launcher) else None
    workload = workload if _strings(workload) else None
    run_id = config.get("run_id") if config.get("run_id") is not None else data.get("run_id")
    wanted = {**config, "run_id": run_id}

    def compare(
        argv: Sequence[str], argv_name: str, table: tuple[tuple[str, str, bool], ...]
    ) -> None:
        for option, key, numeric in table:
            given, value = _option(argv, option), wanted.get(key)
            if key not in wanted or (key == "run_id" and run_id is None):
                continue  # a run recorded before config held the key
            if value is None and given is None:
                continue
            if value is None or given is None or not _same_value(given, value, numeric):
                at = ref("config", key) if key in config else ref(key)
                passes = f"passes {option} {given!r}" if given is not None else f"has no {option}"
                say(
                    f"{ref(argv_name).location} {passes}, but {at.location} ({key}) says"
                    f" {_shown(value)}",
                    at,
                )

    if launcher is not None:
        compare(launcher, "launcher_argv", _LAUNCHER_FROM_CONFIG)
        port = data.get("log_server_port")
        given = _option(launcher, "--ft-log-server-port")
        if port is not None and (given is None or not _same_value(given, port, True)):
            say(
                f"{ref('launcher_argv').location} passes --ft-log-server-port {given!r}, but"
                f" {ref('log_server_port').location} says {_shown(port)}",
                ref("log_server_port"),
            )
    injector = workload[: workload.index("--")] if workload and "--" in workload else None
    if injector is not None:
        compare(injector, "workload_argv", _INJECTOR_FROM_CONFIG)
        _injector_fault(injector, config, ref, say)
    _one_run_dir(launcher or (), injector or (), config, run_id, ref, say)
    env = data.get("env")
    if isinstance(env, dict) and run_id is not None and env.get("NVRX_RUN_ID") != run_id:
        at = ref("config", "run_id") if "run_id" in config else ref("run_id")
        say(
            f"{ref('env', 'NVRX_RUN_ID').location} (env.NVRX_RUN_ID) says"
            f" {_shown(env.get('NVRX_RUN_ID'))}, but {at.location} (run_id) says"
            f" {_shown(run_id)}",
            ref("env", "NVRX_RUN_ID"),
        )
    command = data.get("command")
    if (
        isinstance(command, str)
        and isinstance(env, dict)
        and all(isinstance(v, str) for v in env.values())
        and launcher is not None
        and workload is not None
    ):
        spelled = " ".join(
            [
                *(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())),
                *(shlex.quote(a) for a in (*launcher, *workload)),
            ]
        )
        if command != spelled:
            say(
                f"{ref('command').location} (command) is not env, launcher_argv and"
                f" workload_argv as they are recorded ({_first_difference(command, spelled)})",
                ref("command"),
            )


def _strings(value: object) -> TypeGuard[list[str]]:
    return isinstance(value, list) and all(isinstance(a, str) for a in value)


def _first_difference(one: str, other: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(one, other, strict=False)) if a != b), None)
    if at is None:
        at = min(len(one), len(other))
    return f"from character {at + 1}: {_shown(one[at : at + 30])} vs {_shown(other[at : at + 30])}"


def _injector_fault(
    injector: Sequence[str],
    config: dict[str, Any],
    ref: Callable[..., EvidenceRef],
    say: Callable[[str, EvidenceRef], None],
) -> None:
    """The fault the injector was launched for (``--schedule``, or ``--fault`` and
    ``--window``) against config's: the one the marker and the logs are judged by."""
    schedule = config.get("schedule")
    pairs: list[tuple[str, str, object]] = []
    if schedule:
        spelled = ",".join(schedule) if _strings(schedule) else schedule
        pairs.append(("--schedule", "schedule", spelled))
    else:
        pairs.append(("--fault", "fault", config.get("fault")))
        if config.get("window") is not None:
            # a window recorded: the injector is given it (a run before windows has neither)
            pairs.append(("--window", "window", config.get("window")))
    for option, key, value in pairs:
        given = _option(injector, option)
        if value is None and given is None:
            continue
        if given != value:
            at = ref("config", key)
            passes = f"passes {option} {given!r}" if given is not None else f"has no {option}"
            say(
                f"{ref('workload_argv').location} {passes}, but {at.location} (config.{key})"
                f" says {_shown(value)}",
                at,
            )


def _one_run_dir(
    launcher: Sequence[str],
    injector: Sequence[str],
    config: dict[str, Any],
    run_id: object,
    ref: Callable[..., EvidenceRef],
    say: Callable[[str, EvidenceRef], None],
) -> None:
    """The paths the launcher and the injector are given name one run directory (the
    walkthrough's layout: layout.RunLayout) under config's ``work_dir``/runs/<run id>, and
    the tracker NVRx watches is the one in config's (or the injector's) checkpoint dir."""
    infos = _option(launcher, "--ft-cycle-info-dir")
    run_dir = str(PurePath(infos).parent) if infos else None
    expected: list[tuple[Sequence[str], str, str, str | None]] = []
    if run_dir is not None:
        work_dir = config.get("work_dir")
        if isinstance(work_dir, str) and isinstance(run_id, str):
            at = str(PurePath(work_dir) / "runs" / run_id / CYCLE_INFOS_DIR)
            expected.append((launcher, "launcher_argv", "--ft-cycle-info-dir", at))
        logs = PurePath(run_dir) / LOGS_DIR
        expected += [
            (
                launcher,
                "launcher_argv",
                "--ft-per-cycle-applog-prefix",
                str(logs / APPLOG_PREFIX_NAME),
            ),
            (launcher, "launcher_argv", "--ft-nvrx-logfile", str(logs / LAUNCHER_LOG_NAME)),
            (injector, "workload_argv", "--fault-marker", str(PurePath(run_dir) / MARKER_NAME)),
        ]
    checkpoints = config.get("checkpoint_dir")
    if not isinstance(checkpoints, str):
        checkpoints = _option(injector, "--checkpoint-dir")
    if checkpoints:
        tracker = str(PurePath(checkpoints) / TRACKER_NAME)
        expected.append((launcher, "launcher_argv", "--ft-checkpoint-iteration-file", tracker))
    for argv, name, option, path in expected:
        if not argv:
            continue
        given = _option(argv, option)
        if given is not None and path is not None and PurePath(given) != PurePath(path):
            say(
                f"{ref(name).location} passes {option} {given!r}, not {path!r}: the run"
                f" directory and checkpoint dir the rest of run.json names",
                ref(name),
            )
