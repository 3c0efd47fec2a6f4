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

The GitHub and GitLab recipes pin the plugin (one variable, a tag or a full commit), keep only
their own run's files as artifacts and prune the checkpoint shards the way the plugin does; the
GitLab one passes GitLab's CI schema (vendored in check-jsonschema) with JUnit and the HTML
report as artifacts. The Slurm recipe runs for real under the local Slurm:
tests/launch/test_slurm_launch.py.
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
GITLAB = REPO / "docs" / "ci" / "gitlab-ci-gpu.yml"
SBATCH = REPO / "docs" / "ci" / "slurm-qualify.sbatch"
CHECK_JSONSCHEMA = Path(sys.executable).with_name("check-jsonschema")


def _workflow() -> dict[Any, Any]:
    data = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _gitlab() -> dict[Any, Any]:
    data = yaml.safe_load(GITLAB.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _schema_check(
    path: Path, schema: str = "vendor.github-workflows"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", schema, str(path)],
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
        assert "$GITHUB_WORKSPACE/Megatron-LM" in runs
        # a run's own directory under the runner's temp dir, not the workspace a self-hosted
        # runner keeps from night to night
        assert 'run="$RUNNER_TEMP/nvrx-$GITHUB_RUN_ID-$GITHUB_RUN_ATTEMPT"' in runs
        assert 'echo "NVRX_WORK_DIR=$run/work"' in runs


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


@pytest.mark.parametrize(
    "name", ["github-actions-gpu.yml", "gitlab-ci-gpu.yml", "slurm-qualify.sbatch"]
)
def test_no_recipe_repeats_every_passed_line(name: str) -> None:
    """-rA printed all 49 PASSED lines again; the verdict table ends the console instead."""
    assert "-rA" not in _uncommented((REPO / "docs" / "ci" / name).read_text())


#: a tag (v1.2.3) or a full commit: a branch such as main moves under a nightly qualification
PINNED = re.compile(r"^(v\d+(\.\d+)*|[0-9a-f]{40})$")


def test_the_recipes_pin_the_plugin_in_one_variable() -> None:
    (job,) = _workflow()["jobs"].values()
    gitlab = _gitlab()
    for ref, installs in (
        (job["env"]["PYTEST_NVRX_REF"], [s.get("run", "") for s in job["steps"]]),
        (gitlab["variables"]["PYTEST_NVRX_REF"], gitlab["nvrx-qualify"]["script"]),
    ):
        assert PINNED.match(str(ref)), ref
        lines = [line for run in installs for line in run.splitlines() if "pytest-nvrx @" in line]
        assert lines and all("pytest-nvrx@$PYTEST_NVRX_REF" in line for line in lines), lines


def test_the_github_artifact_holds_only_this_runs_files() -> None:
    """The artifact globs lie under the run's own directory: globs under the workspace took
    every earlier night's runs on a self-hosted runner."""
    (job,) = _workflow()["jobs"].values()
    (upload,) = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload")]
    paths = upload["with"]["path"].splitlines()
    assert paths and all(p.startswith("${{ env.NVRX_RUN }}/") for p in paths), paths
    assert {"${{ env.NVRX_RUN }}/report.html", "${{ env.NVRX_RUN }}/report.json"} <= set(paths)
    (command,) = _pytest_steps(job)
    assert '--nvrx-report="$NVRX_RUN/report.html"' in command, command


def test_the_recipes_share_the_gpu_locks_of_their_host() -> None:
    """Each recipe names one GPU lock directory (NVRX_GPU_LOCK_DIR, read by the plugin) that
    the host mounts into the container: the locks in each container's own /tmp let two runners
    of one host run on one GPU at once."""
    (job,) = _workflow()["jobs"].values()
    shared = job["env"]["NVRX_GPU_LOCK_DIR"]
    assert shared.startswith("/") and not shared.startswith("/tmp"), shared
    assert f"{shared}:{shared}" in job["container"]["volumes"]
    gitlab = _gitlab()
    assert gitlab["variables"]["NVRX_GPU_LOCK_DIR"] == shared
    # the runner's config.toml mounts it (a job cannot), as the recipe's header tells
    assert f'volumes = ["{shared}:{shared}"]' in GITLAB.read_text(encoding="utf-8")


def test_the_gitlab_recipe_passes_gitlabs_schema(tmp_path: Path) -> None:
    done = _schema_check(GITLAB, "vendor.gitlab-ci")
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(GITLAB.read_text().replace("  stage: qualify", "  stag: qualify", 1))
    refused = _schema_check(broken, "vendor.gitlab-ci")
    assert refused.returncode != 0 and "stag" in refused.stdout + refused.stderr


def test_the_gitlab_recipe_keeps_junit_and_the_report() -> None:
    recipe = _gitlab()
    job = recipe["nvrx-qualify"]
    assert job["stage"] in recipe["stages"]
    run_dir = "nvrx-run"
    assert job["variables"]["NVRX_RUN"] == f"$CI_PROJECT_DIR/{run_dir}"
    (command,) = [line for line in job["script"] if line.lstrip().startswith("pytest ")]
    argv = shlex.split(command.replace("$FAULTS", recipe["variables"]["FAULTS"]))
    assert argv[:3] == ["pytest", "--pyargs", "pytest_nvrx.suite"], argv
    assert "gpu and (baseline or kill or hang)" in argv, argv
    assert (
        "--junitxml=$NVRX_RUN/junit.xml" in argv and "--nvrx-report=$NVRX_RUN/report.html" in argv
    )
    artifacts = job["artifacts"]
    assert artifacts["when"] == "always"  # a failed qualification keeps its evidence most of all
    assert artifacts["reports"]["junit"] == f"{run_dir}/junit.xml"
    paths = artifacts["paths"]
    for name in ("junit.xml", "report.html", "report.json"):
        assert f"{run_dir}/{name}" in paths, paths
    assert all(p.startswith(f"{run_dir}/") for p in paths), paths
    # a directory left by an earlier job is refused, not uploaded as this job's runs
    assert any('[ -e "$NVRX_RUN" ]' in line and "exit 1" in line for line in job["script"])
    # the nvidia_resiliency_ext the container ships is never installed over
    script = "\n".join(job["script"])
    assert "nvidia-resiliency-ext" not in script and "--no-deps" in script


def _prune_scripts() -> dict[str, tuple[str, dict[str, str]]]:
    """Each recipe's shard pruning as the shell runs it, and the variables it needs (``work``
    stands for the work dir, ``run`` for the run's directory above it)."""
    (job,) = _workflow()["jobs"].values()
    (github,) = [s["run"] for s in job["steps"] if s.get("name") == "Prune the checkpoint shards"]
    (gitlab,) = _gitlab()["nvrx-qualify"]["after_script"]
    text = SBATCH.read_text(encoding="utf-8")
    sbatch = text[text.index("if [[ -d $out/work/runs ]]") : text.index('exit "$status"')]
    return {
        "github": (github, {"NVRX_WORK_DIR": "{run}/work"}),
        "gitlab": (gitlab, {"NVRX_RUN": "{run}"}),
        "sbatch": (sbatch, {"out": "{run}"}),
    }


def _with_shards(run_dir: Path) -> None:
    """A committed run's copy with the payload and the metadata a real save leaves."""
    checkpoints = run_dir / "checkpoints"
    (checkpoints / "ft_state.json").write_text("{}")
    dcp = checkpoints / "iter_0000003"
    dcp.mkdir(parents=True)
    for name in (".metadata", "metadata.json", "common.pt", "__0_0.distcp", "__1_0.distcp"):
        (dcp / name).write_bytes(b"x" * 64)
    legacy = checkpoints / "iter_0000006" / "mp_rank_00"
    legacy.mkdir(parents=True)
    (legacy / "model_optim_rng.pt").write_bytes(b"x" * 64)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("recipe", ["github", "gitlab", "sbatch"])
def test_the_recipes_prune_what_the_plugin_prunes(recipe: str, tmp_path: Path) -> None:
    """The recipe's find over a work dir leaves exactly what retention.prune_checkpoint_payload
    leaves of the same runs: every shard gone, logs, tracker and checkpoint metadata kept."""
    import shutil

    from pytest_nvrx.launch.retention import prune_checkpoint_payload
    from pytest_nvrx.layout import RunLayout

    script, variables = _prune_scripts()[recipe]
    ours, policy = tmp_path / "ours", tmp_path / "policy"
    for root in (ours, policy):
        run_dir = root / "work" / "runs" / "reference-kill"
        shutil.copytree(REPO / "tests" / "data" / "cpu" / "reference-kill", run_dir)
        _with_shards(run_dir)
    env = {**os.environ, **{k: v.format(run=ours) for k, v in variables.items()}}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pruned = prune_checkpoint_payload(
        RunLayout.for_run(policy / "work" / "runs" / "reference-kill"), policy / "work"
    )
    assert len(pruned.removed) == 3 and not pruned.errors, pruned
    assert _files(ours) == _files(policy)
    assert not any(p.suffix in (".distcp", ".pt") and p.name != "common.pt"
                   for p in ours.rglob("*")), _files(ours)  # fmt: skip
    # nothing to prune (the session stopped before a run): the step passes, it does not fail
    empty = {k: v.format(run=tmp_path / "none") for k, v in variables.items()}
    nothing = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env={**os.environ, **empty},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert nothing.returncode == 0, nothing.stderr
