"""A planted run's records: what each plant did, written by the worker process that did it.

``<run dir>/plant-records/*.json``, one per act (pytest_nvrx/worker/plant_hook/nvrx_plants.record):
``plant``, ``applied`` (false: the plant could not act and says why), ``action``, ``rank``,
``restart_count``, ``pid``, ``host``. A record that cannot be read is a problem of the run, never
skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_nvrx.evidence.refs import (
    EvidenceRef,
    Problem,
    RefusedFile,
    file_refusal,
    json_key_ref,
    read_json_file,
)
from pytest_nvrx.layout import PLANT_RECORDS_DIR as RECORDS_DIR

#: How many records are read at most (a plant acts once per process and cycle).
MAX_RECORDS = 1000


@dataclass(frozen=True, slots=True)
class PlantRecord:
    plant: str
    applied: bool
    action: str
    rank: int | None
    restart_count: int | None
    pid: int | None
    ref: EvidenceRef


@dataclass(frozen=True, slots=True)
class PlantRecords:
    """Every record of the run (sorted by file name) and every one that could not be used."""

    records: tuple[PlantRecord, ...] = ()
    problems: tuple[Problem, ...] = ()

    @property
    def applied(self) -> tuple[PlantRecord, ...]:
        return tuple(r for r in self.records if r.applied)

    @property
    def refused(self) -> tuple[PlantRecord, ...]:
        return tuple(r for r in self.records if not r.applied)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_plant_records(run_dir: Path) -> PlantRecords:
    """The records under ``run_dir/plant-records/``; none when the directory is absent."""
    folder = run_dir / RECORDS_DIR
    if not folder.exists() and not folder.is_symlink():
        return PlantRecords()
    refusal = file_refusal(folder, run_dir, want_dir=True)
    if refusal is not None:
        return PlantRecords(problems=(Problem("fatal", f"{RECORDS_DIR}/ {refusal}"),))
    records: list[PlantRecord] = []
    problems: list[Problem] = []
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))
    if len(names) > MAX_RECORDS:
        problems.append(
            Problem("fatal", f"{RECORDS_DIR}/ holds {len(names)} records, more than {MAX_RECORDS}")
        )
        names = names[:MAX_RECORDS]
    for name in names:
        shown = f"{RECORDS_DIR}/{name}"
        try:
            doc = read_json_file(folder / name, run_dir, shown=shown)
        except (OSError, RefusedFile, ValueError) as exc:
            problems.append(Problem("fatal", f"plant record {shown}: {exc}"))
            continue
        data = doc.data
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("plant"), str)
            or not isinstance(data.get("applied"), bool)
            or not isinstance(data.get("action"), str)
        ):
            problems.append(
                Problem("fatal", f"plant record {shown}: not a record (plant, applied, action)")
            )
            continue
        records.append(
            PlantRecord(
                plant=data["plant"],
                applied=data["applied"],
                action=data["action"],
                rank=_int_or_none(data.get("rank")),
                restart_count=_int_or_none(data.get("restart_count")),
                pid=_int_or_none(data.get("pid")),
                ref=json_key_ref(shown, doc, "action"),
            )
        )
    return PlantRecords(tuple(records), tuple(problems))
