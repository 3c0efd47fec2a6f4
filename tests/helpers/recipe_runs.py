"""The gpu-recipe suite runs whose result.json the device's packer dropped, made whole again.

``megatron-baseline-40``, ``-kill-40``, ``-hang-40`` and ``-kill-40-distopt`` were launched by
the plugin, which wrote result.json on the device; ``scripts/device_gpu_suite.sh`` then kept only
run.json and fault_injected.json at the top of a run directory (tests/data/gpu-recipe/README.md).
A run our harness launched without result.json cannot be judged (how its launch ended is
unknown, #36 item 5), and so the committed directories are "cannot judge". Tests that use them as
whole runs judge a copy given the result.json of what their harness printed of that end in the
device session's own log (``nvrx <scenario>: launcher exit N after S``): the exit code and the
wall time; not timed out, not interrupted (the session says so). Its start and end times were
not printed: the harness takes its start as it launches, just after it wrote run.json's
``start_time`` (a few milliseconds later in every committed run that kept both), and its end is
that start plus the wall time; so they are given those (null ones are no record of the harness,
which always writes both: #36 adversarial J).
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime, timedelta
from pathlib import Path

from pytest_nvrx.layout import RESULT_NAME

RECIPE = Path(__file__).parents[1] / "data" / "gpu-recipe"
#: run dir -> (the device session's pytest log, the scenario's name in it)
DROPPED = {
    "megatron-baseline-40": ("pytest-suite.log", "megatron-baseline"),
    "megatron-kill-40": ("pytest-suite.log", "megatron-kill"),
    "megatron-hang-40": ("pytest-suite.log", "megatron-hang"),
    "megatron-kill-40-distopt": ("pytest-distopt.log", "megatron-kill"),
}


def recorded_end(run: Path) -> tuple[int, float]:
    """The exit code and wall time the device session printed for ``run``'s launch."""
    log, scenario = DROPPED[run.name]
    text = (RECIPE / log).read_text(encoding="utf-8")
    found = re.findall(
        rf"^nvrx {re.escape(scenario)}: launcher exit (-?\d+) after ([\d.]+)s$", text, re.M
    )
    assert len(found) == 1, f"{log}: {scenario}'s launcher exit, once: {found}"
    code, wall = found[0]
    return int(code), float(wall)


def whole(run: Path, dest: Path) -> Path:
    """A copy of ``run`` at ``dest`` (named as ``run``) with the result.json its harness wrote,
    as the device session recorded it (a committed run that kept its result.json is copied as
    it is)."""
    target = dest / run.name
    shutil.copytree(run, target, symlinks=True)
    if run.name in DROPPED:
        code, wall = recorded_end(run)
        start = datetime.fromisoformat(json.loads((run / "run.json").read_text())["start_time"])
        # every key the harness writes; its times as the module doc derives them
        record = {
            "exit_code": code,
            "wall_s": wall,
            "timed_out": False,
            "interrupted": None,
            "start_time": start.isoformat(timespec="milliseconds"),
            "end_time": (start + timedelta(seconds=wall)).isoformat(timespec="milliseconds"),
        }
        (target / RESULT_NAME).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return target
