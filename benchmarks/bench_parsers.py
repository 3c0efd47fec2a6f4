"""Benchmark the cycle-log parser on a generated Megatron-format log (1 GiB by default).

Run: .venv/bin/python benchmarks/bench_parsers.py [--size-mib 1024] [--save-interval 5]
     [--workers N]

The log repeats what a real H200 cycle log (tests/data/gpu/gpu-kill-100/logs/train_cycle1.log)
shows per iteration: the rank-prefixed iteration line, and every ``--save-interval`` iterations
the memory line, the "save before previous has finished" warning, "saving checkpoint",
"scheduled an async checkpoint save", the timer lines and "successfully saved checkpoint".
It is written to a temporary directory and deleted afterwards.

Reported, in one run on the same file (wall times, and CPU times, which another job on the
machine disturbs less):
* ``grep -c`` of the iteration pattern (the floor: what a line scanner costs),
* our parser (``parse_cycle_log`` with the Megatron adapter) run in a child process, twice: with
  its default workers (one per CPU: a log this large is parsed in byte ranges) and with
  ``workers=1`` (one pass, one core: the per-core figure). Wall time, CPU time (the child's and
  its workers', from ``getrusage``) and peak RSS (the child's, the largest worker's), next to
  the peak RSS of a child that only imports the parser (the interpreter's own share),
* a check that both counted the same iteration lines, and that the two parser runs agree
  (a digest of the whole CycleLog),
* the same check on every committed Megatron cycle log (tests/data: real H200 runs),
* the floor of any pure-Python parser: one ``bytes.count(b"\\n")`` pass over the file in 1 MiB
  chunks (the cheapest whole-file pass CPython has; a parser makes several).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ITERATION_PATTERN = r"\] iteration +[0-9]+/ *[0-9]+ \|"

CKPT = "/shared/nvrx-gpt/runs/bench/checkpoints"
ITER_LINE = (
    "0:  [%s] iteration %8d/%8d | consumed samples: %12d | elapsed time per iteration (ms): 31.9"
    " | learning rate: 1.000000E-04 | global batch size:     1 | lm loss: 6.864643E+00 | loss"
    " scale: 1.0 | grad norm: 6.622 | number of skipped iterations:   0 | number of nan"
    " iterations:   0 |\n"
)
SAVE_BLOCK = (
    "0: [Rank 0] (before save_checkpoint for iteration %(it)d) memory (MB) | allocated: 293.73 |"
    " max allocated: 346.23 | reserved: 316.00 | max reserved: 386.00\n"
    "0: WARNING: Starting a checkpoint save before previous has finished. Consider increasing the"
    " checkpoint interval.\n"
    "0: [%(ts)s] saving checkpoint at iteration %(it)7d to " + CKPT + " in torch_dist format\n"
    "0:   [%(ts)s] scheduled an async checkpoint save at iteration %(it)7d to " + CKPT + "\n"
    "0: [Rank 0] (after save_checkpoint for iteration %(it)d) memory (MB) | allocated: 293.73 |"
    " max allocated: 346.23 | reserved: 316.00 | max reserved: 386.00\n"
    "0: INFO:megatron.core.timers:(min, max) time across ranks (ms):\n"
    "0:     save-checkpoint ................................: (392.33, 392.33)\n"
    "0:   [%(ts)s] successfully saved checkpoint from iteration %(prev)7d to " + CKPT + " [ t 1/1,"
    " gtp_remat 1/1, p 1/1 ]\n"
)

CHILD = """
import hashlib, resource, sys, time
from pathlib import Path
from pytest_nvrx.evidence.cycle_log import parse_cycle_log
from pytest_nvrx.evidence.megatron import MEGATRON
if sys.argv[1] != "--import-only":
    workers = int(sys.argv[2]) if sys.argv[2] != "default" else None
    t, c = time.perf_counter(), time.process_time()
    log = parse_cycle_log(Path(sys.argv[1]), 0, MEGATRON, workers=workers)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    digest = hashlib.sha256(repr(log).encode()).hexdigest()[:16]
    print(wall, cpu, kids.ru_utime + kids.ru_stime, kids.ru_maxrss, own, log.iteration_lines,
          log.line_count, len(log.events), log.saves_not_kept, digest)
"""


def generate(path: Path, size: int, save_interval: int) -> tuple[int, int]:
    """Write about ``size`` bytes; returns (iteration lines, bytes written)."""
    start = datetime(2026, 11, 29, 11, 0, 0, tzinfo=UTC)
    step = timedelta(milliseconds=31)
    written = 0
    iteration = 0
    total = 10**8
    with path.open("w", encoding="utf-8", buffering=1 << 22) as f:
        while written < size:
            parts = []
            for _ in range(save_interval):
                iteration += 1
                ts = (start + step * iteration).strftime("%Y-%m-%d %H:%M:%S.%f")
                parts.append(ITER_LINE % (ts, iteration, total, iteration))
            ts = (start + step * iteration).strftime("%Y-%m-%d %H:%M:%S.%f")
            parts.append(
                SAVE_BLOCK % {"it": iteration, "ts": ts, "prev": iteration - save_interval}
            )
            chunk = "".join(parts)
            f.write(chunk)
            written += len(chunk)
    return iteration, path.stat().st_size


def run_child(*args: str) -> tuple[str, float, int]:
    """Run the parser child; returns (stdout, wall seconds, peak RSS in KiB)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, env=env, text=True
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"parser child failed with {proc.returncode}")
    return out, wall, usage.ru_maxrss


def count_newlines(path: Path) -> tuple[int, float]:
    """One whole-file pass in Python, 1 MiB at a time: (newlines, seconds)."""
    t = time.perf_counter()
    n = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
    return n, time.perf_counter() - t


def check_committed_logs() -> list[str]:
    """Iteration lines per committed Megatron cycle log: parser against grep; mismatches."""
    from pytest_nvrx.evidence.cycle_log import parse_cycle_log
    from pytest_nvrx.evidence.megatron import MEGATRON

    mismatches = []
    logs = sorted((ROOT / "tests" / "data").rglob("train_cycle*.log"))
    checked = 0
    for log in logs:
        grep = subprocess.run(
            ["grep", "-c", "-E", ITERATION_PATTERN, str(log)], capture_output=True, text=True
        )
        expected = int(grep.stdout.strip() or 0)
        if expected == 0:
            continue  # not a Megatron log (the CPU reference workload prints another format)
        checked += 1
        counted = parse_cycle_log(log, 0, MEGATRON).iteration_lines
        if counted != expected:
            mismatches.append(f"{log.relative_to(ROOT)}: grep {expected}, parser {counted}")
    print(f"committed Megatron cycle logs: {checked} checked, {len(mismatches)} mismatches")
    return mismatches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--save-interval", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the log (temp)")
    parser.add_argument(
        "--workers", type=int, default=None, help="parser processes (default: one per CPU)"
    )
    args = parser.parse_args()
    size = args.size_mib << 20
    with tempfile.TemporaryDirectory(prefix="bench-parsers-", dir=args.dir) as tmp:
        path = Path(tmp) / "train_cycle0.log"
        t = time.perf_counter()
        iterations, nbytes = generate(path, size, args.save_interval)
        gen_s = time.perf_counter() - t
        mib = nbytes / (1 << 20)
        print(f"generated {mib:.0f} MiB, {iterations} iterations in {gen_s:.1f}s: {path}")

        # warm the page cache once so both readers see the same state
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)

        t = time.perf_counter()
        grep = subprocess.Popen(
            ["grep", "-c", "-E", ITERATION_PATTERN, str(path)], stdout=subprocess.PIPE, text=True
        )
        assert grep.stdout is not None
        grep_out = grep.stdout.read()
        _, _, grep_usage = os.wait4(grep.pid, 0)
        grep_s = time.perf_counter() - t
        grep_cpu = grep_usage.ru_utime + grep_usage.ru_stime
        grep_count = int(grep_out.strip())

        newlines, floor_s = count_newlines(path)
        workers = "default" if args.workers is None else str(args.workers)
        runs = [run_child(str(path), mode) for mode in (workers, "1")]
        _, _, base_kib = run_child("--import-only")

    print(f"date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(
        f"grep -c -E '{ITERATION_PATTERN}': {grep_s:.2f}s ({mib / grep_s:.0f} MiB/s),"
        f" {grep_count} lines; CPU {grep_cpu:.2f}s ({mib / grep_cpu:.0f} MiB/s)"
    )
    digests = set()
    counted = lines = ""
    for (out, child_s, rss_kib), mode in zip(runs, (workers, "1"), strict=True):
        fields = out.split()
        parse, cpu, kids_cpu, kids_kib, own_kib = (float(v) for v in fields[:5])
        counted, lines, kept_events, dropped, digest = fields[5:]
        digests.add(digest)
        total_cpu = cpu + kids_cpu
        label = f"parse_cycle_log workers={mode}"
        print(
            f"{label}: {parse:.2f}s ({mib / parse:.0f} MiB/s; child wall {child_s:.2f}s),"
            f" {counted} iteration lines of {lines}, {kept_events} events kept, {dropped} saves"
            f" counted not kept, digest {digest}"
        )
        print(
            f"{label} CPU: {total_cpu:.2f}s ({mib / total_cpu:.0f} MiB/s of CPU time) = this"
            f" process {cpu:.2f}s + workers {kids_cpu:.2f}s; ratio to grep {parse / grep_s:.1f}x"
        )
        print(
            f"{label} peak RSS: the parsing process {own_kib / 1024:.0f} MiB (wait4, with"
            f" the digest's repr: {rss_kib / 1024:.0f}), largest worker"
            f" {kids_kib / 1024:.0f} MiB; import-only child {base_kib / 1024:.0f} MiB"
        )
    print(
        f"floor: one bytes.count pass in Python {floor_s:.2f}s ({mib / floor_s:.0f} MiB/s),"
        f" {newlines} newlines"
    )
    failed = False
    if len(digests) != 1:
        print(f"MISMATCH: the parser runs disagree: {sorted(digests)}")
        failed = True
    if int(counted) != grep_count or grep_count != iterations:
        print(f"MISMATCH: generated {iterations}, grep {grep_count}, parser {counted}")
        failed = True
    if int(lines) != newlines:
        print(f"MISMATCH: {newlines} newlines, parser counted {lines} lines")
        failed = True
    sys.path.insert(0, str(ROOT))
    for mismatch in check_committed_logs():
        print(f"MISMATCH: {mismatch}")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
