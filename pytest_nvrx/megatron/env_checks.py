"""The environment a Megatron-LM checkout's argument validation demands, read from its source
(never imported): the checks it makes on environment variables (``assert os.environ.get('X') ==
"1"``, ``if os.environ.get('X') != "1": raise``), each with the conditions under which it runs, so
a recipe can tell which ones its shape triggers."""

from __future__ import annotations

import ast
import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_nvrx.megatron.source_ast import (
    ARGUMENT_FILES,
    argument_file,
    coerce,
    const_str,
    dotted,
    literal,
)

#: Files whose checks run in every worker before training: validate_args, then initialize.
VALIDATION_FILES = (*ARGUMENT_FILES, "megatron/training/initialize.py")
_ENVIRON_GETTERS = ("os.environ.get", "environ.get", "os.getenv", "getenv")


@dataclass(frozen=True)
class ValidationEnv:
    """The environment checks of a checkout's argument validation."""

    megatron_path: Path
    sources: tuple[str, ...]
    checks: tuple[EnvCheck, ...]
    #: validation files that exist but could not be parsed (their checks are missing)
    unreadable: tuple[str, ...] = ()

    def of(self, name: str) -> tuple[EnvCheck, ...]:
        return tuple(c for c in self.checks if c.name == name)


class Truth(enum.Enum):
    """Three-valued: a condition that reads something unknown before launch is UNKNOWN."""

    TRUE = "true"
    FALSE = "false"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Condition:
    """An enclosing ``if`` of a check: its test as source, and which branch holds the check."""

    test: str
    holds: bool = True

    @property
    def text(self) -> str:
        if self.holds:
            return self.test
        top = ast.parse(self.test, mode="eval").body
        simple = isinstance(top, ast.Name | ast.Attribute | ast.Call | ast.Subscript)
        return f"not {self.test}" if simple else f"not ({self.test})"

    @property
    def operand(self) -> str:
        """The text, parenthesized where ``and`` would bind tighter than its top operator."""
        top = ast.parse(self.test, mode="eval").body
        loose = isinstance(top, ast.IfExp | ast.Lambda | ast.NamedExpr) or (
            isinstance(top, ast.BoolOp) and isinstance(top.op, ast.Or)
        )
        return f"({self.test})" if self.holds and loose else self.text


@dataclass(frozen=True)
class Applies:
    """Whether a check's conditions hold for one set of args, and what that rests on."""

    truth: Truth
    #: the ``args.X`` attributes read, with the values they have for this run
    known: Mapping[str, object]
    #: the parts that cannot be evaluated from the args (``get_device_arch_version() < 10``)
    unknown: tuple[str, ...]

    def describe(self) -> str:
        """'tensor_model_parallel_size=2, context_parallel_size=1; not known before launch: X'"""
        text = ", ".join(f"{k}={v!r}" for k, v in self.known.items())
        if self.unknown:
            text += ("; " if text else "") + "not known before launch: " + ", ".join(self.unknown)
        return text


@dataclass(frozen=True)
class EnvCheck:
    """One check of the argument validation on an environment variable.

    ``assert os.environ.get('X') == "1"`` and ``if os.environ.get('X') != "1": raise ...`` both
    demand ``X == "1"``; ``assert os.environ.get('X') != "1"`` refuses that value.
    """

    name: str
    #: "==": the validation demands ``value``; "!=": it refuses ``value``
    relation: str
    value: str
    #: "path:line" relative to the checkout, of the assert or the if that raises
    where: str
    #: the enclosing ifs, outermost first (the check runs when all hold)
    conditions: tuple[Condition, ...] = ()
    #: what the variable reads as when it is unset (``os.environ.get('X', '')``: '')
    unset_value: str | None = None
    message: str | None = None

    @property
    def condition_text(self) -> str:
        if len(self.conditions) == 1:
            return self.conditions[0].text
        return " and ".join(c.operand for c in self.conditions) or "always"

    @property
    def demand(self) -> str:
        return f"{self.name}{self.relation}{self.value!r}"

    def satisfied_by(self, value: str | None) -> bool:
        """Would the check pass with the variable at ``value`` (None: unset)?"""
        actual = self.unset_value if value is None else value
        return (actual == self.value) == (self.relation == "==")

    def applies(self, args: Mapping[str, object]) -> Applies:
        """Do the conditions hold for ``args`` (``args.X`` -> ``args["X"]``, absent = unknown)?"""
        evaluator = _ConditionEvaluator(args)
        truth = Truth.TRUE
        for condition in self.conditions:
            result = evaluator.truth(ast.parse(condition.test, mode="eval").body)
            if not condition.holds:
                result = _negate(result)
            truth = _and(truth, result)
        unknown = tuple(evaluator.unknown) if truth is Truth.UNKNOWN else ()
        return Applies(truth, dict(evaluator.known), unknown)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "relation": self.relation,
            "value": self.value,
            "where": self.where,
            "condition": self.condition_text,
        }


def probe_validation_env(megatron_path: Path) -> ValidationEnv:
    """Read the checks the checkout's argument validation makes on environment variables.

    Imports nothing. Raises MegatronSourceError when the checkout has no arguments.py.
    """
    root = Path(megatron_path)
    main = argument_file(root)
    sources = [main] + [
        rel for rel in VALIDATION_FILES if rel not in ARGUMENT_FILES and (root / rel).is_file()
    ]
    checks: list[EnvCheck] = []
    unreadable: list[str] = []
    for rel in sources:
        try:
            tree = ast.parse((root / rel).read_text(encoding="utf-8"), filename=rel)
        except (OSError, SyntaxError, ValueError):
            unreadable.append(rel)
            continue
        checks.extend(env_checks(tree, rel))
    return ValidationEnv(root, tuple(sources), tuple(checks), tuple(unreadable))


def env_checks(tree: ast.Module, rel: str) -> list[EnvCheck]:
    """Every assert on an environment variable, and every ``if`` on one whose body raises."""
    found: list[EnvCheck] = []

    def visit(body: list[ast.stmt], conditions: tuple[Condition, ...]) -> None:
        for node in body:
            if isinstance(node, ast.Assert):
                env = _env_comparison(node.test)
                if env is not None:
                    name, relation, value, unset = env
                    message = const_str(node.msg) if node.msg is not None else None
                    where = f"{rel}:{node.lineno}"
                    found.append(EnvCheck(name, relation, value, where, conditions, unset, message))
            elif isinstance(node, ast.If):
                env = _env_comparison(node.test)
                if env is not None:
                    # `if X != "1": raise` demands X == "1": the raise is the refusal
                    name, relation, value, unset = env
                    demanded = "==" if relation == "!=" else "!="
                    for inner, message in _raises(node.body, ()):
                        where = f"{rel}:{node.lineno}"
                        found.append(
                            EnvCheck(
                                name, demanded, value, where, conditions + inner, unset, message
                            )
                        )
                    continue
                test = ast.unparse(node.test)
                visit(node.body, (*conditions, Condition(test, True)))
                visit(node.orelse, (*conditions, Condition(test, False)))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(node.body, ())
            elif isinstance(node, ast.With | ast.AsyncWith | ast.For | ast.While):
                visit(node.body, conditions)
            elif isinstance(node, ast.Try):
                for part in (node.body, node.orelse, node.finalbody):
                    visit(part, conditions)

    visit(tree.body, ())
    return found


def _raises(
    body: list[ast.stmt], conditions: tuple[Condition, ...]
) -> Iterator[tuple[tuple[Condition, ...], str | None]]:
    """The raise statements of ``body`` with the conditions that lead to each."""
    for node in body:
        if isinstance(node, ast.Raise):
            message = None
            if isinstance(node.exc, ast.Call) and node.exc.args:
                message = const_str(node.exc.args[0])
            yield conditions, message
        elif isinstance(node, ast.If):
            test = ast.unparse(node.test)
            yield from _raises(node.body, (*conditions, Condition(test, True)))
            yield from _raises(node.orelse, (*conditions, Condition(test, False)))


def _env_comparison(test: ast.expr) -> tuple[str, str, str, str | None] | None:
    """(name, "=="/"!=", value, value when unset) for ``os.environ.get('X'[, d]) == 'v'``,
    ``os.getenv(...)``, ``os.environ['X']``, either side; None for anything else."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    op = test.ops[0]
    if not isinstance(op, ast.Eq | ast.NotEq):
        return None
    relation = "==" if isinstance(op, ast.Eq) else "!="
    for side, other in ((test.left, test.comparators[0]), (test.comparators[0], test.left)):
        value = const_str(other)
        read = _environ_read(side)
        if value is not None and read is not None:
            return read[0], relation, value, read[1]
    return None


def _environ_read(node: ast.expr) -> tuple[str, str | None] | None:
    """(name, value when unset) of a read of one environment variable."""
    if isinstance(node, ast.Call) and dotted(node.func) in _ENVIRON_GETTERS and node.args:
        name = const_str(node.args[0])
        if name is None:
            return None
        unset = const_str(node.args[1]) if len(node.args) > 1 else None
        return name, unset
    if isinstance(node, ast.Subscript) and dotted(node.value) in ("os.environ", "environ"):
        name = const_str(node.slice)
        return (name, None) if name is not None else None
    return None


class _Unknown:
    def __repr__(self) -> str:
        return "<unknown>"


_UNKNOWN = _Unknown()
_COMPARE: dict[type[ast.cmpop], Any] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
}


class _ConditionEvaluator:
    """Kleene logic over a validation condition: ``args.X`` from the run's args, literals;
    anything else (a call, another variable) is unknown and remembered as source text."""

    def __init__(self, args: Mapping[str, object]) -> None:
        self.args = args
        self.known: dict[str, object] = {}
        self.unknown: list[str] = []

    def truth(self, node: ast.expr) -> Truth:
        if isinstance(node, ast.BoolOp):
            parts = [self.truth(v) for v in node.values]
            combine = _and if isinstance(node.op, ast.And) else _or
            result = parts[0]
            for part in parts[1:]:
                result = combine(result, part)
            return result
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return _negate(self.truth(node.operand))
        value = self.value(node)
        if value is _UNKNOWN:
            return Truth.UNKNOWN
        return Truth.TRUE if value else Truth.FALSE

    def value(self, node: ast.expr) -> object:
        if isinstance(node, ast.BoolOp) or (
            isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)
        ):
            truth = self.truth(node)
            return _UNKNOWN if truth is Truth.UNKNOWN else truth is Truth.TRUE
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "args" and node.attr in self.args:
                self.known[node.attr] = self.args[node.attr]
                return self.args[node.attr]
        elif isinstance(node, ast.Compare):
            mark = len(self.unknown)
            operands = [self.value(node.left), *(self.value(c) for c in node.comparators)]
            if any(o is _UNKNOWN for o in operands):
                del self.unknown[mark:]  # name the comparison, not its operand
                self._unknown(node)
                return _UNKNOWN
            try:
                return all(
                    _COMPARE[type(op)](a, b)
                    for op, a, b in zip(node.ops, operands, operands[1:], strict=False)
                )
            except (TypeError, KeyError):
                pass
        else:
            value, known = literal(node)
            if known:
                return value
        self._unknown(node)
        return _UNKNOWN

    def _unknown(self, node: ast.expr) -> None:
        text = ast.unparse(node)
        if text not in self.unknown:
            self.unknown.append(text)


def _negate(value: Truth) -> Truth:
    return {Truth.TRUE: Truth.FALSE, Truth.FALSE: Truth.TRUE}.get(value, Truth.UNKNOWN)


def _and(a: Truth, b: Truth) -> Truth:
    if Truth.FALSE in (a, b):
        return Truth.FALSE
    return Truth.TRUE if a is b is Truth.TRUE else Truth.UNKNOWN


def _or(a: Truth, b: Truth) -> Truth:
    if Truth.TRUE in (a, b):
        return Truth.TRUE
    return Truth.FALSE if a is b is Truth.FALSE else Truth.UNKNOWN


#: What a checkout's validation is taken to demand when it cannot be read: the check of
#: core_v0.19.0 (megatron/training/arguments.py:1413-1439, which asserts only outside FSDP and
#: overlapped MoE communication), the rule that ~30 of Megatron's example scripts follow.
DOCUMENTED_ENV_CHECKS: tuple[EnvCheck, ...] = (
    EnvCheck(
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "==",
        "1",
        "documented rule of core_v0.19.0 (megatron/training/arguments.py:1437)",
        (
            Condition(
                "(args.tensor_model_parallel_size > 1 or args.context_parallel_size > 1)"
                " and get_device_arch_version() < 10"
            ),
        ),
    ),
)
#: The defaults the documented rule reads (Megatron's), for a checkout we cannot read.
DOCUMENTED_DEFAULTS: Mapping[str, object] = {
    "tensor_model_parallel_size": 1,
    "context_parallel_size": 1,
}


def documented_namespace(argv: Sequence[str]) -> dict[str, object]:
    """The attributes DOCUMENTED_ENV_CHECKS read, from ``argv`` over Megatron's defaults."""
    ns = dict(DOCUMENTED_DEFAULTS)
    for dest, default in DOCUMENTED_DEFAULTS.items():
        option = "--" + dest.replace("_", "-")
        for i, item in enumerate(argv):
            name, eq, text = item.partition("=")
            if name != option:
                continue
            if not eq and i + 1 < len(argv):
                text = argv[i + 1]
            ns[dest] = coerce(text, default)  # the last one wins, as in argparse
    return ns
