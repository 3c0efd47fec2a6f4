"""Benchmark the CPU one reference run costs: the launcher, its log server, the watchdog and every
worker process, as ``python -m pytest_nvrx run --workload reference`` starts them.

Run: .venv/bin/python benchmarks/bench_reference_run.py [--repeat 5] [--fault kill --window save]

Each run is one CLI process in a work dir of its own; when it has exited, the CPU time of its
whole process tree is read from ``RUSAGE_CHILDREN`` of this process (every process of the tree is
reaped by its parent: the workers by ft_launcher, ft_launcher and the watchdog by the CLI). That
is what a real-run test of ./check pays, most of it imports: ``import torch`` (a CUDA build) and
torch DCP in each of a two-rank, two-cycle run's four workers. Printed: each run's CPU and wall,
the best and the median. To compare revisions, run it in a worktree of each, one after the other
on a quiet machine, or name the other's tree with ``--tree`` (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _one(tree: Path, fault: str, window: str | None, tmp: Path) -> tuple[float, float]:
    """(CPU, wall) seconds of one run's process tree."""
    work = Path(tempfile.mkdtemp(dir=tmp))
    argv = [sys.executable, "-m", "pytest_nvrx", "run", "--workload", "reference"]
    argv += ["--work-dir", str(work), "--fault", fault]
    if window is not None:
        argv += ["--window", window]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVRX_", "PYTEST_"))}
    env["PYTHONPATH"] = str(tree)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as ./check runs them: bytecode reused
    cpu, start = _cpu_s(), time.perf_counter()
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - start, _cpu_s() - cpu
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--fault", default="kill")
    parser.add_argument("--window", default="save")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose package runs")
    args = parser.parse_args()
    window = None if args.fault == "none" else args.window
    cpus = []
    with tempfile.TemporaryDirectory(
        dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    ) as t:
        for i in range(args.repeat):
            cpu, wall = _one(args.tree.resolve(), args.fault, window, Path(t))
            cpus.append(cpu)
            print(f"run {i + 1}: {cpu:.2f} CPU-s, {wall:.1f} s wall", flush=True)
    print(
        f"{args.tree}: {args.fault}{'' if window is None else '@' + window}, {args.repeat} runs: "
        f"CPU best {min(cpus):.2f} s, median {statistics.median(cpus):.2f} s"
    )


if __name__ == "__main__":
    main()
