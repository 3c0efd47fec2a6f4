"""The lines a session prints once, before its first run, without pytest: what it runs on
(versions, a GPU qualification's stack, where) and what its selection means (pytest's own
"deselected" and "skipped" explained). The plugin prints them once scenarios are known to be
collected (not in pytest's report header, which every session prints before collection).
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from importlib import metadata

from pytest_nvrx.megatron.stack import detect_stack, format_stack_line
from pytest_nvrx.settings import NvrxSettings, option_hint


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def header_lines(settings: NvrxSettings) -> list[str]:
    """What the session runs on: versions, the workers' stack for a GPU qualification, where."""
    versions = ", ".join(
        f"{label} {_dist_version(dist)}"
        for label, dist in (
            ("torch", "torch"),
            ("nvrx", "nvidia-resiliency-ext"),
            ("megatron-core", "megatron-core"),
            ("TE", "transformer-engine"),
            ("apex", "apex"),
        )
    )
    lines = [f"nvrx: python {platform.python_version()}, {versions}"]
    if settings.megatron_path is not None and settings.run_dir is None:
        # A GPU qualification: the full stack of the workers' interpreter (one ~6 s probe,
        # reused by the scenarios), Megatron's version and revision included. Without a
        # Megatron path (CPU reference runs) each scenario still prints its stack.
        lines.append(format_stack_line(detect_stack(settings.megatron_path)))
    megatron, work_dir = settings.megatron_path or "not given", settings.work_dir or "pytest tmp"
    where = f"megatron: {megatron}, work dir: {work_dir}"
    if settings.run_dir is not None:
        where += f", judging existing run: {settings.run_dir}"
    lines.append(f"nvrx: {where}")
    return lines


def selection_lines(settings: NvrxSettings, selected: Sequence[str], deselected: int) -> list[str]:
    """What pytest's own "deselected" and "skipped" will mean, said once before the runs:
    ``selected``, the scenarios' keys; ``deselected``, how many tests -m/-k left out."""
    names = ", ".join(selected)
    lines = [f"nvrx: {len(selected)} scenario{'' if len(selected) == 1 else 's'}: {names}"]
    if deselected:
        lines.append(
            f"nvrx: {deselected} tests deselected by -m/-k: those the expression leaves out"
            " (-m gpu: Megatron on GPUs; -m 'not gpu': the CPU reference workload)"
        )
    if any(key.endswith("-baseline") for key in selected):
        lines.append(
            "nvrx: a baseline's criteria that need a fault (prior_checkpoint, replaced_cycle,"
            " optimizer_state_load, training_continuity) show as skipped: not applicable"
        )
    if settings.megatron_path is None and any(key.startswith("megatron-") for key in selected):
        lines.append(
            "nvrx: the megatron scenarios will be skipped: no Megatron checkout"
            f" ({option_hint('megatron-path', 'plugin')})"
        )
    return lines
