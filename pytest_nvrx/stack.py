"""The training stack under qualification: versions, and the flags its Megatron accepts.

A recovery verdict is only worth something next to the stack it was measured on, and the
workload flags must match the Megatron revision in use. Both are found without importing
Megatron (or pytest) in this process:

* versions come from a probe run by the *workers'* interpreter, which need not be the one
  running pytest: this file, run as a script, prints one JSON line (stdlib only; any
  Python >= 3.10 can run it); Megatron's version and revision are read from the checkout;
* flags come from the checkout's own parser *source* (``megatron/training/arguments.py``):
  literal ``add_argument(...)`` calls, plus the dataclass fields that Megatron >= 0.16 turns
  into options through ``ArgumentGroupFactory``.

Every field that cannot be determined is None; nothing here raises for a missing package.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tokenize
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
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

    Costs one subprocess that imports torch (~6 s): call it once per session. Megatron's version
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


def run_probe(
    python: str, *, env: Mapping[str, str] | None = None, timeout: float = 120.0
) -> tuple[dict[str, Any], list[str]]:
    """Run this file as the probe under ``python``; ({} , [why]) when it gives no answer."""
    cmd = [python, "-c", _BOOTSTRAP, str(Path(__file__).resolve())]
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


def probe_interpreter() -> dict[str, Any]:
    """What this interpreter would give the workers. Runs inside the probe subprocess."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "python_executable": sys.executable,
    }
    errors: list[str] = []
    for key, dists in _DISTRIBUTIONS.items():
        info[key] = _distribution_version(dists, _MODULES.get(key))
    torch: Any = None
    try:
        import torch

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
    names, drivers = _nvidia_smi(errors)
    if not names and torch is not None and info.get("cuda_available"):
        try:  # initializes CUDA in this short-lived process; only without nvidia-smi
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception as exc:
            errors.append(f"gpu: {exc}")
    info["gpu"] = summarize_gpus(names)
    info["driver"] = ", ".join(sorted(set(drivers))) or None
    info["errors"] = errors
    return info


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


def _nvidia_smi(errors: list[str]) -> tuple[list[str], list[str]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        errors.append(f"nvidia-smi: {exc}")
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
    """One line for the pytest header."""

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
    megatron = f"Megatron {v(stack.megatron)}"
    if stack.megatron_describe is not None:
        megatron += f" {stack.megatron_describe}"
    if stack.megatron_rev is not None:
        megatron += f" ({stack.megatron_rev[:12]})"
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


# ---------------------------------------------------------------------------------------------
# Flags of a Megatron checkout, read from its parser source
# ---------------------------------------------------------------------------------------------

#: Where Megatron keeps its parser (moved to megatron/training/ in 2024).
ARGUMENT_FILES = ("megatron/training/arguments.py", "megatron/arguments.py")
#: Other files that add options (pretrain_gpt.py's extra_args_provider, when it has one).
EXTRA_ARGUMENT_FILES = ("pretrain_gpt.py",)
#: The options our recipe depends on; MegatronFlags.report() lists exactly these.
PROBED_OPTIONS = (
    "--async-strategy",
    "--eval-interval",
    "--transformer-impl",
    "--no-gradient-accumulation-fusion",
    "--no-persist-layer-norm",
    "--no-masked-softmax-fusion",
    "--use-persistent-ckpt-worker",
    "--async-save",
    "--enable-ft-package",
    "--ft-num-warmup-iters",
    "--ckpt-format",
    "--use-distributed-optimizer",
)
#: The "no TE/Apex" profile measured on the H200 (docs: shared/gpu-evidence/README.md):
#: option, value (None for a switch).
NO_TE_PROFILE: tuple[tuple[str, str | None], ...] = (
    ("--transformer-impl", "local"),
    ("--no-gradient-accumulation-fusion", None),
    ("--no-persist-layer-norm", None),
    ("--no-masked-softmax-fusion", None),
)
_FACTORY_SUFFIX = "ArgumentGroupFactory"
_MAX_IMPORT_DEPTH = 8


class MegatronSourceError(FileNotFoundError):
    """The path is not a Megatron-LM checkout we can read options from."""


@dataclass(frozen=True)
class ArgSpec:
    """One option as the parser source declares it."""

    options: tuple[str, ...]
    dest: str | None
    action: str | None
    choices: tuple[str, ...] | None
    #: argparse's default: the literal value, or None when it is not a literal
    #: (``default_known`` says which).
    default: object
    default_known: bool
    #: "path:line" relative to the checkout, of the add_argument call or dataclass field.
    where: str
    #: "add_argument", or "ArgumentGroupFactory(CheckpointConfig) at path:line".
    via: str = "add_argument"

    def as_dict(self) -> dict[str, Any]:
        return {
            "options": list(self.options),
            "dest": self.dest,
            "action": self.action,
            "choices": list(self.choices) if self.choices is not None else None,
            "default": self.default if self.default_known else "<not a literal>",
            "where": self.where,
            "via": self.via,
        }


@dataclass(frozen=True)
class MegatronFlags:
    """The options a checkout's parser declares, keyed by option string."""

    megatron_path: Path
    sources: tuple[str, ...]
    args: Mapping[str, ArgSpec]
    #: What could not be resolved (a config class not found, a file that failed to parse).
    warnings: tuple[str, ...] = ()

    def get(self, option: str) -> ArgSpec | None:
        return self.args.get(option)

    def has(self, option: str) -> bool:
        return option in self.args

    def choices(self, option: str) -> tuple[str, ...] | None:
        spec = self.args.get(option)
        return spec.choices if spec is not None else None

    def accepts(self, option: str, value: str) -> bool:
        """The option exists and, when it declares choices, ``value`` is one of them."""
        spec = self.args.get(option)
        return spec is not None and (spec.choices is None or value in spec.choices)

    @property
    def async_strategy_choices(self) -> tuple[str, ...] | None:
        """None when the revision has no --async-strategy (the NVRx writer is then implicit)."""
        spec = self.args.get("--async-strategy")
        return None if spec is None else (spec.choices or ())

    @property
    def eval_interval_required(self) -> bool:
        """--eval-interval must be passed: its default is None (core 0.19 then divides by it)."""
        spec = self.args.get("--eval-interval")
        return spec is not None and (not spec.default_known or spec.default is None)

    def report(self) -> dict[str, dict[str, Any] | None]:
        """The probed options, for the run manifest and the report; None for an absent one."""
        out: dict[str, dict[str, Any] | None] = {}
        for option in PROBED_OPTIONS:
            spec = self.args.get(option)
            out[option] = spec.as_dict() if spec is not None else None
        return out


def probe_megatron_flags(megatron_path: Path) -> MegatronFlags:
    """Read the options of the checkout at ``megatron_path`` from source; imports nothing.

    Declared is not the same as usable: an option added under a runtime condition is reported
    as present. Raises MegatronSourceError when the checkout has no arguments.py.
    """
    root = Path(megatron_path)
    main = next((rel for rel in ARGUMENT_FILES if (root / rel).is_file()), None)
    if main is None:
        raise MegatronSourceError(
            f"{root}: no {' or '.join(ARGUMENT_FILES)}; "
            "point MEGATRON_PATH (--nvrx-megatron-path) at a Megatron-LM checkout"
        )
    reader = _SourceReader(root)
    sources = [main] + [rel for rel in EXTRA_ARGUMENT_FILES if (root / rel).is_file()]
    for rel in sources:
        reader.scan(rel)
    return MegatronFlags(root, tuple(sources), reader.specs, tuple(reader.warnings))


def no_te_profile(flags: MegatronFlags) -> list[str]:
    """The no-TE/Apex flags this checkout accepts, as argv items (``--transformer-impl=local``)."""
    argv: list[str] = []
    for option, value in NO_TE_PROFILE:
        if value is None and flags.has(option):
            argv.append(option)
        elif value is not None and flags.accepts(option, value):
            argv.append(f"{option}={value}")
    return argv


def no_te_profile_applies(stack: Stack) -> bool:
    """Transformer Engine or Apex is missing for the workers (or the probe could not tell).

    Without TE the default ``--transformer-impl=transformer_engine`` fails; without Apex the
    fused kernels Megatron enables by default are missing (gpu-evidence README).
    """
    return not stack.probed or stack.transformer_engine is None or stack.apex is None


class _SourceReader:
    """Collects ArgSpecs from parser files, following imports to config dataclasses."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.specs: dict[str, ArgSpec] = {}
        self.warnings: list[str] = []
        self._trees: dict[str, ast.Module | None] = {}
        self._defaults: dict[str, tuple[object, str]] = {}

    # -- files --------------------------------------------------------------------------------

    def tree(self, rel: str) -> ast.Module | None:
        if rel not in self._trees:
            try:
                text = (self.root / rel).read_text(encoding="utf-8")
                self._trees[rel] = ast.parse(text, filename=rel)
            except (OSError, SyntaxError, ValueError) as exc:
                self.warnings.append(f"{rel}: cannot parse ({exc})")
                self._trees[rel] = None
        return self._trees[rel]

    def scan(self, rel: str) -> None:
        tree = self.tree(rel)
        if tree is None:
            try:
                text = (self.root / rel).read_text(encoding="utf-8", errors="replace")
            except OSError:
                return
            for token_spec in _scan_tokens(text, rel):
                self._add(token_spec)
            return
        for node, scope in _walk_with_scope(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _call_name(node)
            if name == "add_argument":
                spec = _spec_from_add_argument(node, rel)
                if spec is not None:
                    self._add(spec)
            elif name == "set_defaults":
                for kw in node.keywords:
                    if kw.arg is not None:
                        value, known = _literal(kw.value)
                        if known:
                            self._defaults[kw.arg] = (value, f"{rel}:{node.lineno}")
            elif name is not None and name.endswith(_FACTORY_SUFFIX) and node.args:
                self._factory(node, rel, scope)
        self._apply_set_defaults()

    def _add(self, spec: ArgSpec) -> None:
        for option in spec.options:
            self.specs.setdefault(option, spec)  # argparse refuses a second one; keep the first

    def _apply_set_defaults(self) -> None:
        for option, spec in list(self.specs.items()):
            if spec.dest is not None and spec.dest in self._defaults:
                value, _where = self._defaults[spec.dest]
                self.specs[option] = replace(spec, default=value, default_known=True)

    # -- ArgumentGroupFactory(ConfigClass, exclude=[...]) ---------------------------------------

    def _factory(self, call: ast.Call, rel: str, scope: dict[str, ast.expr]) -> None:
        cls_node = call.args[0]
        cls_name = cls_node.attr if isinstance(cls_node, ast.Attribute) else None
        if isinstance(cls_node, ast.Name):
            cls_name = cls_node.id
        if cls_name is None:
            self.warnings.append(f"{rel}:{call.lineno}: config class is not a name; skipped")
            return
        exclude: set[str] = set()
        for kw in call.keywords:
            if kw.arg == "exclude":
                value = scope.get(kw.value.id) if isinstance(kw.value, ast.Name) else kw.value
                names, known = _literal(value) if value is not None else (None, False)
                if known and isinstance(names, list | tuple | set):
                    exclude = {str(n) for n in names}
                elif not (known and names is None):
                    self.warnings.append(f"{rel}:{call.lineno}: exclude= not a literal list")
        found = self.find_class(rel, cls_name)
        if found is None:
            self.warnings.append(f"{rel}:{call.lineno}: config class {cls_name} not found")
            return
        via = f"ArgumentGroupFactory({cls_name}) at {rel}:{call.lineno}"
        for fld in self.dataclass_fields(*found):
            if fld.name in exclude:
                continue
            spec = _spec_from_field(fld, via)
            if spec is not None:
                self._add(spec)

    def find_class(self, rel: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        """The ClassDef ``name`` as seen from module ``rel``: defined there or imported."""
        tree = self.tree(rel)
        if tree is None or depth > _MAX_IMPORT_DEPTH:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return rel, node
        for imp in ast.walk(tree):  # imports inside functions count too (Megatron does that)
            if not isinstance(imp, ast.ImportFrom):
                continue
            for alias in imp.names:
                if (alias.asname or alias.name) != name:
                    continue
                for target in self._module_files(rel, imp.module, imp.level):
                    found = self.find_class(target, alias.name, depth + 1)
                    if found is not None:
                        return found
        return None

    def _module_files(self, rel: str, module: str | None, level: int) -> Iterator[str]:
        if level:
            base = Path(rel).parent
            for _ in range(level - 1):
                base = base.parent
            parts = [*base.parts, *(module.split(".") if module else [])]
        elif module:
            parts = module.split(".")
        else:
            return
        for candidate in (Path(*parts).with_suffix(".py"), Path(*parts, "__init__.py")):
            if (self.root / candidate).is_file():
                yield candidate.as_posix()

    def dataclass_fields(self, rel: str, cls: ast.ClassDef, depth: int = 0) -> list[_Field]:
        """Fields in dataclass order: bases first, a redefinition keeps the first position."""
        merged: dict[str, _Field] = {}
        if depth <= _MAX_IMPORT_DEPTH:
            for base in reversed(cls.bases):
                base_name = base.id if isinstance(base, ast.Name) else None
                found = self.find_class(rel, base_name) if base_name else None
                if found is not None:
                    for fld in self.dataclass_fields(*found, depth=depth + 1):
                        merged[fld.name] = fld
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            if "ClassVar" in ast.unparse(node.annotation):
                continue
            merged[node.target.id] = _Field.parse(node, rel)
        return [f for f in merged.values() if f.init]


@dataclass(frozen=True)
class _Field:
    name: str
    annotation: ast.expr
    default: object
    default_known: bool
    init: bool
    meta: dict[str, ast.expr]
    where: str

    @classmethod
    def parse(cls, node: ast.AnnAssign, rel: str) -> _Field:
        assert isinstance(node.target, ast.Name)
        value: ast.expr | None = node.value
        init = True
        meta: dict[str, ast.expr] = {}
        if isinstance(value, ast.Call) and _call_name(value) == "field":
            kwargs = {kw.arg: kw.value for kw in value.keywords if kw.arg is not None}
            value = kwargs.get("default")
            if "default_factory" in kwargs:
                value = _factory_value(kwargs["default_factory"])
            init_value, known = _literal(kwargs["init"]) if "init" in kwargs else (True, True)
            init = not (known and init_value is False)
            metadata = kwargs.get("metadata")
            if isinstance(metadata, ast.Dict):
                for k, v in zip(metadata.keys, metadata.values, strict=True):
                    is_meta = isinstance(k, ast.Constant) and k.value == "argparse_meta"
                    if is_meta and isinstance(v, ast.Dict):
                        meta = {
                            str(mk.value): mv
                            for mk, mv in zip(v.keys, v.values, strict=True)
                            if isinstance(mk, ast.Constant)
                        }
        default, known = _literal(value) if value is not None else (None, False)
        where = f"{rel}:{node.lineno}"
        return cls(node.target.id, node.annotation, default, known, init, meta, where)


def _factory_value(node: ast.expr) -> ast.expr | None:
    """default_factory=list / dict / lambda: [..] -> an expression for its value."""
    empty = {"list": "[]", "dict": "{}", "tuple": "()"}
    if isinstance(node, ast.Name) and node.id in empty:
        return ast.parse(empty[node.id], mode="eval").body
    if isinstance(node, ast.Lambda):
        return node.body
    return None


def _spec_from_field(fld: _Field, via: str) -> ArgSpec | None:
    """Mirror of Megatron's ArgumentGroupFactory._build_argparse_kwargs_from_field."""
    base, choices = _annotation_kind(fld.annotation)
    flag = fld.name.replace("_", "-")
    options: tuple[str, ...] = (f"--{flag}",)
    action = None
    default, known = fld.default, fld.default_known
    if base == "bool":
        # Megatron: store_true if default == False else store_false, with --no-/--disable-.
        if known and default is False:
            action = "store_true"
        else:
            action = "store_false"
            options = (f"--no-{flag}", f"--disable-{flag}")
    dest: str | None = fld.name
    meta = fld.meta
    if "arg_names" in meta:
        names, ok = _literal(meta["arg_names"])
        if ok and isinstance(names, list | tuple):
            options = tuple(str(n) for n in names)
    if "dest" in meta:
        value, ok = _literal(meta["dest"])
        dest = str(value) if ok else None
    if "action" in meta:
        value, ok = _literal(meta["action"])
        action = str(value) if ok else None
    if "choices" in meta:
        value, ok = _literal(meta["choices"])
        choices = tuple(str(c) for c in value) if ok and isinstance(value, list | tuple) else None
    if "default" in meta:
        default, known = _literal(meta["default"])
    if not options:
        return None
    return ArgSpec(options, dest, action, choices, default, known, fld.where, via)


def _annotation_kind(node: ast.expr) -> tuple[str | None, tuple[str, ...] | None]:
    """('bool', None), (None, ('a', 'b')) for a Literal, ... Optional/``| None`` unwrapped."""
    # X | None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        for side, other in ((node.left, node.right), (node.right, node.left)):
            if isinstance(other, ast.Constant) and other.value is None:
                return _annotation_kind(side)
        return None, None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # string annotation
        try:
            return _annotation_kind(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return None, None
    if isinstance(node, ast.Name):
        return node.id, None
    if isinstance(node, ast.Subscript):
        outer = _dotted(node.value).rsplit(".", 1)[-1]
        inner = node.slice
        items = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        if outer == "Optional" and len(items) == 1:
            return _annotation_kind(items[0])
        if outer == "Union":
            rest = [i for i in items if not (isinstance(i, ast.Constant) and i.value is None)]
            return _annotation_kind(rest[0]) if len(rest) == 1 else (None, None)
        if outer == "Literal":
            values = [i.value for i in items if isinstance(i, ast.Constant)]
            return None, tuple(str(v) for v in values)
        return outer, None
    return None, None


def _spec_from_add_argument(call: ast.Call, rel: str) -> ArgSpec | None:
    options = [s for s in (_const_str(a) for a in call.args) if s is not None and s[:1] == "-"]
    if not options:
        return None  # a positional argument, or names passed through a variable
    kwargs = {kw.arg: kw.value for kw in call.keywords if kw.arg is not None}
    return _make_spec(options, kwargs, f"{rel}:{call.lineno}")


def _make_spec(options: list[str], kwargs: Mapping[str, ast.expr], where: str) -> ArgSpec:
    def lit(key: str) -> tuple[object, bool]:
        return _literal(kwargs[key]) if key in kwargs else (None, False)

    action, _ = lit("action")
    if "action" in kwargs and not isinstance(action, str):  # a class: argparse.X or X
        action = _dotted(kwargs["action"]).rsplit(".", 1)[-1] or None
    if action == "BooleanOptionalAction":  # argparse adds --no-X for every --X
        options = options + [f"--no-{o[2:]}" for o in options if o.startswith("--")]
    dest, _ = lit("dest")
    choices_value, choices_known = lit("choices")
    choices = None
    if choices_known and isinstance(choices_value, list | tuple | set):
        choices = tuple(str(c) for c in choices_value)
    if "default" in kwargs:
        default, known = lit("default")
    else:  # argparse's implicit defaults
        implicit = {"store_true": False, "store_false": True}
        default, known = implicit.get(str(action)), True
    if not isinstance(dest, str):
        long = next((o for o in options if o.startswith("--")), options[0])
        dest = long.lstrip("-").replace("-", "_")
    return ArgSpec(
        tuple(options),
        dest,
        action if isinstance(action, str) else None,
        choices,
        default,
        known,
        where,
    )


def _scan_tokens(text: str, rel: str) -> list[ArgSpec]:
    """Fallback for a file ast cannot parse: literal strings of ``add_argument(...)`` calls.

    Adjacent string tokens concatenate (an option split over lines); keyword values are read
    when they are literals.
    """
    specs: list[ArgSpec] = []
    tokens: list[tokenize.TokenInfo] = []
    skip = (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)
    try:  # keep the tokens before an error (3.12 reports unbalanced brackets only at EOF)
        for t in tokenize.generate_tokens(io.StringIO(text).readline):
            if t.type not in skip:
                tokens.append(t)
    except (tokenize.TokenError, SyntaxError):
        pass
    i = 0
    while i < len(tokens) - 1:
        tok = tokens[i]
        if not (tok.string == "add_argument" and tokens[i + 1].string == "("):
            i += 1
            continue
        line, depth, j = tok.start[0], 0, i + 1
        items: list[list[tokenize.TokenInfo]] = [[]]
        while j < len(tokens):
            s = tokens[j].string
            if s in "([{" and tokens[j].type == tokenize.OP:
                depth += 1
                if depth == 1:
                    j += 1
                    continue
            elif s in ")]}" and tokens[j].type == tokenize.OP:
                depth -= 1
                if depth == 0:
                    break
            if depth == 1 and s == "," and tokens[j].type == tokenize.OP:
                items.append([])
            else:
                items[-1].append(tokens[j])
            j += 1
        options: list[str] = []
        kwargs: dict[str, ast.expr] = {}
        for item in items:
            if len(item) >= 2 and item[0].type == tokenize.NAME and item[1].string == "=":
                src = " ".join(t.string for t in item[2:])
                with contextlib.suppress(SyntaxError):
                    kwargs[item[0].string] = ast.parse(src, mode="eval").body
            elif item and all(t.type == tokenize.STRING for t in item):
                try:
                    value = ast.literal_eval(" ".join(t.string for t in item))
                except (ValueError, SyntaxError):
                    continue
                if isinstance(value, str) and value.startswith("-"):
                    options.append(value)
        if options:
            specs.append(_make_spec(options, kwargs, f"{rel}:{line}"))
        i = j + 1
    return specs


# -- small AST helpers -------------------------------------------------------------------------


def _walk_with_scope(tree: ast.Module) -> Iterator[tuple[ast.AST, dict[str, ast.expr]]]:
    """Every node with the simple ``name = value`` assignments of its enclosing function."""

    def visit(
        node: ast.AST, scope: dict[str, ast.expr]
    ) -> Iterator[tuple[ast.AST, dict[str, ast.expr]]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner: dict[str, ast.expr] = {}
                for sub in ast.walk(child):
                    if isinstance(sub, ast.Assign) and len(sub.targets) == 1:
                        target = sub.targets[0]
                        if isinstance(target, ast.Name):
                            inner[target.id] = sub.value
                yield child, scope
                yield from visit(child, {**scope, **inner})
            else:
                yield child, scope
                yield from visit(child, scope)

    module_scope: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            module_scope[node.targets[0].id] = node.value
    yield from visit(tree, module_scope)


def _call_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _const_str(node: ast.expr) -> str | None:
    """A string constant, also '--a' + '-b' and an f-string without placeholders."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _const_str(node.left), _const_str(node.right)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.JoinedStr):
        parts = [_const_str(v) for v in node.values]
        return "".join(p for p in parts if p is not None) if None not in parts else None
    return None


def _literal(node: ast.expr | None) -> tuple[object, bool]:
    """(value, True) for a literal expression (strings joined with + too), else (None, False)."""
    if node is None:
        return None, False
    text = _const_str(node)
    if text is not None:
        return text, True
    try:
        return ast.literal_eval(node), True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None, False


# ---------------------------------------------------------------------------------------------


def _probe_main() -> int:
    print(PROBE_PREFIX + json.dumps(probe_interpreter(), sort_keys=True), flush=True)
    return 0


if __name__ in ("__main__", _PROBE_RUN_NAME):
    raise SystemExit(_probe_main())
