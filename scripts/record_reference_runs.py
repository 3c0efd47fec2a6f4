#!/usr/bin/env python
"""Record real ft_launcher runs of the CPU reference workload for the evidence parsers.

Three cases, 2 ranks over gloo, 40 iterations, a save every 10:

* ``baseline`` -- no fault: pytest_nvrx/worker/injector.py with ``--fault=none`` only runs the
workload;
* ``kill`` -- the injector SIGKILLs rank 1 once the tracker advances;
* ``hang`` -- the injector SIGSTOPs rank 1 once the tracker advances; the ``step`` section
  timeout (10 s, checked every 1 s) must find it.

Each run goes through the pipeline users run (``python -m pytest_nvrx run --workload
reference``): a :class:`~pytest_nvrx.settings.RunConfig`, ``run_dir.prepare_run_dir``,
``planning.plan_run`` with the ft_launcher beside this interpreter, and ``launch.Launch``, which
writes run.json and result.json and stops the whole process tree; the script then checks that
nothing of the run is left. So the baseline, too, runs under the injector (with
``--fault=none``), exactly as a user's baseline does.

Each run lives in ``<work>/runs/reference-<case>/`` (the walkthrough's layout). The trimmed copy
written to ``--out`` keeps logs/, cycle_infos/, the marker, run.json, result.json and the
tracker, drops checkpoint shards and TMPDIR, turns symlinks into files naming their target and
rewrites absolute paths (see docs/reference-workload.md). ``--out`` defaults to tests/data/cpu,
the committed recorded runs: point it elsewhere to try the script without replacing them.

    .venv/bin/python scripts/record_reference_runs.py [--case kill] [--out tests/data/cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_nvrx.launch.launcher import Launch, RunTimeout  # noqa: E402
from pytest_nvrx.launch.planning import plan_run  # noqa: E402
from pytest_nvrx.launch.process_tree import tagged  # noqa: E402
from pytest_nvrx.launch.run import find_launcher  # noqa: E402
from pytest_nvrx.launch.run_dir_setup import prepare_run_dir  # noqa: E402
from pytest_nvrx.layout import (  # noqa: E402
    RESULT_NAME,
    FaultKind,
    RunLayout,
)
from pytest_nvrx.settings import ConfigError, RunConfig, SectionTimeouts  # noqa: E402

# What absolute paths in the recorded files are rewritten to (like /work/shared/gpu-evidence).
RECORDED_RUNS_ROOT = "/shared/nvrx-ref/runs"
RECORDED_REPO = "/workspace/pytest-nvrx"

NPROC_PER_NODE = 2
TRAIN_ITERS = 40
SAVE_INTERVAL = 10
SECTION_TIMEOUTS = "setup:120,step:10,checkpointing:60"
OUT_OF_SECTION_TIMEOUT = 60
WORKLOAD_CHECK_INTERVAL = 1
MAX_RESTARTS = 3
RUN_TIMEOUT_S = 420.0


@dataclass(frozen=True)
class Case:
    name: str
    fault: FaultKind
    fault_rank: int = 1


CASES = {c.name: c for c in (Case("baseline", "none"), Case("kill", "kill"), Case("hang", "hang"))}


def config_for(case: Case, work: Path) -> RunConfig:
    return RunConfig(
        work_dir=work,
        run_id=f"reference-{case.name}",
        workload="reference",
        nnodes=1,
        gpus_per_node=NPROC_PER_NODE,
        train_iters=TRAIN_ITERS,
        save_interval=SAVE_INTERVAL,
        fault=case.fault,
        fault_rank=case.fault_rank,
        section_timeouts=SectionTimeouts.parse(SECTION_TIMEOUTS),
        out_of_section_timeout=OUT_OF_SECTION_TIMEOUT,
        workload_check_interval=WORKLOAD_CHECK_INTERVAL,
        max_restarts=MAX_RESTARTS,
    )


def run_case(case: Case, work: Path, launcher_exe: str) -> dict[str, Any]:
    config = config_for(case, work)
    if config.run_dir.exists():
        shutil.rmtree(config.run_dir)
    layout = prepare_run_dir(config)
    plan = plan_run(config, launcher_exe=launcher_exe)
    launch = Launch(plan.recipe, stack=plan.manifest_stack())
    with launch:
        try:
            launch.wait(RUN_TIMEOUT_S)
        except RunTimeout as exc:
            print(exc, file=sys.stderr, flush=True)
    # Launch wrote result.json on every exit path and stopped the launcher's whole tree.
    result = json.loads((layout.run_dir / RESULT_NAME).read_text())
    return {
        "case": case.name,
        "run_dir": str(layout.run_dir),
        "left_behind": sorted(tagged(launch.tag)),
        **result,
    }


def trim_copy(run_dir: Path, dest: Path, case: str) -> None:
    """Copy what the parsers need, without shards or TMPDIR, with stable absolute paths."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    layout = RunLayout.for_run(run_dir)
    recorded_run = f"{RECORDED_RUNS_ROOT}/reference-{case}"
    keep: list[Path] = [layout.logs, layout.cycle_infos, layout.marker, layout.manifest]
    keep += [run_dir / "result.json", layout.tracker]
    for src in keep:
        if not src.exists() and not src.is_symlink():
            continue
        files = sorted(src.rglob("*")) if src.is_dir() else [src]
        for f in files:
            rel = f.relative_to(run_dir)
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if f.is_symlink():
                target.write_text(os.readlink(f))  # as in gpu-evidence: a file naming the target
            elif f.is_file():
                text = f.read_text(errors="replace")
                text = text.replace(str(run_dir), recorded_run).replace(str(REPO), RECORDED_REPO)
                target.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="repeatable")
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "tests" / "data" / "cpu",
        help="where the trimmed copies go (default: tests/data/cpu, replacing the recorded runs)",
    )
    parser.add_argument("--work", type=Path, help="keep the full run dirs here (default: temp)")
    ns = parser.parse_args()
    try:
        launcher_exe = find_launcher()
    except ConfigError as exc:
        parser.error(str(exc))
    names = ns.case or ["baseline", "kill", "hang"]
    work = ns.work or Path(tempfile.mkdtemp(prefix="nvrx-ref-"))
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    summary = []
    for name in names:
        print(f"== {name}: running (work dir {work})", flush=True)
        try:
            res = run_case(CASES[name], work.resolve(), launcher_exe)
        except ConfigError as exc:
            parser.error(str(exc))
        summary.append(res)
        print(json.dumps(res), flush=True)
        trim_copy(Path(res["run_dir"]), ns.out / f"reference-{name}", name)
    if ns.work is None:
        shutil.rmtree(work, ignore_errors=True)
    bad = [r for r in summary if r["exit_code"] != 0 or r["timed_out"] or r["left_behind"]]
    for r in summary:
        print(f"{r['case']:>9}: exit {r['exit_code']} wall {r['wall_s']:.1f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
