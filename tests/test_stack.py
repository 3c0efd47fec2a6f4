"""Stack detection and source-level flag probing (pytest_nvrx.stack).

The flag fixtures are synthetic parsers written to mimic two real shapes of Megatron-LM's
parser: plain ``add_argument`` calls (core <= 0.16: no --async-strategy, --eval-interval
defaults to 1000) and core >= 0.17's dataclass-driven ``ArgumentGroupFactory`` (where
--async-strategy and --eval-interval, default None, come from config dataclasses).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_nvrx import stack as st
from pytest_nvrx.stack import (
    MegatronFlags,
    MegatronSourceError,
    Stack,
    detect_stack,
    format_stack_line,
    megatron_revision,
    no_te_profile,
    no_te_profile_applies,
    probe_megatron_flags,
    read_megatron_version,
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
    assert list(new) == list(st.PROBED_OPTIONS)
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
    assert no_te_profile(probe_megatron_flags(new_checkout)) == expected
    assert no_te_profile(probe_megatron_flags(old_checkout)) == expected


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
    assert no_te_profile(probe_megatron_flags(root)) == ["--no-persist-layer-norm"]
    empty = MegatronFlags(tmp_path, (), {})
    assert no_te_profile(empty) == []


@pytest.mark.parametrize(
    ("te", "apex", "probed", "applies"),
    [
        (None, None, True, True),
        ("2.8.0", None, True, True),
        (None, "0.1", True, True),
        ("2.8.0", "0.1", True, False),
        ("2.8.0", "0.1", False, True),  # unknown stack: the safe profile
    ],
)
def test_no_te_profile_applies(
    te: str | None, apex: str | None, probed: bool, applies: bool
) -> None:
    stack = Stack(transformer_engine=te, apex=apex, probed=probed)
    assert no_te_profile_applies(stack) is applies


# ---------------------------------------------------------------------------------------------
# Megatron version and revision from the checkout
# ---------------------------------------------------------------------------------------------

PACKAGE_INFO = """
# Copyright
MAJOR = 0
MINOR = 19
PATCH = 1
PRE_RELEASE = "rc2"
VERSION = (MAJOR, MINOR, PATCH, PRE_RELEASE)
import os as _os
"""


def test_read_megatron_version(tmp_path: Path) -> None:
    write_tree(tmp_path, {"megatron/core/package_info.py": PACKAGE_INFO})
    assert read_megatron_version(tmp_path) == "0.19.1rc2"
    write_tree(tmp_path, {"megatron/core/package_info.py": "MAJOR = 0\nMINOR = 19\n"})
    assert read_megatron_version(tmp_path) is None
    assert read_megatron_version(tmp_path / "nowhere") is None


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
    }
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    return subprocess.run(
        ["git", "-C", str(cwd), *args], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")


@needs_git
def test_revision_of_a_git_checkout(tmp_path: Path) -> None:
    repo = write_tree(tmp_path / "Megatron-LM", {"megatron/core/package_info.py": PACKAGE_INFO})
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "x")
    git(repo, "tag", "core_v0.19.0")
    head = git(repo, "rev-parse", "HEAD")
    assert megatron_revision(repo) == (head, "core_v0.19.0")
    (repo / "megatron/core/package_info.py").write_text(PACKAGE_INFO + "\n")
    assert megatron_revision(repo) == (head, "core_v0.19.0-dirty")


@needs_git
def test_export_nested_in_another_repo_uses_rev_file(tmp_path: Path) -> None:
    outer = tmp_path / "pytest-nvrx"
    write_tree(outer, {"README.md": "x"})
    git(outer, "init", "-q")
    git(outer, "add", ".")
    git(outer, "commit", "-q", "-m", "x")
    export = write_tree(outer / ".megatron", {"megatron/core/package_info.py": PACKAGE_INFO})
    assert megatron_revision(export) == (None, None)  # never the outer repo's HEAD
    (export / "MEGATRON_REV").write_text("5be9626709af2722333bf54797c954c09edeada3 core_v0.19.0\n")
    assert megatron_revision(export) == (
        "5be9626709af2722333bf54797c954c09edeada3",
        "core_v0.19.0",
    )
    (export / "MEGATRON_REV").write_text("abc123\n")
    assert megatron_revision(export) == ("abc123", None)


# ---------------------------------------------------------------------------------------------
# The probe, run by another "interpreter"
# ---------------------------------------------------------------------------------------------

FAKE_TORCH = """
from types import SimpleNamespace
__version__ = "2.11.0+cu130"
version = SimpleNamespace(cuda="13.0")
def _cudnn(): return 91002
def _nccl(): return (2, 28, 9)
backends = SimpleNamespace(cudnn=SimpleNamespace(version=_cudnn))
cuda = SimpleNamespace(nccl=SimpleNamespace(version=_nccl), is_available=lambda: True,
                       device_count=lambda: 1, get_device_name=lambda i: "Fake GPU")
"""


def fake_site(root: Path, *, torch: str = FAKE_TORCH, smi: str | None = None) -> dict[str, str]:
    """A PYTHONPATH with a fake torch, TE metadata and a bare apex; PATH with nvidia-smi."""
    write_tree(
        root,
        {
            "site/torch/__init__.py": torch,
            "site/transformer_engine-2.8.0.dist-info/METADATA": (
                "Metadata-Version: 2.1\nName: transformer_engine\nVersion: 2.8.0\n"
            ),
            "site/apex/__init__.py": "raise RuntimeError('the probe must not import apex')\n",
        },
    )
    bindir = root / "bin"
    bindir.mkdir(exist_ok=True)
    if smi is not None:
        exe = bindir / "nvidia-smi"
        exe.write_text(f"#!/bin/sh\nprintf '{smi}'\n")
        exe.chmod(0o755)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root / "site")
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_probe_in_another_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = fake_site(tmp_path, smi="NVIDIA H200, 580.95.05\\nNVIDIA H200, 580.95.05\\n")
    # A torch.py in the working directory must not shadow the workers' torch.
    cwd = write_tree(tmp_path / "cwd", {"torch.py": "raise SystemExit('shadowed')\n"})
    monkeypatch.chdir(cwd)
    stack = detect_stack(None, python=sys.executable, env=env, timeout=60)
    assert stack.probed, stack.errors
    assert (stack.torch, stack.cuda, stack.cudnn, stack.nccl) == (
        "2.11.0+cu130",
        "13.0",
        "9.10.2",
        "2.28.9",
    )
    assert stack.cuda_available is True
    assert (stack.gpu, stack.driver) == ("2 x NVIDIA H200", "580.95.05")
    assert stack.transformer_engine == "2.8.0"
    assert stack.apex == st.UNKNOWN_VERSION  # importable, no metadata, not imported
    assert stack.python == ".".join(map(str, sys.version_info[:3]))


def test_probe_without_nvidia_smi_asks_torch(tmp_path: Path) -> None:
    env = fake_site(tmp_path)
    env["PATH"] = str(tmp_path / "bin")  # no nvidia-smi
    stack = detect_stack(None, python=sys.executable, env=env, timeout=60)
    assert (stack.gpu, stack.driver) == ("Fake GPU", None)


def test_probe_survives_a_broken_torch(tmp_path: Path) -> None:
    env = fake_site(tmp_path, torch="raise ImportError('libcudart.so.13: cannot open')\n")
    stack = detect_stack(None, python=sys.executable, env=env, timeout=60)
    assert stack.probed
    assert stack.torch is None and stack.cuda is None and stack.cuda_available is None
    assert stack.transformer_engine == "2.8.0"
    assert any("libcudart" in e for e in stack.errors)


def fake_python(tmp_path: Path, body: str) -> str:
    exe = tmp_path / "fake-python"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return str(exe)


def test_probe_answer_among_other_output(tmp_path: Path) -> None:
    answer = {"python": "3.12.3", "torch": "2.11.0", "nvrx": "0.7.0", "megatron_core": "0.19.2"}
    python = fake_python(
        tmp_path,
        f"echo 'W1129 some warning on stdout'\necho '{st.PROBE_PREFIX}{json.dumps(answer)}'\n",
    )
    stack = detect_stack(None, python=python)
    assert (stack.python, stack.torch, stack.nvrx) == ("3.12.3", "2.11.0", "0.7.0")
    assert stack.megatron == "0.19.2"  # no checkout: the installed megatron-core
    assert stack.megatron_path is None and stack.errors == ()


@pytest.mark.parametrize(
    ("body", "timeout", "why"),
    [
        ("echo boom >&2; exit 3\n", 30.0, "exited 3 without an answer: boom"),
        ("exec sleep 30\n", 0.5, "no answer within 0.5 s"),
        (f"echo '{st.PROBE_PREFIX}{{not json'\n", 30.0, "unreadable answer"),
    ],
)
def test_probe_failure_is_reported_not_raised(
    tmp_path: Path, body: str, timeout: float, why: str
) -> None:
    checkout = write_tree(tmp_path / "m", {"megatron/core/package_info.py": PACKAGE_INFO})
    stack = detect_stack(checkout, python=fake_python(tmp_path, body), timeout=timeout)
    assert not stack.probed
    assert len(stack.errors) == 1 and why in stack.errors[0]
    assert stack.megatron == "0.19.1rc2"  # the checkout is still read
    assert stack.torch is None
    line = format_stack_line(stack)
    assert "TE ?" in line and "probe failed" in line and why in line


def test_missing_interpreter(tmp_path: Path) -> None:
    stack = detect_stack(None, python=str(tmp_path / "no-python"))
    assert not stack.probed and "cannot run" in stack.errors[0]


def test_real_probe_of_this_interpreter() -> None:
    """The only test that imports the real torch (in a subprocess, ~5 s)."""
    stack = detect_stack(None)
    assert stack.probed, stack.errors
    assert stack.python_executable == sys.executable
    import importlib.metadata

    assert stack.torch is not None
    assert stack.torch.split("+")[0] == importlib.metadata.version("torch").split("+")[0]
    assert stack.nvrx == importlib.metadata.version("nvidia-resiliency-ext")


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"), [(92600, "9.26.0"), (91002, "9.10.2"), (8907, "8.9.7"), (8600, "8.6.0")]
)
def test_format_cudnn(value: int, text: str) -> None:
    assert st.format_cudnn(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ((2, 28, 9), "2.28.9"),
        ([2, 21, 5], "2.21.5"),
        (22809, "2.28.9"),
        (2708, "2.7.8"),
        ("x", "x"),
    ],
)
def test_format_nccl(value: object, text: str) -> None:
    assert st.format_nccl(value) == text


def test_summarize_gpus() -> None:
    assert st.summarize_gpus([]) is None
    assert st.summarize_gpus(["NVIDIA H200"]) == "NVIDIA H200"
    assert st.summarize_gpus(["NVIDIA H200"] * 8) == "8 x NVIDIA H200"
    assert st.summarize_gpus(["A", "B"]) == "A, B"


DEVICE_STACK = Stack(
    python="3.12.3",
    torch="2.11.0+cu130",
    cuda="13.0",
    cudnn="9.10.2",
    nccl="2.28.9",
    cuda_available=True,
    gpu="NVIDIA H200",
    driver="580.95.05",
    megatron="0.19.1",
    megatron_rev="5be9626709af2722333bf54797c954c09edeada3",
    megatron_describe="core_v0.19.0",
    nvrx="0.7.0",
    probed=True,
)


def test_format_stack_line() -> None:
    assert format_stack_line(DEVICE_STACK) == (
        "nvrx stack: Python 3.12.3 | torch 2.11.0+cu130 (CUDA 13.0, cuDNN 9.10.2, NCCL 2.28.9)"
        " | GPU NVIDIA H200 (driver 580.95.05) | TE none | Apex none"
        " | Megatron 0.19.1 core_v0.19.0 (5be9626709af) | NVRx 0.7.0"
    )
    cpu = Stack(python="3.12.1", torch="2.15.0", cuda_available=False, probed=True)
    assert "GPU none" in format_stack_line(cpu)
    assert "torch 2.15.0 (CUDA ?, cuDNN ?, NCCL ?)" in format_stack_line(cpu)


def test_as_dict_round_trip() -> None:
    data = DEVICE_STACK.as_dict()
    assert data["errors"] is None and data["apex"] is None and data["probed"] is True
    assert json.loads(json.dumps(data)) == data
    assert Stack.from_dict(data) == DEVICE_STACK
    broken = Stack(errors=("a", "b"))
    assert broken.as_dict()["errors"] == "a; b"
    assert Stack.from_dict({**broken.as_dict(), "future_field": 1}) == broken
