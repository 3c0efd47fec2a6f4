"""Benchmark ``verify`` and the report over every committed run directory (tests/data).

Run: .venv/bin/python benchmarks/bench_verify.py [--rounds 5] [--against DIR ...]

For this checkout's package, and for each ``--against DIR`` (another checkout's root, whose
``pytest_nvrx`` is imported in its place: ``git archive REV pytest_nvrx | tar -x -C DIR`` gives
one), a child process loads and judges every committed run dir as ``verify`` does
(``judge_run_dir``), then builds each one's report (``ScenarioReport.from_judgement``, then the
page and report.json), ``--rounds`` times. Reported per package, the least of the rounds, in CPU
seconds of the child (``time.process_time``: another job on a 2-core machine disturbs it less
than wall time), for all run dirs and for the fault-schedule runs alone (each fault's recovery
is measured by its own clock there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
from pathlib import Path
from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.evidence.rundir import load_run
from pytest_nvrx.report import ScenarioReport, render_html, report_json

data = Path(sys.argv[1])
rounds = int(sys.argv[2])
dirs = sorted(p.parent for p in data.rglob("run.json"))
schedules = [d for d in dirs if d.relative_to(data).parts[0].endswith("-schedules")]


def verify(run_dirs):
    for d in run_dirs:
        judge_run_dir(d)


def report(run_dirs):
    for d in run_dirs:
        run = load_run(d, read_checkpoints=False)
        rep = ScenarioReport.from_judgement(run, judge_run_dir(d))
        render_html([rep])
        json.dumps(report_json([rep]))


package = __import__("pytest_nvrx").__file__
out = {"package": package, "dirs": len(dirs), "schedules": len(schedules)}
for name, fn, run_dirs in (
    ("verify_all_s", verify, dirs),
    ("verify_schedules_s", verify, schedules),
    ("report_all_s", report, dirs),
    ("report_schedules_s", report, schedules),
):
    best = None
    for _ in range(rounds):
        start = time.process_time()
        fn(run_dirs)
        spent = time.process_time() - start
        best = spent if best is None else min(best, spent)
    out[name] = round(best, 3)
print(json.dumps(out))
"""


def measure(package_root: Path, rounds: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT / "tests" / "data"), str(rounds)],
        cwd="/",  # not this checkout: its package would shadow PYTHONPATH's
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", type=Path, action="append", default=[])
    args = parser.parse_args()
    for root in [ROOT, *args.against]:
        print(json.dumps(measure(root.resolve(), args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
