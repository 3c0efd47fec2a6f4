"""Planning: the no-TE profile is filtered by the checkout's own parser, the workers'
environment gets what the checkout's argument validation demands, and both are recorded."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import pytest_nvrx.launch.planning
from pytest_nvrx.launch.launcher import Launch
from pytest_nvrx.launch.planning import Plan, plan_run
from pytest_nvrx.launch.recipe import EnvOrigin, manifest
from pytest_nvrx.launch.run_dir_setup import prepare_run_dir
from pytest_nvrx.settings import ConfigError, RunConfig

ARGUMENTS = """
def _add_misc_args(parser):
    group = parser.add_argument_group(title="misc")
    group.add_argument("--transformer-impl", default="transformer_engine",
                       choices=["local", "transformer_engine"])
    group.add_argument("--no-persist-layer-norm", action="store_true")
    group.add_argument("--async-strategy", default="nvrx", choices=["nvrx", "mcore"])
    group.add_argument("--eval-interval", type=int, default=None)
    return parser
"""


def checkout(root: Path) -> Path:
    (root / "megatron" / "training").mkdir(parents=True)
    (root / "megatron" / "training" / "arguments.py").write_text(ARGUMENTS)
    (root / "pretrain_gpt.py").write_text("")
    return root


def test_explicit_profile_is_filtered_by_the_parser(tmp_path: Path) -> None:
    meg = checkout(tmp_path / "meg")
    config = RunConfig(work_dir=tmp_path, run_id="r", megatron_path=meg, no_te_profile=True)
    plan = plan_run(config, launcher_exe="ft_launcher", port=1, probe=False)
    assert plan.recipe.profile == "no-te"
    assert plan.recipe.profile_flags == ("--transformer-impl=local", "--no-persist-layer-norm")
    assert any("lacks --no-gradient-accumulation-fusion" in n for n in plan.notes)
    assert any("--async-strategy exists here" in n for n in plan.notes)
    assert plan.megatron_flags == {
        "async_strategy_choices": ["nvrx", "mcore"],
        "eval_interval_required": True,
    }
    assert plan.stack is None  # dry runs do not probe the stack


def test_unreadable_checkout_options_leave_the_profile_unfiltered(
    tmp_path: Path, megatron_stub: Path
) -> None:
    config = RunConfig(
        work_dir=tmp_path, run_id="r", megatron_path=megatron_stub, no_te_profile=True
    )
    plan = plan_run(config, launcher_exe="ft_launcher", port=1, probe=False)
    assert len(plan.recipe.profile_flags) == 4
    assert any("could not read the checkout's options" in n for n in plan.notes)


def test_default_profile_without_probe(tmp_path: Path) -> None:
    meg = checkout(tmp_path / "meg")
    config = RunConfig(work_dir=tmp_path, run_id="r", megatron_path=meg)
    plan = plan_run(config, launcher_exe="ft_launcher", port=1, probe=False)
    assert plan.recipe.profile == "default" and plan.recipe.profile_flags == ()


@pytest.mark.parametrize("port", [0, 70000])
def test_bad_port_refused_before_the_stack_probe(
    tmp_path: Path, megatron_stub: Path, monkeypatch: pytest.MonkeyPatch, port: int
) -> None:
    def no_probe(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("probed the stack for a bad port")

    monkeypatch.setattr(pytest_nvrx.launch.planning, "detect_stack", no_probe)
    config = RunConfig(work_dir=tmp_path, run_id="r", megatron_path=megatron_stub)
    with pytest.raises(ConfigError, match="--log-server-port must be a port number"):
        plan_run(config, launcher_exe="ft_launcher", port=port, probe=True)


@pytest.mark.parametrize(("fault", "noted"), [("ckpt-worker", True), ("kill", False)])
def test_reference_ckpt_worker_notes_the_process_writer(
    tmp_path: Path, fault: str, noted: bool
) -> None:
    config = RunConfig(
        work_dir=tmp_path,
        run_id="r",
        workload="reference",
        fault=fault,  # type: ignore[arg-type]
        window="finalize",
    )
    plan = plan_run(config, launcher_exe="ft_launcher", port=1, probe=False)
    has_note = any("--async-writer=process" in note for note in plan.notes)
    assert has_note is noted
    assert ("--async-writer=process" in plan.recipe.workload_argv) is noted


# ---------------------------------------------------------------------------------------------
# The worker environment contract
# ---------------------------------------------------------------------------------------------

MAX_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
# core_v0.19.0's shape (megatron/training/arguments.py:1413-1439), shortened
VALIDATION = """
import os

def validate_args(args, defaults={}):
    if args.use_torch_fsdp2:
        assert os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') != "1", 'FSDP needs > 1'
    if (args.tensor_model_parallel_size > 1 or args.context_parallel_size > 1) \\
        and get_device_arch_version() < 10:
        if args.use_torch_fsdp2:
            warn_rank_0("...")
        else:
            assert os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') == "1", "set it to 1"
    if args.fine_grained_activation_offloading:
        assert os.getenv("NVTE_CPU_OFFLOAD_V1", "0") == "1", "offloading needs NVTE_CPU_OFFLOAD_V1"
    if args.cuda_graph_impl != "none" and is_te_min_version("2.10.0"):
        assert os.getenv("NCCL_GRAPH_REGISTER", "") == "0", "graphs need NCCL_GRAPH_REGISTER=0"

def add_megatron_arguments(parser):
    group = parser.add_argument_group(title='parallel')
    group.add_argument('--tensor-model-parallel-size', type=int, default=1)
    group.add_argument('--context-parallel-size', type=int, default=1)
    group.add_argument('--use-torch-fsdp2', action='store_true')
    group.add_argument('--fine-grained-activation-offloading', action='store_true')
    group.add_argument('--cuda-graph-impl', default='none', choices=['none', 'local'])
    return parser
"""
#: the line of the == "1" assertion in VALIDATION
ASSERT_LINE = next(n for n, line in enumerate(VALIDATION.splitlines(), 1) if '== "1"' in line)
REAL_CHECKOUT = Path(__file__).resolve().parents[2] / ".megatron"


def validating_checkout(root: Path, text: str = VALIDATION) -> Path:
    (root / "megatron" / "training").mkdir(parents=True)
    (root / "megatron" / "training" / "arguments.py").write_text(text)
    (root / "pretrain_gpt.py").write_text("")
    return root


def tp_plan(
    tmp_path: Path,
    meg: Path,
    environ: dict[str, str] | None = None,
    tp: int = 2,
    extra: tuple[str, ...] = (),
) -> Plan:
    config = RunConfig(work_dir=tmp_path, run_id="r", megatron_path=meg, tp=tp, extra_args=extra)
    return plan_run(config, launcher_exe="ft_launcher", port=1, probe=False, environ=environ or {})


def test_tp2_sets_what_the_checkout_demands(tmp_path: Path) -> None:
    meg = validating_checkout(tmp_path / "meg")
    plan = tp_plan(tmp_path, meg)
    assert plan.recipe.env[MAX_CONNECTIONS] == "1"
    (var,) = plan.recipe.worker_env
    assert (var.name, var.value, var.origin) == (MAX_CONNECTIONS, "1", EnvOrigin.RECIPE)
    assert var.where == f"megatron/training/arguments.py:{ASSERT_LINE}"
    assert var.condition.startswith("(args.tensor_model_parallel_size > 1 or")
    assert "tensor_model_parallel_size=2" in var.reason
    assert "not known before launch: get_device_arch_version() < 10" in var.reason
    (note,) = [n for n in plan.notes if n.startswith("worker env:")]
    assert note.startswith(
        f"worker env: {MAX_CONNECTIONS}=1 set for the workers: "
        f"megatron/training/arguments.py:{ASSERT_LINE} demands it when "
    )
    # the dry run's command and run.json carry it
    assert plan.recipe.shell_command().startswith(f"{MAX_CONNECTIONS}=1 ")
    man = manifest(plan.recipe)
    assert man["env"][MAX_CONNECTIONS] == "1"
    assert man["worker_env"][0]["where"] == var.where


@pytest.mark.parametrize("extra", [(), ("--use-torch-fsdp2",), ("--tensor-model-parallel-size=1",)])
def test_nothing_set_where_the_demand_does_not_apply(
    tmp_path: Path, extra: tuple[str, ...]
) -> None:
    meg = validating_checkout(tmp_path / "meg")
    plan = tp_plan(tmp_path, meg, tp=1 if not extra else 2, extra=extra)
    assert MAX_CONNECTIONS not in plan.recipe.env
    assert plan.recipe.worker_env == ()
    assert not [n for n in plan.notes if n.startswith("worker env:")]


def test_context_parallelism_from_extra_args(tmp_path: Path) -> None:
    meg = validating_checkout(tmp_path / "meg")
    plan = tp_plan(tmp_path, meg, tp=1, extra=("--context-parallel-size", "2"))
    assert plan.recipe.env[MAX_CONNECTIONS] == "1"
    assert "context_parallel_size=2" in plan.recipe.worker_env[0].reason


def test_a_users_matching_value_is_kept(tmp_path: Path) -> None:
    meg = validating_checkout(tmp_path / "meg")
    plan = tp_plan(tmp_path, meg, {MAX_CONNECTIONS: "1"})
    (var,) = plan.recipe.worker_env
    assert (var.value, var.origin) == ("1", EnvOrigin.USER)
    assert manifest(plan.recipe)["worker_env"][0]["origin"] == "user environment"
    assert any(f"{MAX_CONNECTIONS}=1 kept from your environment" in n for n in plan.notes)


def test_a_users_contradicting_value_is_refused_before_launch(tmp_path: Path) -> None:
    meg = validating_checkout(tmp_path / "meg")
    with pytest.raises(ConfigError) as info:
        tp_plan(tmp_path, meg, {MAX_CONNECTIONS: "8"})
    message = str(info.value)
    assert message.startswith(f"your environment has {MAX_CONNECTIONS}=8, but this Megatron")
    assert f"megatron/training/arguments.py:{ASSERT_LINE}" in message
    assert f"unset {MAX_CONNECTIONS} (pytest-nvrx then sets 1) or set it to 1" in message
    # TP=1: the same value is none of the checkout's business
    assert tp_plan(tmp_path, meg, {MAX_CONNECTIONS: "8"}, tp=1).recipe.worker_env == ()


def test_a_refusal_the_run_is_sure_to_meet_is_an_error(tmp_path: Path) -> None:
    meg = validating_checkout(tmp_path / "meg")
    with pytest.raises(ConfigError, match="argument validation will refuse this run") as info:
        tp_plan(tmp_path, meg, {MAX_CONNECTIONS: "1"}, tp=1, extra=("--use-torch-fsdp2",))
    assert f"{MAX_CONNECTIONS}!='1' when args.use_torch_fsdp2" in str(info.value)
    with pytest.raises(ConfigError, match="NVTE_CPU_OFFLOAD_V1"):
        tp_plan(tmp_path, meg, tp=1, extra=("--fine-grained-activation-offloading",))
    ok = tp_plan(
        tmp_path,
        meg,
        {"NVTE_CPU_OFFLOAD_V1": "1"},
        tp=1,
        extra=("--fine-grained-activation-offloading",),
    )
    assert ok.recipe.worker_env == ()  # only CUDA_DEVICE_MAX_CONNECTIONS is set by us


def test_a_check_the_run_may_meet_is_a_note(tmp_path: Path) -> None:
    meg = validating_checkout(tmp_path / "meg")
    plan = tp_plan(tmp_path, meg, tp=1, extra=("--cuda-graph-impl=local",))
    (note,) = [n for n in plan.notes if n.startswith("worker env:")]
    assert note.startswith("worker env: may be refused: megatron/training/arguments.py:")
    assert "NCCL_GRAPH_REGISTER=='0'" in note and "is_te_min_version('2.10.0')" in note
    assert "NCCL_GRAPH_REGISTER unset" in note


def test_checkout_without_the_demand(tmp_path: Path) -> None:
    meg = validating_checkout(tmp_path / "meg", ARGUMENTS)
    plan = tp_plan(tmp_path, meg)
    assert MAX_CONNECTIONS not in plan.recipe.env
    assert f"worker env: this checkout's validation has no check on {MAX_CONNECTIONS}" in (
        " ".join(plan.notes)
    )


def test_unreadable_validation_falls_back_to_the_documented_rule(
    tmp_path: Path, megatron_stub: Path
) -> None:
    plan = tp_plan(tmp_path, megatron_stub)
    (var,) = plan.recipe.worker_env
    assert var.where.startswith("documented rule of core_v0.19.0")
    assert plan.recipe.env[MAX_CONNECTIONS] == "1"
    assert any("argument validation could not be read" in n for n in plan.notes)
    assert tp_plan(tmp_path, megatron_stub, tp=1).recipe.worker_env == ()


def test_reference_workload_has_no_contract(tmp_path: Path) -> None:
    config = RunConfig(work_dir=tmp_path, run_id="r", workload="reference", tp=2)
    plan = plan_run(config, launcher_exe="ft_launcher", port=1, probe=False, environ={})
    assert plan.recipe.worker_env == () and MAX_CONNECTIONS not in plan.recipe.env


@pytest.mark.skipif(
    not (REAL_CHECKOUT / "megatron" / "training" / "arguments.py").is_file(),
    reason="no Megatron checkout in .megatron/ (scripts/prepare_device.sh fetches one)",
)
def test_real_checkout_tp2(tmp_path: Path) -> None:
    """Issue #11: core_v0.19.0 with TP=2 needs CUDA_DEVICE_MAX_CONNECTIONS=1, nothing else."""
    plan = tp_plan(tmp_path, REAL_CHECKOUT)
    (var,) = plan.recipe.worker_env
    assert (var.name, var.value) == (MAX_CONNECTIONS, "1")
    rel, _, line = var.where.partition(":")
    source = (REAL_CHECKOUT / rel).read_text().splitlines()[int(line) - 1]
    assert source.strip().startswith(f"assert os.environ.get('{MAX_CONNECTIONS}') == \"1\"")
    assert not any("may be refused" in n for n in plan.notes)
    assert tp_plan(tmp_path, REAL_CHECKOUT, tp=1).recipe.worker_env == ()


def test_the_launched_process_gets_the_worker_env_and_run_json_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ft_launcher (here a stand-in that reports its environment) starts with, and run.json."""
    monkeypatch.delenv(MAX_CONNECTIONS, raising=False)
    meg = validating_checkout(tmp_path / "meg")
    config = RunConfig(work_dir=tmp_path / "w", run_id="tp2", megatron_path=meg, tp=2)
    layout = prepare_run_dir(config)
    plan = plan_run(config, launcher_exe="ft_launcher", port=1, probe=False)
    seen = tmp_path / "seen.txt"
    report = "import os, sys; open(sys.argv[1], 'w').write(os.environ.get(sys.argv[2], '-'))"
    recipe = dataclasses.replace(
        plan.recipe,
        launcher_argv=(sys.executable, "-c", report, str(seen), MAX_CONNECTIONS),
        workload_argv=(),
    )
    with Launch(recipe) as launch:
        result = launch.wait(30, poll_s=0.05)
    assert result.exit_code == 0
    assert seen.read_text() == "1"
    run_json = json.loads(layout.manifest.read_text())
    assert run_json["env"][MAX_CONNECTIONS] == "1"
    (record,) = run_json["worker_env"]
    assert record["name"] == MAX_CONNECTIONS and record["origin"] == "pytest-nvrx"
    assert record["where"] == f"megatron/training/arguments.py:{ASSERT_LINE}"
