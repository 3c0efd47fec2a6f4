"""What a Megatron-LM checkout says about itself, read from its source (never imported).

The workload's flags and environment must match the Megatron revision in use, and importing
Megatron here would need its whole stack in pytest's interpreter. So the checkout's own parser
and argument validation are read as source:

* flags: literal ``add_argument(...)`` calls in ``megatron/training/arguments.py``, plus the
  dataclass fields that Megatron >= 0.16 turns into options through ``ArgumentGroupFactory``
  (:mod:`pytest_nvrx.megatron.flags`);
* the worker environment: the checks its argument validation makes on environment variables
  (``assert os.environ.get('X') == "1"``, ``if os.environ.get('X') != "1": raise``), each with
  the conditions under which it runs, so a recipe can tell which ones its shape triggers
  (:mod:`pytest_nvrx.megatron.env_checks`).

Both rest on :mod:`pytest_nvrx.megatron.source_ast` (the parser file, literal values). This module
gathers their public names.
"""

from __future__ import annotations

from pytest_nvrx.megatron.env_checks import (
    DOCUMENTED_DEFAULTS,
    DOCUMENTED_ENV_CHECKS,
    VALIDATION_FILES,
    Applies,
    Condition,
    EnvCheck,
    Truth,
    ValidationEnv,
    documented_namespace,
    env_checks,
    probe_validation_env,
)
from pytest_nvrx.megatron.flags import (
    EXTRA_ARGUMENT_FILES,
    PROBED_OPTIONS,
    ArgSpec,
    MegatronFlags,
    probe_megatron_flags,
)
from pytest_nvrx.megatron.source_ast import ARGUMENT_FILES, MegatronSourceError

__all__ = [
    "ARGUMENT_FILES",
    "DOCUMENTED_DEFAULTS",
    "DOCUMENTED_ENV_CHECKS",
    "EXTRA_ARGUMENT_FILES",
    "PROBED_OPTIONS",
    "VALIDATION_FILES",
    "Applies",
    "ArgSpec",
    "Condition",
    "EnvCheck",
    "MegatronFlags",
    "MegatronSourceError",
    "Truth",
    "ValidationEnv",
    "documented_namespace",
    "env_checks",
    "probe_megatron_flags",
    "probe_validation_env",
]
