"""Benchmark ``verify`` on run directories: the whole command and the judging alone.

Run: .venv/bin/python benchmarks/bench_verify_command.py RUN_DIR... [--repeat 7]

For each run directory: its cycle count, the wall time of ``python -m pytest_nvrx verify RUN_DIR``
in a fresh interpreter (what a user waits for: start, imports, reading, judging, printing; best and
median of ``--repeat``), and of ``load_run`` + ``judge`` in this process (the part a change to the
parsers or criteria moves; best of ``--repeat``). The bound the project keeps: a 10-cycle run
verifies in under 1 s (docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pytest_nvrx.criteria import judge
from pytest_nvrx.evidence import load_run

ROOT = Path(__file__).resolve().parent.parent


def _command_s(run_dir: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", "verify", str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return time.perf_counter() - start


def _judging_s(run_dir: Path) -> float:
    start = time.perf_counter()
    judge(load_run(run_dir))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print("run dir | cycles | verify command best / median (s) | load_run + judge best (s)")
    for run_dir in args.run_dirs:
        cycles = len(list((run_dir / "logs").glob("train_cycle*.log")))
        command = [_command_s(run_dir) for _ in range(args.repeat)]
        judging = [_judging_s(run_dir) for _ in range(args.repeat)]
        print(
            f"{run_dir} | {cycles} | {min(command):.3f} / {statistics.median(command):.3f}"
            f" | {min(judging):.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
