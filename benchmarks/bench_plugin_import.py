"""Benchmark what pytest-nvrx costs a project that does not use it: one trivial test, with the
plugin and with ``-p no:nvrx``, in the same run.

Run: .venv/bin/python benchmarks/bench_plugin_import.py [--repeat 7]

A throwaway project (one ``test_one``, no conftest, no ini) is run ``--repeat`` times each way,
alternating, as ``python -m pytest -q -p no:cacheprovider`` in a fresh interpreter (pytest's
start, plugin loading, collection, the run, the summary: what an unrelated project's ``pytest
-q`` waits for). Printed: best and median of each and the difference of the bests, the same of
the CPU time the session used (user + system: steadier than the wall on a busy host), and how
long ``import pytest_nvrx.plugin`` takes alone in a fresh interpreter (best). The bound the project
keeps (docs/performance.md): the plugin costs at most 0.1 s over ``-p no:nvrx`` (best of
several); its criteria, evidence parsers, launch and report load only when a scenario of ours
is collected or an ``--nvrx-*`` option is used (tests/session/test_plugin_imports.py holds the
imports).
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

#: the bound of docs/performance.md: seconds over -p no:nvrx, best against best
BOUND_S = 0.1


def _env() -> dict[str, str]:
    # bytecode caches written as a user's are: pytest rewrites the asserts of a plugin's modules
    # on import and caches the result; without its cache every run parses and compiles them
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "NVRX_")) and k != "PYTHONDONTWRITEBYTECODE"
    }


def _cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _session_s(project: Path, *extra: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one pytest session in a fresh interpreter."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra]
    cpu, start = _cpu_s(), time.perf_counter()
    done = subprocess.run(argv, cwd=project, env=_env(), capture_output=True, check=False)
    elapsed, cpu = time.perf_counter() - start, _cpu_s() - cpu
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout.decode()}")
    return elapsed, cpu


def _import_s(cwd: Path) -> float:
    code = (
        "import time, pytest; t = time.perf_counter(); import pytest_nvrx.plugin; "
        "print(time.perf_counter() - t)"
    )
    # (run elsewhere than a checkout: python -c puts its directory first on sys.path)
    argv = [sys.executable, "-c", code]
    done = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, check=True)
    return float(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nvrx-bench-plugin-") as tmp:
        project = Path(tmp)
        (project / "test_trivial.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
        _session_s(project)  # warm the file and bytecode caches once, both ways
        _session_s(project, "-p", "no:nvrx")
        with_plugin, without = [], []
        for _ in range(args.repeat):  # alternating: a load that comes and goes hits both
            with_plugin.append(_session_s(project))
            without.append(_session_s(project, "-p", "no:nvrx"))
        imports = [_import_s(project) for _ in range(args.repeat)]
    over = {}
    for i, what in enumerate(("wall", "CPU")):
        ours, theirs = [t[i] for t in with_plugin], [t[i] for t in without]
        over[what] = min(ours) - min(theirs)
        print(
            f"pytest -q, one trivial test, {what} best / median of {args.repeat}: with the "
            f"plugin {min(ours):.3f} / {statistics.median(ours):.3f} s, -p no:nvrx "
            f"{min(theirs):.3f} / {statistics.median(theirs):.3f} s; the plugin costs "
            f"{over[what]:+.3f} s (bound {BOUND_S} s)"
        )
    print(f"import pytest_nvrx.plugin alone, best of {args.repeat}: {min(imports):.3f} s")
    return 0 if over["wall"] <= BOUND_S else 1


if __name__ == "__main__":
    sys.exit(main())
