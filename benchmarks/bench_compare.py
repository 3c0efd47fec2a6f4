"""Benchmark ``compare`` of two 10-scenario reports: the whole command and the comparison alone.

Run: .venv/bin/python benchmarks/bench_compare.py [--repeat 7]

OLD is the report.json of ten committed real run directories (four Megatron fault schedules on
an H200, three CPU reference runs, two H200 Megatron runs, the planted-load pair's slow run),
written here by ``report``; NEW is a copy whose every recovery timing is 10% longer. Printed:
both documents' sizes, the wall time of ``python -m pytest_nvrx compare OLD NEW --fail-on
verdict,downtime:+5% -o page.html --json out.json`` in a fresh interpreter (what a CI step waits
for: start, imports, reading, comparing, writing; best and median of ``--repeat``), and of
``load_side`` twice + ``compare`` + the three renderings in this process (best). The bound the
project keeps: under 1 s (docs/performance.md). Then the pairing of keys a side shows only in
part (``diff._pair_partial_keys``) on ``--keys`` keys a side with none in common, the case that
costs most (best): linear in the keys.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_nvrx.compare import compare, load_side, parse_gate
from pytest_nvrx.compare.diff import ScenarioKey, _pair_partial_keys
from pytest_nvrx.compare.render import document, html, text
from pytest_nvrx.report import ScenarioReport, build_reports, write_report

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
RUN_DIRS = (
    *sorted((DATA / "gpu-schedules" / "core_v0.19.0").iterdir()),
    DATA / "cpu" / "reference-baseline",
    DATA / "cpu" / "reference-hang",
    DATA / "cpu" / "reference-kill",
    DATA / "gpu" / "gpu-baseline-20",
    DATA / "gpu" / "gpu-kill-100",
    DATA / "compare" / "planted-load-delay" / "slow",
)
GATE = "verdict,downtime:+5%"


def _slower(data: dict[str, Any], factor: float) -> dict[str, Any]:
    def times(v: float | None) -> float | None:
        return None if v is None else round(v * factor, 3)

    for s in data["scenarios"]:
        s["downtime_s"] = times(s["downtime_s"])
        if "total_downtime_s" in s:
            s["total_downtime_s"] = times(s["total_downtime_s"])
        for r in [s["recovery"], *s.get("recoveries", [])]:
            if r is not None:
                r["downtime_s"] = times(r["downtime_s"])
                for p in r["phases"]:
                    p["seconds"] = times(p["seconds"])
    return data


def _command_s(old: Path, new: Path, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_nvrx",
            "compare",
            str(old),
            str(new),
            "--fail-on",
            GATE,
            "-o",
            str(out / "page.html"),
            "--json",
            str(out / "out.json"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return time.perf_counter() - start


def _in_process_s(old: Path, new: Path) -> float:
    start = time.perf_counter()
    result = compare(load_side(old, "OLD"), load_side(new, "NEW"), parse_gate([GATE]))
    text(result), html(result), json.dumps(document(result))
    return time.perf_counter() - start


def _pairing_s(n: int) -> float:
    a: dict[ScenarioKey, list[ScenarioReport]] = {
        ScenarioKey("megatron", "kill (step)", 1000 + i, 1): [] for i in range(n)
    }
    b: dict[ScenarioKey, list[ScenarioReport]] = {
        ScenarioKey("megatron", "kill (step)", 10**6 + i, 1): [] for i in range(n)
    }
    start = time.perf_counter()
    _pair_partial_keys(a, b)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--keys", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nvrx-bench-compare-") as tmp:
        work = Path(tmp)
        old, new = work / "old.json", work / "new.json"
        reports = build_reports([d for d in RUN_DIRS if d.is_dir()])
        write_report(reports, json_path=old)
        new.write_text(json.dumps(_slower(json.loads(old.read_text()), 1.1)))
        assert len(reports) == 10, [r.name for r in reports]
        print(
            f"OLD {len(reports)} scenarios, {old.stat().st_size // 1024} KiB; "
            f"NEW {new.stat().st_size // 1024} KiB (every timing +10%)"
        )
        command = [_command_s(old, new, work) for _ in range(args.repeat)]
        inside = [_in_process_s(old, new) for _ in range(args.repeat)]
        print(
            f"compare command best / median: {min(command):.3f} / "
            f"{statistics.median(command):.3f} s; load + compare + render in process best: "
            f"{min(inside):.3f} s"
        )
    pairing = [_pairing_s(args.keys) for _ in range(args.repeat)]
    print(f"pairing {args.keys} keys a side, none in common, best: {min(pairing):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
