"""The stack probe (pytest_nvrx.megatron.stack): versions seen by the workers' interpreter,
Megatron's
version and revision from the checkout, and the one-line summary."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_nvrx.megatron import stack as st
from pytest_nvrx.megatron.stack import (
    Stack,
    detect_stack,
    format_stack_line,
    megatron_revision,
    no_te_profile_applies,
    read_megatron_version,
)


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


# ---------------------------------------------------------------------------------------------
# The no-TE/Apex profile applies when TE or Apex is missing
# ---------------------------------------------------------------------------------------------


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
    megatron_path="/workspace/Megatron-LM",
    nvrx="0.7.0",
    probed=True,
)


def test_format_stack_line() -> None:
    assert format_stack_line(DEVICE_STACK) == (
        "nvrx stack: Python 3.12.3 | torch 2.11.0+cu130 (CUDA 13.0, cuDNN 9.10.2, NCCL 2.28.9)"
        " | GPU NVIDIA H200 (driver 580.95.05) | TE none | Apex none"
        " | Megatron 0.19.1 core_v0.19.0 (5be9626709af) from /workspace/Megatron-LM | NVRx 0.7.0"
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


def test_probe_answer_is_reused_per_interpreter_and_environment(tmp_path: Path) -> None:
    """A session plans many runs: one probe per interpreter and environment, not one per run;
    per-run variables (pytest's, ours, TMPDIR) do not count, anything else probes again."""
    calls = tmp_path / "calls"
    answer = {"python": "3.12.3", "torch": "2.11.0", "nvrx": "0.7.0", "errors": []}
    python = fake_python(
        tmp_path, f"echo x >> '{calls}'\necho '{st.PROBE_PREFIX}{json.dumps(answer)}'\n"
    )
    env = {"PATH": os.environ.get("PATH", ""), "TMPDIR": "/tmp/a", "PYTEST_CURRENT_TEST": "t1"}
    assert detect_stack(None, python=python, env=env).torch == "2.11.0"
    again = {**env, "TMPDIR": "/tmp/b", "PYTEST_CURRENT_TEST": "t2", "NVRX_RUN_TAG": "x"}
    assert detect_stack(None, python=python, env=again).torch == "2.11.0"
    assert calls.read_text().count("x") == 1
    other = {**env, "PYTHONPATH": str(tmp_path)}
    assert detect_stack(None, python=python, env=other).torch == "2.11.0"
    assert calls.read_text().count("x") == 2


def test_failed_probe_is_not_reused(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    python = fake_python(tmp_path, f"echo x >> '{calls}'\necho boom >&2; exit 3\n")
    for _ in range(2):
        assert not detect_stack(None, python=python).probed
    assert calls.read_text().count("x") == 2


def test_stack_line_names_megatron_only_from_a_checkout() -> None:
    """The workers import Megatron from the checkout; without one (the reference workload) an
    installed megatron-core is not what they run, so the line must not name its version."""
    reference = replace(
        DEVICE_STACK, megatron="0.19.2", megatron_path=None, megatron_rev=None,
        megatron_describe=None,
    )  # fmt: skip
    line = format_stack_line(reference)
    assert "| Megatron not used |" in line
    assert "0.19.2" not in line
    unreadable = replace(DEVICE_STACK, megatron=None, megatron_rev=None, megatron_describe=None)
    assert "| Megatron ? from /workspace/Megatron-LM |" in format_stack_line(unreadable)


def test_planned_reference_run_reports_megatron_not_used(tmp_path: Path) -> None:
    """A reference run's stack (header line and run.json) names no Megatron, even with a
    checkout configured and megatron-core installed in this interpreter (one real probe)."""
    import importlib.metadata

    from pytest_nvrx.launch.planning import plan_run
    from pytest_nvrx.settings import RunConfig

    assert importlib.metadata.version("megatron-core")  # what the old line wrongly reported
    checkout = write_tree(tmp_path / "m", {"megatron/core/package_info.py": PACKAGE_INFO})
    config = RunConfig(work_dir=tmp_path, run_id="r", workload="reference", megatron_path=checkout)
    plan = plan_run(config, launcher_exe="ft_launcher", port=1, probe=True)
    assert plan.stack is not None and plan.stack.probed, plan.stack
    assert "| Megatron not used |" in format_stack_line(plan.stack)
    recorded = plan.manifest_stack()
    assert recorded is not None
    assert (recorded["megatron"], recorded["megatron_path"], recorded["megatron_rev"]) == (
        None, None, None,
    )  # fmt: skip


def _wheel_site(root: Path, *, nccl: bool = True) -> dict[str, str]:
    """A CUDA wheel of torch as pip lays it out: version.py, and cuDNN/NCCL as nvidia wheels.
    Importing this torch fails: the probe must read, not import, where the wheels say it all."""
    files = {
        "site/torch/version.py": (
            "from typing import Optional\n__all__ = ['__version__']\n"
            "__version__ = '2.11.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\n"
        ),
        "site/nvidia_cudnn_cu13-9.19.0.56.dist-info/METADATA": (
            "Metadata-Version: 2.1\nName: nvidia-cudnn-cu13\nVersion: 9.19.0.56\n"
        ),
    }
    if nccl:
        files["site/nvidia_nccl_cu13-2.28.9.dist-info/METADATA"] = (
            "Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: 2.28.9\n"
        )
    env = fake_site(root, torch=FAKE_TORCH, smi="NVIDIA H200, 580.95.05\\n")
    write_tree(root, files)
    return env


@pytest.mark.parametrize(
    ("host", "cuda_available", "gpu"),
    [("gpu listed", True, "NVIDIA H200"), ("no driver", False, None)],
)
def test_probe_reads_a_torch_wheels_facts_without_importing_it(
    tmp_path: Path, host: str, cuda_available: bool, gpu: str | None
) -> None:
    """nvidia-smi lists a GPU, or there is no listing and no driver at all (a CPU machine such
    as CI's: CUDA cannot be available): the wheels say the rest; torch is not imported (~3 s on
    a 2-core VM)."""
    env = _wheel_site(tmp_path)
    write_tree(tmp_path, {"site/torch/__init__.py": "raise SystemExit('torch was imported')\n"})
    root = None
    if host == "no driver":
        env["PATH"] = str(tmp_path / "bin-empty")
        root = write_tree(tmp_path / "host", {"dev/null": "", "proc/cpuinfo": ""})
    data, errors = st._run_probe(sys.executable, env=env, timeout=60, host_root=root)
    assert not errors and data["torch_facts"] == "metadata", data
    assert (data["torch"], data["cuda"], data["cudnn"], data["nccl"]) == (
        "2.11.0+cu130",
        "13.0",
        "9.19.0",
        "2.28.9",
    )
    assert data["cuda_available"] is cuda_available and data["gpu"] == gpu


@pytest.mark.parametrize("case", ["no nccl wheel", "forced", "a driver but no gpu listed"])
def test_probe_imports_torch_where_metadata_cannot_say(tmp_path: Path, case: str) -> None:
    env = _wheel_site(tmp_path, nccl=case != "no nccl wheel")
    if case == "forced":
        env[st.PROBE_MODE_ENV] = "import"
    if case == "a driver but no gpu listed":
        env["PATH"] = str(tmp_path / "bin-empty")
    host = write_tree(tmp_path / "host", {"dev/nvidiactl": "", "proc/driver/nvidia/version": ""})
    data, errors = st._run_probe(sys.executable, env=env, timeout=60, host_root=host)
    assert not errors and data["torch_facts"] == "import", data
    # FAKE_TORCH's own answers (cuDNN 9.10.2), not the wheels'
    assert (data["torch"], data["cudnn"]) == ("2.11.0+cu130", "9.10.2")


@pytest.mark.parametrize(
    ("files", "driverless"),
    [
        ({"dev/null": ""}, True),
        ({"dev/nvidia0": ""}, False),
        ({"dev/nvidia-uvm": ""}, False),
        ({"dev/null": "", "proc/driver/nvidia/version": ""}, False),
    ],
)
def test_no_nvidia_driver(tmp_path: Path, files: dict[str, str], driverless: bool) -> None:
    assert st.no_nvidia_driver(write_tree(tmp_path, files)) is driverless
    assert st.no_nvidia_driver(tmp_path / "missing") is False  # unreadable /dev: cannot tell


def test_metadata_facts_equal_what_importing_this_torch_says() -> None:
    """This environment's real torch wheel: the metadata route and the import agree."""
    quick = st.torch_from_metadata()
    if quick is None:
        pytest.skip("this torch does not come as a CUDA wheel with nvidia cuDNN/NCCL wheels")
    code = (
        "import json, torch\n"
        "from pytest_nvrx.megatron.stack import format_cudnn, format_nccl\n"
        "print(json.dumps({'torch': str(torch.__version__), 'cuda': torch.version.cuda,"
        " 'cudnn': format_cudnn(torch.backends.cudnn.version()),"
        " 'nccl': format_nccl(torch.cuda.nccl.version())}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == quick
