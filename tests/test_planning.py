"""Planning: the no-TE profile is filtered by the checkout's own parser and recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import pytest_nvrx.planning
from pytest_nvrx.planning import plan_run
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

    monkeypatch.setattr(pytest_nvrx.planning, "detect_stack", no_probe)
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
