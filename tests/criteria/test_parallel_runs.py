"""Scenarios side by side on the GPU (issue #14): a real 2x H200 matrix through the plugin.

``tests/data/parallel/gpu-share2``: the three 1-GPU megatron scenarios baseline, kill-save and
hang-finalize (``--nvrx-no-distributed-optimizer --nvrx-gpu-share 2``, under
benchmarks/bench_matrix.py) launched at once, two on GPU 0 and one on GPU 1. pytest took 139.7 s
for a slowest launcher of 129.0 s (1.08x), against 270.2 s one after the other
(docs/performance.md). Re-judged here: running side by side changed nothing the criteria see,
continuity against the baseline included.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.criteria.judgement import judge_run_dir

RUNS = Path(__file__).resolve().parents[1] / "data" / "parallel" / "gpu-share2"
NAMES = ["baseline", "kill-save", "hang-finalize"]


def _json(name: str, file: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RUNS / name / file).read_text())
    return data


def test_the_three_ran_at_once_on_their_own_gpu_slots() -> None:
    gpus = {name: _json(name, "run.json")["env"]["CUDA_VISIBLE_DEVICES"] for name in NAMES}
    assert sorted(gpus.values()) == ["0", "0", "1"]
    spans = [
        (
            datetime.fromisoformat(_json(name, "result.json")["start_time"]),
            datetime.fromisoformat(_json(name, "result.json")["end_time"]),
        )
        for name in NAMES
    ]
    # every launcher started before any ended
    assert max(start for start, _ in spans) < min(end for _, end in spans)
    ports = {_json(name, "run.json")["log_server_port"] for name in NAMES}
    assert len(ports) == 3


@pytest.mark.parametrize("name", NAMES[1:])
def test_side_by_side_faults_recover_and_match_the_baseline(name: str) -> None:
    judgement = judge_run_dir(RUNS / name, baseline=RUNS / "baseline")
    assert [v.id for v in judgement.verdicts if not v.passed and not v.not_applicable] == []
    assert judgement.first_cause is None
    continuity = next(v for v in judgement.verdicts if v.id == "training_continuity")
    assert "baseline" in continuity.reason and "equal" in continuity.reason


def test_the_baseline_passes() -> None:
    judgement = judge_run_dir(RUNS / "baseline")
    assert judgement.passed
