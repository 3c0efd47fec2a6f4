"""The GitHub Actions recipe (docs/ci/github-actions-gpu.yml) beyond syntax (issue #23 item 1).

* it passes GitHub's workflow schema (SchemaStore's, vendored in check-jsonschema: no network),
  and a doctored copy with one wrong key does not (the check can fail);
* in its container job no path comes from ``${{ github.workspace }}`` (the runner host's path,
  not the container's: actions/runner#2058): the steps use the shell's ``$GITHUB_WORKSPACE``;
* one job runs one pytest session whose selection holds the baseline once, with the faults:
  no matrix leg runs the baseline again;
* the container's NVRx is never installed over (install.md's plugin-only route);
* its pytest command, as the shell expands it with the default faults, collects the baseline
  and the kill and hang scenarios exactly once each.

The Slurm recipe runs for real under the local Slurm: tests/launch/test_slurm_launch.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from pytest_nvrx.session.scenarios import schedule_scenarios

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / "docs" / "ci" / "github-actions-gpu.yml"
CHECK_JSONSCHEMA = Path(sys.executable).with_name("check-jsonschema")


def _workflow() -> dict[Any, Any]:
    data = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _schema_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _uncommented(text: str) -> str:
    return "\n".join(
        line.split(" #")[0] for line in text.splitlines() if not line.lstrip().startswith("#")
    )


def test_the_workflow_passes_githubs_schema(tmp_path: Path) -> None:
    done = _schema_check(WORKFLOW)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("runs-on:", "run-on:", 1))
    refused = _schema_check(broken)
    assert refused.returncode != 0 and "run-on" in refused.stdout + refused.stderr


def test_container_job_paths_are_the_containers() -> None:
    jobs = _workflow()["jobs"]
    containers = {name: job for name, job in jobs.items() if "container" in job}
    assert containers, "the qualification runs in the container being qualified"
    code = _uncommented(WORKFLOW.read_text(encoding="utf-8"))
    assert "github.workspace" not in code, "a host path inside a container job"
    for job in containers.values():
        runs = "\n".join(step.get("run", "") for step in job["steps"])
        assert "$GITHUB_WORKSPACE/Megatron-LM" in runs and "$GITHUB_WORKSPACE/nvrx-work" in runs


def _pytest_steps(job: dict[str, Any]) -> list[str]:
    runs = [step.get("run", "") for step in job["steps"]]
    return [run for run in runs if run.lstrip().startswith("pytest ")]


def test_one_session_runs_the_baseline_once_with_the_faults() -> None:
    (job,) = _workflow()["jobs"].values()
    assert "strategy" not in job, "a matrix leg per fault runs the baseline again in every leg"
    (command,) = _pytest_steps(job)
    assert re.search(r'-m "gpu and \(baseline or \$FAULTS\)"', command), command


def test_the_containers_nvrx_is_never_replaced() -> None:
    (job,) = _workflow()["jobs"].values()
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "nvidia-resiliency-ext" not in runs and 'nvidia_resiliency_ext"' in runs
    installs = [line for line in runs.splitlines() if "pip install" in line]
    assert installs and all("--no-deps" in line or "pytest-nvrx" not in line for line in installs)


def test_the_pytest_command_collects_the_baseline_once(tmp_path: Path) -> None:
    """The Qualify step's command as the shell runs it (``$FAULTS`` from the job's default),
    collected against a stand-in checkout: 7 tests of each of 6 scenarios (the baseline, the
    kill and the hang, and the three default schedules, which hold a kill or a hang)."""
    workflow = _workflow()
    (job,) = workflow["jobs"].values()
    # YAML 1.1 reads the key `on` as true
    default = workflow[True]["workflow_dispatch"]["inputs"]["faults"]["default"]
    assert job["env"]["FAULTS"] == f"${{{{ inputs.faults || '{default}' }}}}"
    (command,) = _pytest_steps(job)
    argv = shlex.split(command.replace("$FAULTS", default))
    assert argv[0] == "pytest"
    megatron = tmp_path / "Megatron-LM"
    megatron.mkdir()
    (megatron / "pretrain_gpt.py").write_text("raise SystemExit('not a real Megatron')\n")
    env = {**os.environ, "MEGATRON_PATH": str(megatron), "NVRX_WORK_DIR": str(tmp_path / "w")}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *argv[1:], "--collect-only", "-q", "-p", "no:randomly"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [line for line in done.stdout.splitlines() if "::test_run_finished[" in line]
    assert sorted(runs) == sorted(
        f"test_recovery.py::test_run_finished[{s}]"
        for s in (
            "megatron-baseline",
            "megatron-kill-save",
            "megatron-hang-finalize",
            *(sc.id for sc in schedule_scenarios("megatron")),
        )
    ), done.stdout
    assert "42/" in done.stdout, done.stdout


@pytest.mark.parametrize("name", ["github-actions-gpu.yml", "slurm-qualify.sbatch"])
def test_no_recipe_repeats_every_passed_line(name: str) -> None:
    """-rA printed all 49 PASSED lines again; the verdict table ends the console instead."""
    assert "-rA" not in _uncommented((REPO / "docs" / "ci" / name).read_text())
