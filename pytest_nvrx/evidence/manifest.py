"""``run.json`` (what was asked for) and ``result.json`` (how the launcher ended).

Both are written by our launcher (:mod:`pytest_nvrx.recipe`, :mod:`pytest_nvrx.launch`); runs
made by hand (the walkthrough's script, tests/data/gpu) have neither, so every field is optional
and the criteria fall back to the logs. Keys read here::

    run.json     config.fault, config.fault_rank, config.train_iters, config.workload,
                 config.gpus_per_node, config.nnodes, start_time, stack
    result.json  exit_code, start_time, end_time, timed_out, interrupted

Top-level ``fault``/``train_iters``/``workload``/``exit_code`` are accepted as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pytest_nvrx.evidence.refs import (
    EvidenceRef,
    JsonFile,
    display_path,
    json_key_ref,
    parse_iso_utc,
    read_json_file,
)
from pytest_nvrx.layout import RESULT_NAME


class ManifestError(ValueError):
    """run.json or result.json exists but cannot be used."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One manifest value with the line that states it."""

    value: Any
    ref: EvidenceRef


@dataclass(frozen=True, slots=True)
class Manifest:
    file: str
    fault: Setting | None = None
    fault_rank: Setting | None = None
    train_iters: Setting | None = None
    workload: Setting | None = None
    gpus_per_node: Setting | None = None
    start_time: datetime | None = None
    stack: dict[str, Any] = field(default_factory=dict)
    # from result.json
    exit_code: Setting | None = None
    end_time: datetime | None = None
    result_start_time: datetime | None = None


def _lookup(doc: JsonFile, file: str, key: str) -> Setting | None:
    """``config.<key>`` or top-level ``key``; the ref points at the key's line."""
    data = doc.data if isinstance(doc.data, dict) else {}
    config = data.get("config")
    if isinstance(config, dict) and key in config and config[key] is not None:
        # the first '"key":' line: for recipe.manifest's flat config object, the config entry
        return Setting(config[key], json_key_ref(file, doc, key))
    if key in data and data[key] is not None:
        return Setting(data[key], json_key_ref(file, doc, key))
    return None


def _load(path: Path, run_dir: Path) -> tuple[JsonFile, str] | None:
    if not path.exists():
        return None
    file = display_path(path, run_dir)
    try:
        doc = read_json_file(path)
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{file} is unreadable: {exc}") from None
    if not isinstance(doc.data, dict):
        raise ManifestError(f"{file} is not a JSON object")
    return doc, file


def read_manifest(path: Path, run_dir: Path, result_path: Path | None = None) -> Manifest | None:
    """The manifest (merged with result.json when there is one); None if neither exists.

    Raises :class:`ManifestError` when a file exists but is not a usable JSON object: the run's
    own statement of what it was cannot be ignored silently.
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
        for key in ("fault", "fault_rank", "train_iters", "workload", "gpus_per_node"):
            out[key] = _lookup(doc, file, key)
        out["start_time"] = parse_iso_utc(data.get("start_time"))
        stack = data.get("stack")
        out["stack"] = dict(stack) if isinstance(stack, dict) else {}
    if result is not None:
        rdoc, rfile = result
        rdata: dict[str, Any] = rdoc.data  # type: ignore[assignment]
        code = rdata.get("exit_code")
        if isinstance(code, int) and not isinstance(code, bool):
            out["exit_code"] = Setting(code, json_key_ref(rfile, rdoc, "exit_code"))
        out["end_time"] = parse_iso_utc(rdata.get("end_time"))
        out["result_start_time"] = parse_iso_utc(rdata.get("start_time"))
    elif manifest is not None:
        # a manifest that records the exit code itself
        doc, file = manifest
        code = doc.data.get("exit_code") if isinstance(doc.data, dict) else None
        if isinstance(code, int) and not isinstance(code, bool):
            out["exit_code"] = Setting(code, json_key_ref(file, doc, "exit_code"))
    return Manifest(**out)
