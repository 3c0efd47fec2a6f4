"""``cycle_infos/``: the launcher's record of each cycle (``--ft-cycle-info-dir``).

Files are ``cycle_info.<job_id>.<attempt>.<cycle>`` (empty job id outside Slurm:
``cycle_info..0.1``) holding NVRx's protobuf-JSON record, plus ``cycle_info.<job_id>.current``
(a symlink, or a copy holding the name it pointed to). Records carry start/end times and the
cycle's log file (an absolute path on the run host: only its name is used here). They record no
failure reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pytest_nvrx.evidence.refs import (
    EvidenceRef,
    Problem,
    display_path,
    file_refusal,
    json_key_ref,
    parse_iso_utc,
    read_json_file,
)

_NAME = re.compile(r"cycle_info\.(?P<job>.*)\.(?P<attempt>\d+)\.(?P<cycle>\d+)")


@dataclass(frozen=True, slots=True)
class CycleInfo:
    cycle: int
    attempt: int
    job_id: str
    start: datetime | None
    end: datetime | None  # None while the cycle runs (or if the launcher died)
    log_name: str | None  # basename of the cycle's application log
    active_ranks: str | None
    ref: EvidenceRef  # the cycle_start_time line
    end_ref: EvidenceRef | None
    # the cycle_log_file line: the launcher's own word on which file is the cycle's log
    log_ref: EvidenceRef | None = None


@dataclass(frozen=True, slots=True)
class CycleInfos:
    dir: str
    exists: bool
    records: tuple[CycleInfo, ...] = ()
    problems: tuple[Problem, ...] = ()

    def by_cycle(self, cycle: int) -> CycleInfo | None:
        for record in self.records:
            if record.cycle == cycle:
                return record
        return None


def read_cycle_infos(directory: Path, run_dir: Path) -> CycleInfos:
    """All cycle records, ordered by (attempt, cycle); bad files become warnings.

    A record name held by a FIFO, device or directory is a fatal problem: only regular files
    are evidence (it is never opened). Symlinks are skipped, as before: NVRx writes records as
    regular files and only its ``.current`` pointer as a link.
    """
    shown = display_path(directory, run_dir)
    if not directory.is_dir():
        return CycleInfos(shown, exists=False)
    records: list[CycleInfo] = []
    problems: list[Problem] = []
    for path in sorted(directory.iterdir()):
        m = _NAME.fullmatch(path.name)
        if m is None or path.is_symlink():
            continue  # ".current" pointer, temp files of the atomic writer, strays
        file = display_path(path, run_dir)
        why = file_refusal(path, run_dir)
        if why is not None:
            problems.append(
                Problem("fatal", f"cycle record {file} {why}", EvidenceRef(file, None, f"({why})"))
            )
            continue
        try:
            doc = read_json_file(path, run_dir, shown=file)
        except (OSError, ValueError) as exc:
            problems.append(
                Problem(
                    "warning",
                    f"cycle record {file} unreadable: {exc}",
                    EvidenceRef(file, None, str(exc)),
                )
            )
            continue
        data = doc.data if isinstance(doc.data, dict) else {}
        cycle = data.get("cycle_number", int(m["cycle"]))
        attempt = data.get("attempt_index", int(m["attempt"]))
        log_file = data.get("cycle_log_file")
        ranks = data.get("active_ranks")
        records.append(
            CycleInfo(
                cycle=cycle if isinstance(cycle, int) else int(m["cycle"]),
                attempt=attempt if isinstance(attempt, int) else int(m["attempt"]),
                job_id=m["job"],
                start=parse_iso_utc(data.get("cycle_start_time")),
                end=parse_iso_utc(data.get("cycle_end_time")),
                log_name=Path(log_file).name if isinstance(log_file, str) and log_file else None,
                active_ranks=str(ranks) if ranks is not None else None,
                ref=json_key_ref(file, doc, "cycle_start_time"),
                end_ref=json_key_ref(file, doc, "cycle_end_time")
                if "cycle_end_time" in data
                else None,
                log_ref=json_key_ref(file, doc, "cycle_log_file")
                if "cycle_log_file" in data
                else None,
            )
        )
    records.sort(key=lambda r: (r.attempt, r.cycle))
    return CycleInfos(shown, exists=True, records=tuple(records), problems=tuple(problems))
