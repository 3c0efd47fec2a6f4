"""``run.json`` (what was asked for) and ``result.json`` (how the launcher ended).

Both are written by our launcher (:mod:`pytest_nvrx.recipe`, :mod:`pytest_nvrx.launch`); runs
made by hand (the walkthrough's script, tests/data/gpu) have neither, so every field is optional
and the criteria fall back to the logs. Keys read here::

    run.json     schema (must be MANIFEST_SCHEMA), config.run_id, config.fault, config.window,
                 config.fault_rank, config.train_iters, config.workload, config.gpus_per_node,
                 config.nnodes, config.world_size, config.tp, config.pp, config.checkpoint_dir,
                 workload_argv, start_time, stack
    result.json  exit_code, start_time, end_time, timed_out, interrupted

``interrupted`` is the stop signal's name (``"SIGTERM"``) or null; ``false`` (runs recorded
before it named the signal) means not interrupted, ``true`` interrupted by an unnamed signal.

Top-level ``fault``/``train_iters``/``workload``/``exit_code`` are accepted as well. Each is
typed (``evidence/fields.py``): ``exit_code`` an integer (``"0"`` and ``true`` are not), times
ISO-8601 with their timezone, ``train_iters``/``gpus_per_node`` positive integers, ``fault`` one
of :data:`~pytest_nvrx.layout.INJECTED_FAULTS` or none, ``window`` one of
:data:`~pytest_nvrx.layout.FAULT_WINDOWS` (absent in runs made before fault windows: the legacy
tracker trigger); null means "not recorded". A value of another type makes the file unusable.
"""

from __future__ import annotations

from collections.abc import Callable
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
from pytest_nvrx.layout import FAULT_WINDOWS, INJECTED_FAULTS, MANIFEST_SCHEMA, RESULT_NAME


class ManifestError(ValueError):
    """run.json or result.json exists but cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One manifest value with the line that states it."""

    value: Any
    ref: EvidenceRef


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
    start_time: datetime | None = None
    start_ref: EvidenceRef | None = None
    stack: dict[str, Any] = field(default_factory=dict)
    # the workload's own arguments (after the injector's ``--``), with the line that lists them
    workload_argv: tuple[str, ...] = ()
    workload_argv_ref: EvidenceRef | None = None
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
        out["start_time"] = fields.get(time_field, "start_time")
        out["start_ref"] = _ref_if(out["start_time"], file, doc, "start_time")
        stack = data.get("stack")
        out["stack"] = dict(stack) if isinstance(stack, dict) else {}
        argv = data.get("workload_argv")
        if isinstance(argv, list) and all(isinstance(a, str) for a in argv):
            # the injector's own options come first, the workload's after its "--"
            out["workload_argv"] = tuple(argv[argv.index("--") + 1 :] if "--" in argv else argv)
            out["workload_argv_ref"] = json_key_ref(file, doc, "workload_argv")
        if result is None:
            # a manifest that records the exit code itself
            out["exit_code"] = _exit_code(fields, doc, file)
        _raise_if_wrong(file, fields)
    if result is not None:
        rdoc, rfile = result
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
            out["gpu_shared_with"] = Setting(shared, json_key_ref(rfile, rdoc, "gpu_shared_with"))
        timed_out = rfields.get(bool_field, "timed_out")
        if timed_out is not None:
            out["timed_out"] = Setting(timed_out, json_key_ref(rfile, rdoc, "timed_out"))
        out["interrupted"] = _interrupted(rdoc, rfile)
        _raise_if_wrong(rfile, rfields)
    return Manifest(**out)


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
