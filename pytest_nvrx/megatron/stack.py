"""The training stack under qualification: the versions the workers will run with.

A recovery verdict is only worth something next to the stack it was measured on. The versions
come from a probe run by the *workers'* interpreter, which need not be the one running pytest:
this file, run as a script, prints one JSON line (stdlib only; any Python >= 3.10 can run it).
Megatron's version and revision are read from the checkout, without importing it. What the
checkout's own parser and argument validation say is :mod:`pytest_nvrx.megatron.source`.

Every field that cannot be determined is None; nothing here raises for a missing package.

Where nvidia-smi lists GPUs (or the host has no NVIDIA driver at all: CUDA cannot be available)
and torch is a CUDA wheel whose cuDNN and NCCL are the ``nvidia-cudnn-cuN`` / ``nvidia-nccl-cuN``
wheels beside it, the probe reads torch's ``version.py`` and those wheels' metadata instead of
importing torch (0.17 s instead of 6.9 s on the H200 device, 0.14 s instead of 3.1 s on the
2-core CPU machine, the same answers); anywhere else (a container's source-built torch, system
libraries, a driver with no GPU listed) it imports torch. ``NVRX_STACK_PROBE=import`` always
imports it. The answer says which (``torch_facts``: ``metadata`` or ``import``).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------------------------
# Versions
# ---------------------------------------------------------------------------------------------

#: The probe prints its JSON on one line with this prefix (libraries may print to stdout too).
PROBE_PREFIX = "NVRX_STACK_PROBE="
#: Written by scripts/prepare_device.sh into an export that has no .git: "<commit> [<tag>]".
MEGATRON_REV_FILE = "MEGATRON_REV"
PACKAGE_INFO = Path("megatron", "core", "package_info.py")

_PROBE_RUN_NAME = "__nvrx_stack_probe__"
# Run this file by path, without the current directory ('' first on sys.path under -c, unless
# PYTHONSAFEPATH is set), which could shadow a package the workers import.
_BOOTSTRAP = (
    "import runpy, sys; sys.path[:1] = [p for p in sys.path[:1] if p]; "
    f"runpy.run_path(sys.argv[1], run_name={_PROBE_RUN_NAME!r})"
)

# Distribution names tried in order; the first installed one gives the version.
_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "nvrx": ("nvidia-resiliency-ext",),
    "megatron_core": ("megatron-core",),
    "transformer_engine": (
        "transformer-engine",
        "transformer-engine-torch",
        "transformer-engine-cu13",
        "transformer-engine-cu12",
    ),
    "apex": ("apex",),
}
# A package importable without distribution metadata (built from source into the path) is
# reported as present, version "unknown"; find_spec of a top-level name imports nothing.
_MODULES = {"transformer_engine": "transformer_engine", "apex": "apex"}
UNKNOWN_VERSION = "unknown"


@dataclass(frozen=True)
class Stack:
    """Versions seen by the workers' interpreter; None where not found."""

    python: str | None = None
    python_executable: str | None = None
    torch: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    cuda_available: bool | None = None
    gpu: str | None = None
    driver: str | None = None
    transformer_engine: str | None = None
    apex: str | None = None
    megatron: str | None = None
    megatron_path: str | None = None
    megatron_rev: str | None = None
    megatron_describe: str | None = None
    nvrx: str | None = None
    #: True when the probe ran in the workers' interpreter; False: only the checkout was read.
    probed: bool = False
    errors: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, str | bool | None]:
        """JSON-ready, for the run manifest and the report."""
        out: dict[str, str | bool | None] = {
            f.name: getattr(self, f.name) for f in fields(self) if f.name != "errors"
        }
        out["errors"] = "; ".join(self.errors) or None
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Stack:
        """Inverse of as_dict (unknown keys ignored), e.g. to read a run manifest back."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            if f.name == "errors":
                kwargs[f.name] = tuple(value.split("; ")) if value else ()
            else:
                kwargs[f.name] = value
        return cls(**kwargs)


def detect_stack(
    megatron_path: Path | None = None,
    python: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> Stack:
    """Versions for workers run by ``python`` (default: this interpreter) with ``env``.

    Costs one subprocess that imports torch (~6 s) the first time per interpreter and
    environment in a process; later calls reuse its answer (run_probe). Megatron's version
    comes from the checkout at ``megatron_path`` when given, else from the megatron-core
    distribution installed for ``python``.
    """
    probe, errors = run_probe(python or sys.executable, env=env, timeout=timeout)

    def text(key: str) -> str | None:
        value = probe.get(key)
        return str(value) if value is not None else None

    probe_errors = probe.get("errors")
    if isinstance(probe_errors, list):
        errors.extend(str(e) for e in probe_errors if e)
    megatron = megatron_rev = megatron_describe = None
    if megatron_path is not None:
        megatron = read_megatron_version(megatron_path)
        megatron_rev, megatron_describe = megatron_revision(megatron_path)
    if megatron is None and text("megatron_core") is not None:
        megatron = text("megatron_core")
        if megatron_path is not None:
            errors.append(
                f"megatron: no {PACKAGE_INFO} in {megatron_path}; "
                "the version is the installed megatron-core's"
            )
    available = probe.get("cuda_available")
    return Stack(
        python=text("python"),
        python_executable=text("python_executable"),
        torch=text("torch"),
        cuda=text("cuda"),
        cudnn=text("cudnn"),
        nccl=text("nccl"),
        cuda_available=available if isinstance(available, bool) else None,
        gpu=text("gpu"),
        driver=text("driver"),
        transformer_engine=text("transformer_engine"),
        apex=text("apex"),
        megatron=megatron,
        megatron_path=os.path.abspath(megatron_path) if megatron_path is not None else None,
        megatron_rev=megatron_rev,
        megatron_describe=megatron_describe,
        nvrx=text("nvrx"),
        probed=bool(probe),
        errors=tuple(errors),
    )


#: Answers of successful probes in this process, by interpreter and environment (see _probe_key).
_PROBE_CACHE: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]] = {}

#: Variables that change between tests and runs but not what an interpreter imports.
_VOLATILE_PREFIXES = ("PYTEST_", "NVRX_", "TORCHELASTIC_")
_VOLATILE_NAMES = frozenset({"TMPDIR", "PWD", "OLDPWD", "_", "SHLVL", "COLUMNS", "LINES"})


def _probe_key(
    python: str, env: Mapping[str, str] | None
) -> tuple[str, tuple[tuple[str, str], ...]]:
    source = os.environ if env is None else env
    kept = tuple(
        sorted(
            (k, v)
            for k, v in source.items()
            if k not in _VOLATILE_NAMES and not k.startswith(_VOLATILE_PREFIXES)
        )
    )
    return os.path.realpath(shutil.which(python) or python), kept


def run_probe(
    python: str, *, env: Mapping[str, str] | None = None, timeout: float = 120.0
) -> tuple[dict[str, Any], list[str]]:
    """The probe's answer for ``python`` with ``env``; ({}, [why]) when it gives no answer.

    A session plans many runs with one interpreter: a successful answer is kept for this process
    and reused while the interpreter path and its environment (less per-run variables) are the
    same, so the ~5 s torch import is paid once per session, not once per scenario.
    """
    key = _probe_key(python, env)
    cached = _PROBE_CACHE.get(key)
    if cached is not None:
        return dict(cached), []
    data, errors = _run_probe(python, env=env, timeout=timeout)
    if data and not errors and not data.get("errors"):
        _PROBE_CACHE[key] = dict(data)
    return data, errors


def _run_probe(
    python: str,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    host_root: Path | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Run this file as the probe under ``python``; ({} , [why]) when it gives no answer."""
    cmd = [python, "-c", _BOOTSTRAP, str(Path(__file__).resolve())]
    if host_root is not None:
        cmd.append(str(host_root))
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {}, [f"stack probe: {python} gave no answer within {timeout:g} s"]
    except OSError as exc:
        return {}, [f"stack probe: cannot run {python}: {exc}"]
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(PROBE_PREFIX):
            try:
                data = json.loads(line[len(PROBE_PREFIX) :])
            except ValueError as exc:
                return {}, [f"stack probe: unreadable answer from {python}: {exc}"]
            if isinstance(data, dict):
                return data, []
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {}, [f"stack probe: {python} exited {proc.returncode} without an answer: {tail}"]


def probe_interpreter(host_root: Path = Path("/")) -> dict[str, Any]:
    """What this interpreter would give the workers. Runs inside the probe subprocess;
    ``host_root`` is where ``/proc`` and ``/dev`` are looked up (tests give a tree)."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "python_executable": sys.executable,
    }
    errors: list[str] = []
    for key, dists in _DISTRIBUTIONS.items():
        info[key] = _distribution_version(dists, _MODULES.get(key))
    names, drivers = _nvidia_smi(errors)
    # With GPUs listed (CUDA is usable), or on a host with no NVIDIA driver at all (it cannot
    # be), and a CUDA wheel of torch whose cuDNN and NCCL come as wheels too, those wheels'
    # metadata say what an import would: no torch import (~3-5 s) then. A driver that nvidia-smi
    # does not list is left to the import, which asks CUDA itself.
    driverless = not names and no_nvidia_driver(host_root)
    quick = (
        torch_from_metadata()
        if (names or driverless) and os.environ.get(PROBE_MODE_ENV) != "import"
        else None
    )
    if quick is not None:
        info.update(quick, cuda_available=bool(names), torch_facts="metadata")
    else:
        info["torch_facts"] = "import"
        names = _torch_facts_by_import(info, errors, names)
    info["gpu"] = summarize_gpus(names)
    info["driver"] = ", ".join(sorted(set(drivers))) or None
    info["errors"] = errors
    return info


def _torch_facts_by_import(info: dict[str, Any], errors: list[str], names: list[str]) -> list[str]:
    """torch's, CUDA's, cuDNN's and NCCL's versions from importing torch, into ``info``; the GPU
    names (torch's, only where nvidia-smi listed none)."""
    try:
        torch: Any = importlib.import_module("torch")
    except Exception as exc:
        errors.append(f"torch: {type(exc).__name__}: {exc}")
        return names
    try:
        info["torch"] = str(torch.__version__)
        info["cuda"] = torch.version.cuda
        try:
            cudnn = torch.backends.cudnn.version()
            info["cudnn"] = format_cudnn(cudnn) if cudnn else None
        except Exception as exc:
            errors.append(f"cudnn: {exc}")
        try:
            info["nccl"] = format_nccl(torch.cuda.nccl.version())
        except Exception as exc:  # CPU-only builds have no NCCL
            errors.append(f"nccl: {type(exc).__name__}: {exc}")
        info["cuda_available"] = bool(torch.cuda.is_available())
    except Exception as exc:
        errors.append(f"torch: {type(exc).__name__}: {exc}")
    if not names and info.get("cuda_available"):
        try:  # initializes CUDA in this short-lived process; only without nvidia-smi
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception as exc:
            errors.append(f"gpu: {exc}")
    return names


#: ``import``: the probe always imports torch (never reads its facts from wheel metadata)
PROBE_MODE_ENV = "NVRX_STACK_PROBE"


def no_nvidia_driver(root: Path = Path("/")) -> bool:
    """True when this host has no NVIDIA kernel driver: no ``/proc/driver/nvidia`` and no
    ``/dev/nvidia*`` device node. CUDA cannot be available then, whatever torch was built for."""
    if (root / "proc/driver/nvidia").exists():
        return False
    try:
        return not any(p.name.startswith("nvidia") for p in (root / "dev").iterdir())
    except OSError:
        return False


def torch_from_metadata() -> dict[str, str] | None:
    """torch's version and CUDA from its ``version.py`` (read, not imported) and cuDNN's and
    NCCL's from the ``nvidia-cudnn-cuN`` / ``nvidia-nccl-cuN`` wheels a CUDA wheel of torch loads;
    None where any of them is not there (a source build, a container's system libraries: the
    probe imports torch then)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        package = Path(next(iter(spec.submodule_search_locations)))
        tree = ast.parse((package / "version.py").read_text())
    except (OSError, SyntaxError, StopIteration, UnicodeDecodeError):
        return None
    values: dict[str, object] = {}
    for node in tree.body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    version, cuda = values.get("__version__"), values.get("cuda")
    if not isinstance(version, str) or not isinstance(cuda, str) or not cuda:
        return None
    major = cuda.split(".")[0]
    found: dict[str, str] = {}
    for key, dist in (("cudnn", f"nvidia-cudnn-cu{major}"), ("nccl", f"nvidia-nccl-cu{major}")):
        # installed beside torch (the libraries its wheel loads), not elsewhere on the path
        beside = next(
            iter(importlib.metadata.distributions(name=dist, path=[str(package.parent)])), None
        )
        if beside is None or not beside.version:
            return None
        found[key] = ".".join(beside.version.split(".")[:3])
    return {"torch": version, "cuda": cuda, **found}


def _distribution_version(names: tuple[str, ...], module: str | None) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    if module is not None:
        try:
            if importlib.util.find_spec(module) is not None:
                return UNKNOWN_VERSION
        except (ImportError, ValueError):
            pass
    return None


def run_nvidia_smi(*args: str) -> str | None:
    """What ``nvidia-smi args`` prints; None where no nvidia-smi is on the PATH. The one place
    nvidia-smi runs (this probe's query, and gpu_slots' listing): here, since the probe script
    imports only the stdlib. Raises OSError, or subprocess.SubprocessError where it exits
    non-zero (CalledProcessError) or is still running after 30 s (TimeoutExpired)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def _nvidia_smi(errors: list[str]) -> tuple[list[str], list[str]]:
    try:
        out = run_nvidia_smi("--query-gpu=name,driver_version", "--format=csv,noheader")
    except (OSError, subprocess.SubprocessError) as exc:
        errors.append(f"nvidia-smi: {exc}")
        return [], []
    if out is None:
        return [], []
    names, drivers = [], []
    for line in out.splitlines():
        name, _, driver = line.rpartition(",")
        if name.strip():
            names.append(name.strip())
            drivers.append(driver.strip())
    return names, drivers


def summarize_gpus(names: list[str]) -> str | None:
    """'NVIDIA H200', '2 x NVIDIA H200', or the distinct names joined."""
    if not names:
        return None
    if len(set(names)) == 1:
        return names[0] if len(names) == 1 else f"{len(names)} x {names[0]}"
    return ", ".join(names)


def format_cudnn(version: int) -> str:
    """92600 -> '9.26.0' (cuDNN 9 encodes major*10000, cuDNN <= 8 major*1000)."""
    major, rest = divmod(version, 10000 if version >= 90000 else 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def format_nccl(version: object) -> str:
    """torch gives (2, 28, 9) or, in older releases, an int such as 22809 or 2708."""
    if isinstance(version, tuple | list):
        return ".".join(str(v) for v in version)
    if isinstance(version, int):
        major, rest = divmod(version, 10000 if version >= 20900 else 1000)
        return f"{major}.{rest // 100}.{rest % 100}"
    return str(version)


def read_megatron_version(megatron_path: Path) -> str | None:
    """Version from the checkout's package_info.py (MAJOR/MINOR/PATCH/PRE_RELEASE), not imported."""
    try:
        tree = ast.parse((megatron_path / PACKAGE_INFO).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    parts: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
                parts[target.id] = node.value.value
    if not all(isinstance(parts.get(k), int) for k in ("MAJOR", "MINOR", "PATCH")):
        return None
    pre = parts.get("PRE_RELEASE")
    return (
        f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{pre if isinstance(pre, str) else ''}"
    )


def megatron_revision(megatron_path: Path) -> tuple[str | None, str | None]:
    """(commit, describe) of a checkout that is its own git work tree, else from MEGATRON_REV.

    A checkout nested in another repository (``.megatron/`` in ours) must not report that
    repository's HEAD, so the work tree's top level has to be the checkout itself.
    """
    top = _git(megatron_path, "rev-parse", "--show-toplevel")
    if top is not None and _same_dir(Path(top), megatron_path):
        rev = _git(megatron_path, "rev-parse", "HEAD")
        if rev is not None:
            return rev, _git(megatron_path, "describe", "--tags", "--always", "--dirty")
    try:
        first = (megatron_path / MEGATRON_REV_FILE).read_text(encoding="utf-8").split()
    except (OSError, ValueError):
        return None, None
    if not first:
        return None, None
    return first[0], (first[1] if len(first) > 1 else None)


def _git(cwd: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(cwd), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and out else None


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    except OSError:
        return False


def format_stack_line(stack: Stack) -> str:
    """One line for the pytest header: the Megatron named is the checkout the workers import."""

    def v(value: str | None, absent: str = "?") -> str:
        return value if value is not None else absent

    # Absent TE/Apex is a finding ("none"); an unanswered probe is not ("?").
    missing = "none" if stack.probed else "?"
    torch = f"torch {v(stack.torch)}"
    if stack.torch is not None:
        torch += f" (CUDA {v(stack.cuda)}, cuDNN {v(stack.cudnn)}, NCCL {v(stack.nccl)})"
    gpu = f"GPU {v(stack.gpu, 'none' if stack.cuda_available is False else '?')}"
    if stack.driver is not None:
        gpu += f" (driver {stack.driver})"
    if stack.megatron_path is None:
        # Workers import Megatron only from a checkout (the megatron workload needs one); an
        # installed megatron-core is never what a reference run uses, so it is not named here.
        megatron = "Megatron not used"
    else:
        megatron = f"Megatron {v(stack.megatron)}"
        if stack.megatron_describe is not None:
            megatron += f" {stack.megatron_describe}"
        if stack.megatron_rev is not None:
            megatron += f" ({stack.megatron_rev[:12]})"
        megatron += f" from {stack.megatron_path}"
    parts = [
        f"Python {v(stack.python)}",
        torch,
        gpu,
        f"TE {v(stack.transformer_engine, missing)}",
        f"Apex {v(stack.apex, missing)}",
        megatron,
        f"NVRx {v(stack.nvrx, missing)}",
    ]
    line = "nvrx stack: " + " | ".join(parts)
    if not stack.probed:
        line += " | probe failed: " + "; ".join(stack.errors)
    return line


def no_te_profile_applies(stack: Stack) -> bool:
    """Transformer Engine or Apex is missing for the workers (or the probe could not tell).

    Without TE the default ``--transformer-impl=transformer_engine`` fails; without Apex the
    fused kernels Megatron enables by default are missing (gpu-evidence README).
    """
    return not stack.probed or stack.transformer_engine is None or stack.apex is None


# ---------------------------------------------------------------------------------------------


def _probe_main() -> int:
    # argv: [this file] or [this file, host root] (tests: a tree with or without a driver)
    root = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/")
    print(PROBE_PREFIX + json.dumps(probe_interpreter(root), sort_keys=True), flush=True)
    return 0


if __name__ in ("__main__", _PROBE_RUN_NAME):
    raise SystemExit(_probe_main())
