"""From a validated config to a launchable recipe, with the stack probed. No pytest here.

Shared by ``python -m pytest_nvrx run`` and the plugin's fixtures so both launch the same thing:
the stack is detected in the workers' interpreter, the Megatron checkout's own argument parser
is read, and the "no TE" profile is applied where Transformer Engine or Apex is missing (unless
the user chose a profile explicitly). Every decision is recorded for the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytest_nvrx.recipe import NO_TE_PROFILE, Recipe, build_recipe
from pytest_nvrx.settings import RunConfig, check_port
from pytest_nvrx.stack import (
    MegatronFlags,
    MegatronSourceError,
    Stack,
    detect_stack,
    no_te_profile,
    no_te_profile_applies,
    probe_megatron_flags,
)


@dataclass(frozen=True)
class Plan:
    recipe: Recipe
    stack: Stack | None
    #: Human-readable decisions (profile, flags found), also written to the manifest.
    notes: tuple[str, ...] = ()
    megatron_flags: dict[str, Any] = field(default_factory=dict)

    def manifest_stack(self) -> dict[str, Any] | None:
        if self.stack is None:
            return None
        out: dict[str, Any] = dict(self.stack.as_dict())
        out["profile"] = self.recipe.profile
        out["notes"] = list(self.notes)
        if self.megatron_flags:
            out["megatron_flags"] = self.megatron_flags
        return out


def plan_run(
    config: RunConfig,
    *,
    launcher_exe: str,
    port: int | None = None,
    probe: bool = True,
) -> Plan:
    """Build the recipe. ``probe=False`` (dry runs) skips the ~6 s stack probe: then only an
    explicit profile choice applies. A bad ``port`` is a ConfigError before anything is probed."""
    if port is not None:
        check_port(port, "--log-server-port")
    notes: list[str] = []
    stack: Stack | None = None
    flags_report: dict[str, Any] = {}
    profile_flags: tuple[str, ...] | None = None
    no_te = False
    flags: MegatronFlags | None = None
    if probe:
        stack = detect_stack(config.megatron_path)
    if config.workload == "megatron" and config.megatron_path is not None:
        try:
            flags = probe_megatron_flags(config.megatron_path)
        except (MegatronSourceError, OSError) as exc:
            # The walkthrough only requires pretrain_gpt.py; Megatron itself will complain
            # about a broken checkout. Without its options we cannot filter the profile.
            notes.append(f"could not read the checkout's options ({exc}); flags unfiltered")
    if flags is not None:
        profile_flags = tuple(no_te_profile(flags))
        missing = [f for f in NO_TE_PROFILE if f not in profile_flags]
        if missing:
            notes.append(f"this Megatron revision lacks {' '.join(missing)}")
        strategy = flags.async_strategy_choices
        flags_report = {
            "async_strategy_choices": list(strategy) if strategy is not None else None,
            "eval_interval_required": flags.eval_interval_required,
        }
        if strategy is not None:
            spec = flags.get("--async-strategy")
            default = spec.default if spec is not None and spec.default_known else None
            notes.append(
                f"--async-strategy exists here (choices {', '.join(strategy)}; default "
                f"{default}); left at the revision's default, as the walkthrough does"
            )
    if config.workload == "megatron" and config.no_te_profile is None and stack is not None:
        no_te = no_te_profile_applies(stack)
        if no_te:
            absent = [
                name
                for name, value in (
                    ("Transformer Engine", stack.transformer_engine),
                    ("Apex", stack.apex),
                )
                if value is None
            ]
            notes.append(
                f"no-TE profile applied: {' and '.join(absent) or 'TE/Apex'} not found "
                "for the workers' Python"
            )
    recipe = build_recipe(
        config, no_te=no_te, launcher_exe=launcher_exe, port=port, profile_flags=profile_flags
    )
    if config.no_te_profile is not None:
        notes.append(f"profile {recipe.profile} chosen explicitly")
    if config.workload == "reference" and config.fault == "ckpt-worker":
        notes.append(
            "reference checkpoints written by a persistent worker process (--async-writer="
            "process): fault ckpt-worker kills that worker"
        )
    if config.workload == "megatron" and not config.distributed_optimizer:
        notes.append("qualifying without --use-distributed-optimizer (explicit option)")
    return Plan(recipe=recipe, stack=stack, notes=tuple(notes), megatron_flags=flags_report)
