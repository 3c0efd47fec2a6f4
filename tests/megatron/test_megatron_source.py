"""What a Megatron checkout says about itself, read from source (pytest_nvrx.megatron.source):
its options, and the checks its argument validation makes on environment variables.

The flag fixtures are synthetic parsers written to mimic two real shapes of Megatron-LM's
parser: plain ``add_argument`` calls (core <= 0.16: no --async-strategy, --eval-interval
defaults to 1000) and core >= 0.17's dataclass-driven ``ArgumentGroupFactory`` (where
--async-strategy and --eval-interval, default None, come from config dataclasses). The
environment checks are read from synthetic validation code and, where it is present, from the
real checkout in ``.megatron/`` (core_v0.19.0, fetched by scripts/prepare_device.sh).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pytest_nvrx.launch.recipe import no_te_profile_args
from pytest_nvrx.megatron import source as ms
from pytest_nvrx.megatron.source import (
    MegatronFlags,
    MegatronSourceError,
    probe_megatron_flags,
)


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


# ---------------------------------------------------------------------------------------------
# Flag probing
# ---------------------------------------------------------------------------------------------

# core <= 0.16 shape: every option is a literal add_argument call.
OLD_ARGUMENTS = """
import argparse

def parse_args():
    parser = argparse.ArgumentParser()
    parser = _add_training_args(parser)
    return parser

def _add_training_args(parser):
    group = parser.add_argument_group(title='training')
    group.add_argument('--eval-interval', type=int, default=1000,
                       help='Interval between running evaluation.')
    group.add_argument('--transformer-impl', default='transformer_engine',
                       choices=['local', 'transformer_engine'],
                       help='Which Transformer implementation to use.')
    group.add_argument('--no-gradient-accumulation-'
                       'fusion',
                       action='store_false', dest='gradient_accumulation_fusion')
    group.add_argument('--no-persist-layer-norm', action='store_true')
    group.add_argument('--no-masked-softmax-fusion', action='store_false',
                       dest='masked_softmax_fusion')
    group.add_argument('--async-save', action='store_true', default=None)
    group.add_argument('--use-persistent-ckpt-worker', action='store_true')
    group.add_argument('--enable-ft-package', action='store_true')
    group.add_argument('--ckpt-format', default='torch_dist',
                       choices=['torch', 'torch_dist', 'zarr'])
    group.add_argument('--use-distributed-optimizer', action='store_true')
    group.add_argument('--save-interval', '--persistent-save-interval', type=int,
                       default=None)
    group.add_argument('--seed', type=int, default=SEED_DEFAULT)
    return parser
"""

# core >= 0.17 shape: most options generated from dataclass fields (see
# megatron/training/argument_utils.py), the config package re-exports its classes and
# TransformerConfig inherits ModelParallelConfig through a relative import.
NEW_TREE = {
    "megatron/training/arguments.py": """
        import argparse
        from megatron.core.transformer import TransformerConfig
        from megatron.training.argument_utils import ArgumentGroupFactory

        def add_megatron_arguments(parser):
            parser = _add_network_size_args(parser)
            parser = _add_training_args(parser)
            parser = _add_checkpointing_args(parser)
            parser = _add_validation_args(parser)
            return parser

        def _add_network_size_args(parser):
            exclude = [
                "init_method",
                # incompatible defaults in dataclass
                "gradient_accumulation_fusion",
                "masked_softmax_fusion",
                "persist_layer_norm",
            ]
            transformer_factory = ArgumentGroupFactory(TransformerConfig, exclude=exclude)
            transformer_factory.build_group(parser, "transformer configuration")
            return parser

        def _add_training_args(parser):
            group = parser.add_argument_group(title='training')
            group.add_argument('--no-masked-softmax-fusion', action='store_false',
                               dest='masked_softmax_fusion')
            group.add_argument('--no-persist-layer-norm', action='store_true')
            group.add_argument('--no-gradient-accumulation-fusion', action='store_false',
                               dest='gradient_accumulation_fusion')
            group.add_argument('--enable-ft-package', action='store_true')
            group.add_argument('--ft-num-warmup-iters', type=int, default=5)
            group.add_argument('--use-distributed-optimizer', action='store_true')
            group.add_argument('--wandb-logging', action=argparse.BooleanOptionalAction,
                               default=True)
            return parser

        def _add_checkpointing_args(parser):
            from megatron.training.config import CheckpointConfig

            ckpt_factory = ArgumentGroupFactory(CheckpointConfig, exclude=["save_optim"])
            group = ckpt_factory.build_group(parser, "checkpointing")
            group.add_argument('--no-save-optim', action='store_true', default=None)
            return parser

        def _add_validation_args(parser):
            from megatron.training.config import ValidationConfig as VC

            ArgumentGroupFactory(VC).build_group(parser, "validation")
            return parser
    """,
    "megatron/core/transformer/__init__.py": """
        from .transformer_config import TransformerConfig
    """,
    "megatron/core/model_parallel_config.py": """
        from dataclasses import dataclass

        @dataclass
        class ModelParallelConfig:
            tensor_model_parallel_size: int = 1
            gradient_accumulation_fusion: bool = False
            sequence_parallel: bool = False
    """,
    "megatron/core/transformer/transformer_config.py": """
        from dataclasses import dataclass, field
        from typing import ClassVar, Literal, Optional

        from ..model_parallel_config import ModelParallelConfig

        @dataclass
        class TransformerConfig(ModelParallelConfig):
            VERSION: ClassVar[int] = 1
            num_layers: int = 0
            init_method: Optional[object] = None
            masked_softmax_fusion: bool = False
            persist_layer_norm: bool = False
            apply_residual_connection_post_layernorm: bool = False
            add_bias_linear: bool = True
            transformer_impl: Literal['local', 'transformer_engine', 'inference_optimized'] = (
                "transformer_engine"
            )
            cuda_graph_scope: list[str] = field(default_factory=list)
            derived_value: int = field(init=False, default=0)
            sequence_parallel: bool = True
    """,
    "megatron/training/config/__init__.py": """
        from megatron.training.config.training_config import (
            CheckpointConfig,
            ValidationConfig,
        )
    """,
    "megatron/training/config/training_config.py": """
        from dataclasses import dataclass, field
        from typing import Literal

        @dataclass(kw_only=True)
        class ValidationConfig:
            eval_iters: int | None = 100
            eval_interval: int | None = None
            \"\"\"Interval between running evaluation on validation set.\"\"\"

        @dataclass(kw_only=True)
        class CheckpointConfig:
            save: str | None = None
            save_optim: bool = True
            ckpt_format: Literal["torch", "torch_dist", "torch_dcp", "fsdp_dtensor"] = "torch_dist"
            fully_parallel_save: bool = field(default=True, metadata={"argparse_meta": {
                "arg_names": ["--no-ckpt-fully-parallel-save"],
                "dest": "ckpt_fully_parallel_save"}})
            async_save: bool = False
            async_strategy: Literal["nvrx", "mcore"] = "nvrx"
            use_persistent_ckpt_worker: bool = False
            exit_on_missing_checkpoint: Optional[bool] = None
            profile: bool = PROFILE_DEFAULT
    """,
    "pretrain_gpt.py": """
        def add_extra_args(parser):
            parser.add_argument('--gpt-only-option', type=int, default=7)
            return parser
    """,
}


@pytest.fixture
def old_checkout(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "old", {"megatron/training/arguments.py": OLD_ARGUMENTS})


@pytest.fixture
def new_checkout(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "new", NEW_TREE)


def test_old_revision_plain_add_argument(old_checkout: Path) -> None:
    flags = probe_megatron_flags(old_checkout)
    assert flags.sources == ("megatron/training/arguments.py",)
    assert flags.warnings == ()
    assert not flags.has("--async-strategy")
    assert flags.async_strategy_choices is None
    interval = flags.get("--eval-interval")
    assert interval is not None and interval.default == 1000 and interval.default_known
    assert interval.where == "megatron/training/arguments.py:10"
    assert not flags.eval_interval_required
    assert flags.choices("--transformer-impl") == ("local", "transformer_engine")
    assert flags.accepts("--transformer-impl", "local")
    assert not flags.accepts("--transformer-impl", "inference_optimized")
    assert not flags.accepts("--async-strategy", "nvrx")
    assert flags.choices("--ckpt-format") == ("torch", "torch_dist", "zarr")
    assert not flags.has("--ft-num-warmup-iters")


def test_option_split_over_lines_and_aliases(old_checkout: Path) -> None:
    flags = probe_megatron_flags(old_checkout)
    fusion = flags.get("--no-gradient-accumulation-fusion")
    assert fusion is not None
    assert (fusion.action, fusion.dest, fusion.default) == (
        "store_false",
        "gradient_accumulation_fusion",
        True,  # argparse's implicit default for store_false
    )
    assert flags.get("--save-interval") is flags.get("--persistent-save-interval")
    assert flags.get("--async-save") is not None
    assert flags.get("--async-save").default is None  # type: ignore[union-attr]
    seed = flags.get("--seed")
    assert seed is not None and not seed.default_known


def test_new_revision_dataclass_factories(new_checkout: Path) -> None:
    flags = probe_megatron_flags(new_checkout)
    assert flags.warnings == ()
    assert flags.sources == ("megatron/training/arguments.py", "pretrain_gpt.py")
    assert flags.get("--gpt-only-option").where == "pretrain_gpt.py:2"  # type: ignore[union-attr]
    assert flags.async_strategy_choices == ("nvrx", "mcore")
    strategy = flags.get("--async-strategy")
    assert strategy is not None and strategy.default == "nvrx"
    assert strategy.where == "megatron/training/config/training_config.py:19"
    assert strategy.via == (
        "ArgumentGroupFactory(CheckpointConfig) at megatron/training/arguments.py:41"
    )
    interval = flags.get("--eval-interval")
    assert interval is not None and interval.default is None and interval.default_known
    assert flags.eval_interval_required
    # TransformerConfig through a re-export and a relative import of its base class
    assert flags.choices("--transformer-impl") == (
        "local",
        "transformer_engine",
        "inference_optimized",
    )
    assert flags.has("--tensor-model-parallel-size")  # inherited field
    assert flags.get("--ckpt-format") is not None
    assert flags.choices("--ckpt-format") == ("torch", "torch_dist", "torch_dcp", "fsdp_dtensor")
    for option in ("--async-save", "--use-persistent-ckpt-worker", "--enable-ft-package"):
        spec = flags.get(option)
        assert spec is not None and spec.action == "store_true" and spec.default is False


def test_new_revision_factory_rules(new_checkout: Path) -> None:
    flags = probe_megatron_flags(new_checkout)
    # bool default True -> store_false under --no-X and --disable-X
    bias = flags.get("--no-add-bias-linear")
    assert bias is not None and bias is flags.get("--disable-add-bias-linear")
    assert (bias.action, bias.dest, bias.default) == ("store_false", "add_bias_linear", True)
    assert not flags.has("--add-bias-linear")
    # a redefinition in the subclass wins (default True there)
    assert flags.has("--no-sequence-parallel") and not flags.has("--sequence-parallel")
    # Optional[bool] = None is store_false too (Megatron: default == False decides)
    assert flags.has("--no-exit-on-missing-checkpoint")
    # argparse_meta arg_names/dest override the generated names
    fps = flags.get("--no-ckpt-fully-parallel-save")
    assert fps is not None and fps.dest == "ckpt_fully_parallel_save"
    assert not flags.has("--no-fully-parallel-save")
    # excluded (list in a variable and inline), ClassVar and init=False are no options
    for absent in ("--init-method", "--masked-softmax-fusion", "--gradient-accumulation-fusion"):
        assert not flags.has(absent), absent
    assert not flags.has("--disable-save-optim")  # excluded from CheckpointConfig
    assert not flags.has("--VERSION") and not flags.has("--derived-value")
    # the literal add_argument for an excluded field is still there
    assert flags.has("--no-save-optim") and flags.has("--no-persist-layer-norm")
    # default_factory=list
    scope = flags.get("--cuda-graph-scope")
    assert scope is not None and scope.default == [] and scope.default_known
    # a bool whose default is no literal: Megatron's rule (store_true only for == False)
    profile = flags.get("--no-profile")
    assert profile is not None and not profile.default_known and not flags.has("--profile")
    # BooleanOptionalAction adds --no-X
    assert flags.get("--no-wandb-logging") is flags.get("--wandb-logging") is not None


def test_report_lists_probed_options(new_checkout: Path, old_checkout: Path) -> None:
    new = probe_megatron_flags(new_checkout).report()
    old = probe_megatron_flags(old_checkout).report()
    assert list(new) == list(ms.PROBED_OPTIONS)
    assert new["--async-strategy"] is not None and old["--async-strategy"] is None
    assert new["--eval-interval"] == {
        "options": ["--eval-interval"],
        "dest": "eval_interval",
        "action": None,
        "choices": None,
        "default": None,
        "where": "megatron/training/config/training_config.py:7",
        "via": "ArgumentGroupFactory(VC) at megatron/training/arguments.py:49",
    }
    json.dumps(new)  # manifest-ready


def test_set_defaults_overrides(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "megatron/arguments.py": """
                def parse(parser):
                    parser.add_argument('--eval-interval', type=int, default=None)
                    parser.set_defaults(eval_interval=100)
            """
        },
    )
    flags = probe_megatron_flags(root)
    assert flags.sources == ("megatron/arguments.py",)  # the pre-2024 location
    assert flags.get("--eval-interval").default == 100  # type: ignore[union-attr]
    assert not flags.eval_interval_required


def test_unparsable_file_falls_back_to_tokens(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "megatron/training/arguments.py": """
                def broken(:
                    pass
                group.add_argument('--transformer-impl', default='transformer_engine',
                                   choices=['local', 'transformer_engine'])
                group.add_argument("--no-persist-"
                                   "layer-norm", action='store_true')
                group.add_argument('--eval-interval', type=int, default=None, help=f'{x}')
            """
        },
    )
    flags = probe_megatron_flags(root)
    assert any("cannot parse" in w for w in flags.warnings)
    assert flags.choices("--transformer-impl") == ("local", "transformer_engine")
    assert flags.get("--no-persist-layer-norm").action == "store_true"  # type: ignore[union-attr]
    assert flags.eval_interval_required
    assert flags.get("--eval-interval").where == "megatron/training/arguments.py:7"  # type: ignore[union-attr]


def test_unresolved_config_class_is_a_warning(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "megatron/training/arguments.py": """
                from megatron.training.config import MissingConfig
                def add(parser):
                    ArgumentGroupFactory(MissingConfig).build_group(parser)
                    parser.add_argument('--enable-ft-package', action='store_true')
            """
        },
    )
    flags = probe_megatron_flags(root)
    assert flags.warnings == (
        "megatron/training/arguments.py:3: config class MissingConfig not found",
    )
    assert flags.has("--enable-ft-package")


def test_not_a_checkout(tmp_path: Path) -> None:
    with pytest.raises(MegatronSourceError, match="MEGATRON_PATH"):
        probe_megatron_flags(tmp_path)


# ---------------------------------------------------------------------------------------------
# The no-TE/Apex profile
# ---------------------------------------------------------------------------------------------


def test_no_te_profile_full(new_checkout: Path, old_checkout: Path) -> None:
    expected = [
        "--transformer-impl=local",
        "--no-gradient-accumulation-fusion",
        "--no-persist-layer-norm",
        "--no-masked-softmax-fusion",
    ]
    assert list(no_te_profile_args(probe_megatron_flags(new_checkout))) == expected
    assert list(no_te_profile_args(probe_megatron_flags(old_checkout))) == expected


def test_no_te_profile_filtered_by_parser(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "megatron/training/arguments.py": """
                def add(group):
                    group.add_argument('--transformer-impl', choices=['transformer_engine'])
                    group.add_argument('--no-persist-layer-norm', action='store_true')
            """
        },
    )
    assert no_te_profile_args(probe_megatron_flags(root)) == ("--no-persist-layer-norm",)
    empty = MegatronFlags(tmp_path, (), {})
    assert no_te_profile_args(empty) == ()


# ---------------------------------------------------------------------------------------------
# Environment checks of the argument validation
# ---------------------------------------------------------------------------------------------

# The shape of core_v0.19.0's validate_args (megatron/training/arguments.py:1413-1439), with a
# refusal under FSDP as at its line 1014.
VALIDATION = """
import os

def validate_args(args, defaults={}):
    if args.use_torch_fsdp2:
        assert os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') != "1", \\
            'FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one'
    if (args.tensor_model_parallel_size > 1 or args.context_parallel_size > 1) \\
        and get_device_arch_version() < 10:
        if args.use_torch_fsdp2 or args.use_megatron_fsdp:
            warn_rank_0("...")
        elif args.overlap_moe_expert_parallel_comm:
            warn_rank_0("...")
        else:
            assert os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') == "1", \\
                "Using tensor model parallelism or context parallelism require setting the " \\
                "environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"
    return args

def add_megatron_arguments(parser):
    group = parser.add_argument_group(title='parallel')
    group.add_argument('--tensor-model-parallel-size', type=int, default=1)
    group.add_argument('--context-parallel-size', type=int, default=1)
    group.add_argument('--use-torch-fsdp2', action='store_true')
    group.add_argument('--use-megatron-fsdp', action='store_true')
    group.add_argument('--overlap-moe-expert-parallel-comm', action='store_true')
    group.add_argument('--ckpt-format', default='torch_dist')
    return parser
"""
MAX_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
#: where the real checkout is, when scripts/prepare_device.sh (or a developer) fetched it
REAL_CHECKOUT = Path(__file__).resolve().parents[2] / ".megatron"
needs_real_checkout = pytest.mark.skipif(
    not (REAL_CHECKOUT / "megatron" / "training" / "arguments.py").is_file(),
    reason="no Megatron checkout in .megatron/ (scripts/prepare_device.sh fetches one)",
)


def validation_tree(root: Path, text: str = VALIDATION) -> Path:
    return write_tree(root, {"megatron/training/arguments.py": text})


def line_of(root: Path, where: str) -> str:
    rel, _, line = where.partition(":")
    return (root / rel).read_text().splitlines()[int(line) - 1].strip()


def test_assert_under_nested_branches(tmp_path: Path) -> None:
    root = validation_tree(tmp_path)
    validation = ms.probe_validation_env(root)
    assert validation.sources == ("megatron/training/arguments.py",)
    refusal, demand = validation.of(MAX_CONNECTIONS)
    assert (demand.relation, demand.value) == ("==", "1")
    assert line_of(root, demand.where).startswith(f"assert os.environ.get('{MAX_CONNECTIONS}')")
    assert demand.condition_text == (
        "(args.tensor_model_parallel_size > 1 or args.context_parallel_size > 1) and "
        "get_device_arch_version() < 10 and not (args.use_torch_fsdp2 or args.use_megatron_fsdp)"
        " and not args.overlap_moe_expert_parallel_comm"
    )
    assert demand.message is not None and "require setting" in demand.message
    assert (refusal.relation, refusal.value, refusal.condition_text) == (
        "!=",
        "1",
        "args.use_torch_fsdp2",
    )
    assert demand.satisfied_by("1") and not demand.satisfied_by("8")
    assert not demand.satisfied_by(None)  # os.environ.get(...) is None when unset
    assert refusal.satisfied_by(None) and refusal.satisfied_by("32")
    assert not refusal.satisfied_by("1")


@pytest.mark.parametrize(
    ("argv", "truth"),
    [
        ([], ms.Truth.FALSE),
        (["--tensor-model-parallel-size=2"], ms.Truth.UNKNOWN),  # the GPU decides at run time
        (["--context-parallel-size", "2"], ms.Truth.UNKNOWN),
        (["--tensor-model-parallel-size=2", "--use-torch-fsdp2"], ms.Truth.FALSE),
        (["--tensor-model-parallel-size=2", "--overlap-moe-expert-parallel-comm"], ms.Truth.FALSE),
        # the last one wins, as in argparse
        (["--tensor-model-parallel-size=2", "--tensor-model-parallel-size=1"], ms.Truth.FALSE),
    ],
)
def test_when_the_demand_applies(tmp_path: Path, argv: list[str], truth: ms.Truth) -> None:
    root = validation_tree(tmp_path)
    _, demand = ms.probe_validation_env(root).of(MAX_CONNECTIONS)
    applies = demand.applies(probe_megatron_flags(root).namespace(argv))
    assert applies.truth is truth
    if truth is ms.Truth.UNKNOWN:
        assert applies.unknown == ("get_device_arch_version() < 10",)
        assert "not known before launch: get_device_arch_version() < 10" in applies.describe()
    else:
        assert applies.unknown == ()
    assert applies.known["tensor_model_parallel_size"] in (1, 2)


def test_if_that_raises_is_a_demand(tmp_path: Path) -> None:
    """The older shape (and yaml_arguments.py's): ``if X != "1": if cond: raise``."""
    root = validation_tree(
        tmp_path,
        """
        import os
        def validate_args(args):
            if os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') != "1":
                if args.sequence_parallel:
                    raise RuntimeError(
                        "Using sequence parallelism requires setting the environment variable "
                        "CUDA_DEVICE_MAX_CONNECTIONS to 1")
            if os.getenv('NCCL_PROTO', '') == 'simple':
                warn('slow')
        """,
    )
    (demand,) = ms.probe_validation_env(root).checks  # a warning is not a check
    assert (demand.name, demand.relation, demand.value) == (MAX_CONNECTIONS, "==", "1")
    assert demand.where == "megatron/training/arguments.py:3"
    assert demand.condition_text == "args.sequence_parallel"
    assert demand.message is not None and demand.message.startswith("Using sequence parallelism")
    assert demand.applies({"sequence_parallel": True}).truth is ms.Truth.TRUE
    assert demand.applies({"sequence_parallel": False}).truth is ms.Truth.FALSE
    assert demand.applies({}).truth is ms.Truth.UNKNOWN


def test_other_conditions_and_readers(tmp_path: Path) -> None:
    root = validation_tree(
        tmp_path,
        """
        import os
        from os import environ
        def validate_args(args):
            if args.sequence_parallel:
                assert "1" == os.environ['CUDA_DEVICE_MAX_CONNECTIONS']
            for _ in range(1):
                assert environ.get('NVTE_FLAG', '0') == '1', 'needs NVTE_FLAG'
            assert os.environ.get(name) == '1'  # not a literal name: not a check we can read
            assert args.x == '1'
        """,
    )
    first, second = ms.probe_validation_env(root).checks
    assert (first.name, first.relation, first.condition_text) == (
        MAX_CONNECTIONS,
        "==",
        "args.sequence_parallel",
    )
    assert first.applies({"sequence_parallel": False, "tensor_model_parallel_size": 8}).truth is (
        ms.Truth.FALSE
    )  # TP does not matter to this revision
    assert (second.name, second.condition_text, second.unset_value) == ("NVTE_FLAG", "always", "0")
    assert second.applies({}).truth is ms.Truth.TRUE
    assert not second.satisfied_by(None) and second.satisfied_by("1")


def test_no_checks_and_unreadable_validation(tmp_path: Path) -> None:
    root = validation_tree(tmp_path / "a", "def validate_args(args):\n    return args\n")
    assert ms.probe_validation_env(root).checks == ()
    broken = validation_tree(tmp_path / "b", "def validate_args(args:\n")
    validation = ms.probe_validation_env(broken)
    assert validation.unreadable == ("megatron/training/arguments.py",)
    with pytest.raises(MegatronSourceError, match="MEGATRON_PATH"):
        ms.probe_validation_env(tmp_path / "c")


@pytest.mark.parametrize(
    ("condition", "args", "truth"),
    [
        ("args.a and args.b", {"a": True}, ms.Truth.UNKNOWN),
        ("args.a and args.b", {"a": False}, ms.Truth.FALSE),
        ("args.a or f()", {"a": True}, ms.Truth.TRUE),
        ("args.a or f()", {"a": False}, ms.Truth.UNKNOWN),
        ("not args.a", {"a": 0}, ms.Truth.TRUE),
        ("1 < args.n <= 4", {"n": 4}, ms.Truth.TRUE),
        ("args.mode in ('x', 'y')", {"mode": "z"}, ms.Truth.FALSE),
        ("args.n > 1", {"n": None}, ms.Truth.UNKNOWN),  # None > 1: a TypeError, not a verdict
        ("args.n > 1", {}, ms.Truth.UNKNOWN),
        ("local_name > 1", {"local_name": 5}, ms.Truth.UNKNOWN),  # only args.X is read
    ],
)
def test_condition_logic(condition: str, args: dict[str, object], truth: ms.Truth) -> None:
    check = ms.EnvCheck("X", "==", "1", "f.py:1", (ms.Condition(condition),))
    assert check.applies(args).truth is truth
    negated = ms.EnvCheck("X", "==", "1", "f.py:1", (ms.Condition(condition, holds=False),))
    expected = {ms.Truth.TRUE: ms.Truth.FALSE, ms.Truth.FALSE: ms.Truth.TRUE}
    assert negated.applies(args).truth is expected.get(truth, ms.Truth.UNKNOWN)


def test_namespace_from_argv(new_checkout: Path, old_checkout: Path) -> None:
    old = probe_megatron_flags(old_checkout)
    ns = old.namespace(
        ["--no-gradient-accumulation-fusion", "--ckpt-format", "zarr", "--eval-interval=7"]
    )
    assert ns["gradient_accumulation_fusion"] is False  # store_false
    assert ns["ckpt_format"] == "zarr" and ns["eval_interval"] == 7
    assert ns["use_distributed_optimizer"] is False  # the implicit default of store_true
    assert "seed" not in ns  # default=SEED_DEFAULT is not a literal
    new = probe_megatron_flags(new_checkout).namespace(["--wandb-logging", "--no-wandb-logging"])
    assert new["wandb_logging"] is False  # BooleanOptionalAction, the last one wins


def test_documented_rule_stands_in() -> None:
    (rule,) = ms.DOCUMENTED_ENV_CHECKS
    assert rule.name == MAX_CONNECTIONS and "core_v0.19.0" in rule.where
    two = ms.documented_namespace(["--tensor-model-parallel-size=2"])
    assert two == {"tensor_model_parallel_size": 2, "context_parallel_size": 1}
    assert rule.applies(two).truth is ms.Truth.UNKNOWN
    one = ms.documented_namespace(["--context-parallel-size", "1"])
    assert rule.applies(one).truth is ms.Truth.FALSE


@needs_real_checkout
def test_real_checkout_validation() -> None:
    """core_v0.19.0: the assertion of issue #11, found where it is, and when it applies."""
    validation = ms.probe_validation_env(REAL_CHECKOUT)
    assert validation.unreadable == ()
    demands = [c for c in validation.of(MAX_CONNECTIONS) if c.relation == "=="]
    assert len(demands) == 1
    (demand,) = demands
    assert line_of(REAL_CHECKOUT, demand.where) == (
        "assert os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') == \"1\", \\"
    )
    assert "args.tensor_model_parallel_size > 1" in demand.condition_text
    assert "get_device_arch_version() < 10" in demand.condition_text
    refusals = [c for c in validation.of(MAX_CONNECTIONS) if c.relation == "!="]
    assert {c.condition_text for c in refusals} == {
        "args.use_torch_fsdp2",
        "args.use_megatron_fsdp",
    }
    flags = probe_megatron_flags(REAL_CHECKOUT)
    assert demand.applies(flags.namespace([])).truth is ms.Truth.FALSE
    tp2 = flags.namespace(["--tensor-model-parallel-size=2"])
    assert demand.applies(tp2).truth is ms.Truth.UNKNOWN
    assert demand.applies(tp2).unknown == ("get_device_arch_version() < 10",)
    cp2_fsdp = flags.namespace(["--context-parallel-size=2", "--use-torch-fsdp2"])
    assert demand.applies(cp2_fsdp).truth is ms.Truth.FALSE
    # every other check on the environment is off for the recipe's shape
    for check in validation.checks:
        if check is not demand:
            assert check.applies(tp2).truth is ms.Truth.FALSE, check
