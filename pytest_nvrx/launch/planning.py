"""From a validated config to a launchable recipe, with the stack probed. No pytest here.

Shared by ``python -m pytest_nvrx run`` and the plugin's fixtures so both launch the same thing:
the stack is detected in the workers' interpreter, the Megatron checkout's own argument parser
and argument validation are read, the "no TE" profile is applied where Transformer Engine or
Apex is missing (unless the user chose a profile explicitly), and the workers' environment gets
what the checkout's validation demands for this shape. Every decision is recorded for the
manifest.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_nvrx.launch.prepare_megatron import Preparation
from pytest_nvrx.launch.recipe import (
    NO_TE_PROFILE,
    EnvOrigin,
    Recipe,
    WorkerEnvVar,
    build_recipe,
    no_te_profile_args,
)
from pytest_nvrx.megatron.source import (
    DOCUMENTED_ENV_CHECKS,
    EnvCheck,
    MegatronFlags,
    MegatronSourceError,
    Truth,
    ValidationEnv,
    documented_namespace,
    probe_megatron_flags,
    probe_validation_env,
)
from pytest_nvrx.megatron.stack import Stack, detect_stack, no_te_profile_applies
from pytest_nvrx.settings import ConfigError, RunConfig, check_port

#: Variables pytest-nvrx sets for the workers when the checkout's validation demands them.
#: Any other check the run is sure to fail is refused before launch; one it may fail is a note.
MANAGED_WORKER_ENV = ("CUDA_DEVICE_MAX_CONNECTIONS",)


@dataclass(frozen=True)
class Plan:
    recipe: Recipe
    stack: Stack | None
    #: Human-readable decisions (profile, flags found), also written to the manifest.
    notes: tuple[str, ...] = ()
    megatron_flags: dict[str, Any] = field(default_factory=dict)
    #: the checkout's first-use build, made sure of before the launch (None: not a Megatron
    #: run, or a dry run)
    first_use: Preparation | None = None

    def manifest_stack(self) -> dict[str, Any] | None:
        if self.stack is None:
            return None
        out: dict[str, Any] = dict(self.stack.as_dict())
        out["profile"] = str(self.recipe.profile)
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
    environ: Mapping[str, str] | None = None,
) -> Plan:
    """Build the recipe. ``probe=False`` (dry runs) skips the ~6 s stack probe: then only an
    explicit profile choice applies. A bad ``port`` is a ConfigError before anything is probed.

    ``environ`` (default: this process's) is what the launcher, and so the workers, inherit: a
    value set there for a variable the checkout demands is kept, or refused when it contradicts
    the demand (ConfigError: the workers would stop at argument validation).
    """
    if port is not None:
        check_port(port, "--log-server-port")
    environ = os.environ if environ is None else environ
    notes: list[str] = []
    stack: Stack | None = None
    flags_report: dict[str, Any] = {}
    profile_flags: tuple[str, ...] | None = None
    no_te = False
    flags: MegatronFlags | None = None
    validation: ValidationEnv | None = None
    validation_error: str | None = None
    if probe and config.workload == "megatron":
        stack = detect_stack(config.megatron_path)
    elif probe:
        # The reference workload never imports Megatron: no checkout is read even when one is
        # configured, and the installed megatron-core detect_stack falls back to is not reported
        # as part of the stack the workers run with.
        stack = replace(detect_stack(None), megatron=None)
    if config.workload == "megatron" and config.megatron_path is not None:
        try:
            flags = probe_megatron_flags(config.megatron_path)
        except (MegatronSourceError, OSError) as exc:
            # The walkthrough only requires pretrain_gpt.py; Megatron itself will complain
            # about a broken checkout. Without its options we cannot filter the profile.
            notes.append(f"could not read the checkout's options ({exc}); flags unfiltered")
        try:
            validation = probe_validation_env(config.megatron_path)
        except (MegatronSourceError, OSError) as exc:
            validation_error = str(exc)
    if flags is not None:
        profile_flags = no_te_profile_args(flags)
        missing = [f.arg for f in NO_TE_PROFILE if f.arg not in profile_flags]
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
    if config.workload == "megatron":
        variables, env_notes = worker_env_contract(
            recipe, validation, flags, environ, unreadable=validation_error
        )
        recipe = recipe.with_worker_env(variables)
        notes.extend(env_notes)
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


def worker_env_contract(
    recipe: Recipe,
    validation: ValidationEnv | None,
    flags: MegatronFlags | None,
    environ: Mapping[str, str],
    *,
    unreadable: str | None = None,
) -> tuple[list[WorkerEnvVar], list[str]]:
    """The variables the workers need for the checkout's validation to pass with this recipe's
    arguments, and notes on them.

    Each environment check of the validation is evaluated on the arguments the workers get
    (``args.X`` from the recipe's argv over the parser's defaults). A demand on a variable of
    MANAGED_WORKER_ENV that holds, or may hold (the GPU architecture is known only at run
    time), is met: with the user's value when it satisfies it, else pytest-nvrx's; a user's value
    that contradicts it is a ConfigError. Any other check this run is sure to fail is a
    ConfigError; one it may fail, a note. When the validation cannot be read, the documented rule
    of known revisions (DOCUMENTED_ENV_CHECKS) stands in, and a note says so.
    """
    checks: tuple[EnvCheck, ...]
    if validation is None:
        why: str | None = unreadable or "no checkout"
    elif validation.sources[0] in validation.unreadable:
        why = f"{validation.sources[0]} does not parse"
    else:
        why = None
    main_unread = why is not None
    if validation is None or main_unread:
        checks = DOCUMENTED_ENV_CHECKS
        args = documented_namespace(recipe.worker_args)
    else:
        checks = validation.checks
        args = (
            flags.namespace(recipe.worker_args)
            if flags is not None
            else documented_namespace(recipe.worker_args)
        )
    variables: dict[str, WorkerEnvVar] = {}
    notes: list[str] = []
    for check in checks:  # first the demands pytest-nvrx meets
        if check.name not in MANAGED_WORKER_ENV or check.relation != "==":
            continue
        applies = check.applies(args)
        if applies.truth is Truth.FALSE:
            continue
        decided = variables.get(check.name)
        given = decided.value if decided is not None else environ.get(check.name)
        here = applies.describe()
        if given is not None and not check.satisfied_by(given):
            origin = "pytest-nvrx set" if decided is not None else "your environment has"
            raise ConfigError(
                f"{origin} {check.name}={given}, but this Megatron checkout demands "
                f"{check.name}={check.value} for this run ({check.where}: "
                f"{check.condition_text}; here {here}): the workers would stop at argument "
                f"validation; unset {check.name} (pytest-nvrx then sets {check.value}) "
                f"or set it to {check.value}"
            )
        if decided is not None:
            continue
        origin = EnvOrigin.RECIPE if given is None else EnvOrigin.USER
        variables[check.name] = WorkerEnvVar(
            check.name, check.value, origin, check.where, check.condition_text, here
        )
        source = "set for the workers" if given is None else "kept from your environment"
        notes.append(
            f"worker env: {check.name}={check.value} {source}: {check.where} demands it when "
            f"{check.condition_text} (here {here})"
        )
        if main_unread:
            notes.append(
                f"worker env: the checkout's argument validation could not be read ({why}); "
                f"{check.name} follows the {check.where}"
            )
    final = {**environ, **{v.name: v.value for v in variables.values()}}
    for check in checks:  # then every check against the environment the workers will have
        if check.name in variables and check.relation == "==":
            continue
        applies = check.applies(args)
        if applies.truth is Truth.FALSE or check.satisfied_by(final.get(check.name)):
            continue
        value = final.get(check.name)
        has = f"{check.name}={value}" if value is not None else f"{check.name} unset"
        text = (
            f"{check.where} demands {check.demand} when {check.condition_text} "
            f"(here {applies.describe()}); the workers would have {has}"
        )
        if applies.truth is Truth.TRUE:
            raise ConfigError(
                f"this Megatron checkout's argument validation will refuse this run: {text}; "
                f"set {check.name} accordingly in the environment"
            )
        notes.append(f"worker env: may be refused: {text}")
    if not main_unread and not any(c.name in MANAGED_WORKER_ENV for c in checks):
        sizes = documented_namespace(recipe.worker_args)  # TP and CP, whatever the parser says
        parallel = [f"{k}={v}" for k, v in sizes.items() if v != 1]
        if parallel:
            notes.append(
                f"worker env: this checkout's validation has no check on "
                f"{', '.join(MANAGED_WORKER_ENV)} ({', '.join(parallel)}); left unset"
            )
    return list(variables.values()), notes
