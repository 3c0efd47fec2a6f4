"""The common ground of reading a Megatron-LM checkout's source (never imported): where its
parser is, and the literal values its syntax tree spells out."""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

#: Where Megatron keeps its parser (moved to megatron/training/ in 2024).
ARGUMENT_FILES = ("megatron/training/arguments.py", "megatron/arguments.py")


class MegatronSourceError(FileNotFoundError):
    """The path is not a Megatron-LM checkout we can read options from."""


def argument_file(root: Path) -> str:
    """The checkout's parser file, relative to ``root``: the first of ARGUMENT_FILES there.

    Raises MegatronSourceError when the checkout has none.
    """
    found = next((rel for rel in ARGUMENT_FILES if (root / rel).is_file()), None)
    if found is None:
        raise MegatronSourceError(
            f"{root}: no {' or '.join(ARGUMENT_FILES)}; "
            "point MEGATRON_PATH (--nvrx-megatron-path) at a Megatron-LM checkout"
        )
    return found


def coerce(text: str, default: object) -> object:
    """A command-line value as argparse's ``type`` would most likely make it (int, float)."""
    if isinstance(default, str):
        return text
    for convert in (int, float):
        with contextlib.suppress(ValueError):
            return convert(text)
    return text


def call_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


def const_str(node: ast.expr) -> str | None:
    """A string constant, also '--a' + '-b' and an f-string without placeholders."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = const_str(node.left), const_str(node.right)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.JoinedStr):
        parts = [const_str(v) for v in node.values]
        return "".join(p for p in parts if p is not None) if None not in parts else None
    return None


def literal(node: ast.expr | None) -> tuple[object, bool]:
    """(value, True) for a literal expression (strings joined with + too), else (None, False)."""
    if node is None:
        return None, False
    text = const_str(node)
    if text is not None:
        return text, True
    try:
        return ast.literal_eval(node), True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None, False
