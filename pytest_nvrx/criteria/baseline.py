"""Whether a run can be another run's baseline: an uninterrupted run of the same configuration.

training_continuity compares every iteration after the restore with the baseline's; a
"baseline" that is the judged run itself, that had a fault, that did not finish, or that trained
something else (another world size, TP/PP shape, number of iterations, seed, model) would make
that comparison prove nothing, or fail for a reason that is not the recovery's.
:func:`baseline_refusal` says why a run cannot serve; ``verify --baseline`` refuses it (exit 2),
and :func:`~pytest_nvrx.criteria.judgement.judge` (the plugin's pairing with the session's
baseline scenario) judges continuity by the replay alone and notes why.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_nvrx.criteria.expected import ExpectedFault
from pytest_nvrx.criteria.no_repeat_injection import no_repeat_injection
from pytest_nvrx.criteria.resume_settings import settings_of
from pytest_nvrx.evidence.manifest import Manifest, Setting
from pytest_nvrx.evidence.megatron import PARALLEL_LAYOUT
from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.evidence.rundir import RunEvidence

# run.json config keys that decide what is trained (Manifest fields of the same names)
CONFIG_KEYS = ("workload", "nnodes", "gpus_per_node", "world_size", "tp", "pp", "train_iters")
# workload options (after the injector's "--") that decide what is trained or what is printed;
# paths (--load, --save) differ by run, and the resume options (--finetune, --no-load-optim,
# the reference's --break-*) are what the criteria judge, not a difference of configuration
TRAINING_OPTIONS = frozenset(
    {
        "--seed",
        "--train-iters",
        "--train-samples",
        "--micro-batch-size",
        "--global-batch-size",
        "--lr",
        "--min-lr",
        "--lr-warmup-iters",
        "--lr-decay-style",
        "--data-samples",
        "--data-path",
        "--mock-data",
        "--tokenizer-type",
        "--vocab-size",
        "--seq-length",
        "--max-position-embeddings",
        "--num-layers",
        "--hidden-size",
        "--num-attention-heads",
        "--dropout",
        "--bf16",
        "--fp16",
        "--tensor-model-parallel-size",
        "--pipeline-model-parallel-size",
        "--context-parallel-size",
        "--expert-model-parallel-size",
        "--use-distributed-optimizer",
        "--log-interval",
    }
)
# Megatron's startup argument dump (cycle 0): the same, as the workload itself understood it
DUMP_SETTINGS = (
    *PARALLEL_LAYOUT,
    "seed",
    "use_distributed_optimizer",
    "log_interval",
)
_AS_BASELINE = ExpectedFault("none", "baseline", EvidenceRef("(baseline)", None, "fault: none"))


def baseline_refusal(run: RunEvidence, baseline: RunEvidence) -> str | None:
    """Why ``baseline`` cannot be ``run``'s uninterrupted baseline; None when it can."""
    if run.run_dir.resolve() == baseline.run_dir.resolve():
        return "it is the run being judged"
    fatal = baseline.fatal_problems
    if fatal:
        return fatal[0].message
    manifest = baseline.manifest
    if manifest is not None and manifest.fault is not None and manifest.fault.value != "none":
        return (
            f"its run.json says fault {manifest.fault.value!r} ({manifest.fault.ref.location}):"
            " a baseline injects none"
        )
    finished = no_repeat_injection(baseline, _AS_BASELINE)
    if not finished.passed:
        return f"it is not an uninterrupted run: {finished.reason}"
    differences = config_differences(run, baseline)
    if differences:
        return f"it differs in configuration: {'; '.join(differences)}"
    return None


def config_differences(run: RunEvidence, baseline: RunEvidence) -> list[str]:
    """Each recorded setting whose value differs, both values with their lines; a setting
    recorded by only one of the runs is not compared (runs made by hand have no run.json)."""
    found: list[str] = []
    if run.manifest is not None and baseline.manifest is not None:
        for key in CONFIG_KEYS:
            found += _differ(key, _setting(baseline.manifest, key), _setting(run.manifest, key))
        found += _argv_differences(run.manifest, baseline.manifest)
    ours, theirs = _first_settings(run), _first_settings(baseline)
    for name in DUMP_SETTINGS:
        a, b = theirs.get(name), ours.get(name)
        if a is not None and b is not None and a.value != b.value:
            found.append(
                f"{name} {a.value} ({a.ref.location}) in the baseline,"
                f" {b.value} ({b.ref.location}) in the run"
            )
    return found


def _setting(manifest: Manifest, key: str) -> Setting | None:
    value = getattr(manifest, key)
    return value if isinstance(value, Setting) else None


def _differ(key: str, base: Setting | None, ours: Setting | None) -> list[str]:
    if base is None or ours is None or base.value == ours.value:
        return []
    return [
        f"{key} {base.value} ({base.ref.location}) in the baseline,"
        f" {ours.value} ({ours.ref.location}) in the run"
    ]


def _options(argv: Sequence[str]) -> dict[str, str]:
    """``--name=value``, ``--name value`` and bare flags (value ``set``) of TRAINING_OPTIONS."""
    found: dict[str, str] = {}
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name not in TRAINING_OPTIONS:
            continue
        if not eq:
            following = argv[i + 1] if i + 1 < len(argv) else None
            value = following if following is not None and not following.startswith("--") else "set"
        found[name] = value
    return found


def _argv_differences(run: Manifest, baseline: Manifest) -> list[str]:
    if not run.workload_argv or not baseline.workload_argv:
        return []
    ours, theirs = _options(run.workload_argv), _options(baseline.workload_argv)
    where_b = baseline.workload_argv_ref.location if baseline.workload_argv_ref else "run.json"
    where_r = run.workload_argv_ref.location if run.workload_argv_ref else "run.json"
    return [
        f"{name} {theirs.get(name, 'not set')} ({where_b}) in the baseline,"
        f" {ours.get(name, 'not set')} ({where_r}) in the run"
        for name in sorted(ours.keys() | theirs.keys())
        if ours.get(name) != theirs.get(name)
    ]


def _first_settings(run: RunEvidence) -> dict[str, Setting]:
    log = run.cycle_logs[0] if run.cycle_logs else None
    return {name: Setting(e.value, e.ref) for name, e in settings_of(log).items()}
