"""Write the report of every committed run (tests/data) to a folder, to compare two versions.

``python scripts/report_snapshots.py OUT_DIR`` writes, for each committed run directory (one with
``logs/launcher.log``), ``<run>.json`` and ``<run>.html`` (``<run>``: its path under tests/data,
``/`` as ``__``) as ``python -m pytest_nvrx report`` builds them, plus ``<run>.xdist.json``: the
same report after the trip an xdist worker's report makes (as_dict -> from_dict -> as_dict).
Run it with the package of each version on ``PYTHONPATH`` (``git archive`` of the older commit)
and ``diff -r`` the two folders: a change that must not move a report shows as no difference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pytest_nvrx.report.main import build_reports
from pytest_nvrx.report.model import ScenarioReport
from pytest_nvrx.report.render import render_html, report_json

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write(__doc__ or "")
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    runs = sorted(p.parent.parent for p in DATA.rglob("logs/launcher.log"))
    for run in runs:
        name = str(run.relative_to(DATA)).replace("/", "__")
        reports = build_reports([run])
        (out / f"{name}.json").write_text(json.dumps(report_json(reports), indent=1) + "\n")
        (out / f"{name}.html").write_text(render_html(reports))
        shipped = [ScenarioReport.from_dict(r.as_dict()) for r in reports]
        (out / f"{name}.xdist.json").write_text(json.dumps(report_json(shipped), indent=1) + "\n")
    sys.stdout.write(f"{len(runs)} runs -> {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
