"""What a Megatron-LM checkout says about itself, read from its source (never imported).

The workload's flags and environment must match the Megatron revision in use, and importing
Megatron here would need its whole stack in pytest's interpreter. So the checkout's own parser
and argument validation are read as source:

* flags: literal ``add_argument(...)`` calls in ``megatron/training/arguments.py``, plus the
  dataclass fields that Megatron >= 0.16 turns into options through ``ArgumentGroupFactory``;
* the worker environment: the checks its argument validation makes on environment variables
  (``assert os.environ.get('X') == "1"``, ``if os.environ.get('X') != "1": raise``), each with
  the conditions under which it runs, so a recipe can tell which ones its shape triggers.
"""

from __future__ import annotations

import ast
import contextlib
import enum
import io
import tokenize
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

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

    def namespace(self, argv: Sequence[str]) -> dict[str, object]:
        """The ``args`` attributes argparse would give ``argv``, as far as the source tells:
        every literal default, then each option of ``argv`` (``--x=v``, ``--x v``, switches).
        An attribute whose value is not known is absent."""
        ns: dict[str, object] = {}
        for declared in self.args.values():
            if declared.dest is not None and declared.default_known:
                ns.setdefault(declared.dest, declared.default)
        i = 0
        while i < len(argv):
            option, eq, text = argv[i].partition("=")
            i += 1
            spec = self.args.get(option)
            if spec is None or spec.dest is None or not option.startswith("-"):
                continue
            if spec.action in ("store_true", "store_false"):
                ns[spec.dest] = spec.action == "store_true"
            elif spec.action == "BooleanOptionalAction":
                ns[spec.dest] = not option.startswith("--no-")
            elif eq:
                ns[spec.dest] = _coerce(text, spec.default)
            elif i < len(argv) and not argv[i].startswith("-"):
                ns[spec.dest] = _coerce(argv[i], spec.default)
                i += 1
            else:
                ns.pop(spec.dest, None)  # an action we do not model: value unknown
        return ns

    def report(self) -> dict[str, dict[str, Any] | None]:
        """The probed options, for the run manifest and the report; None for an absent one."""
        out: dict[str, dict[str, Any] | None] = {}
        for option in PROBED_OPTIONS:
            spec = self.args.get(option)
            out[option] = spec.as_dict() if spec is not None else None
        return out


def _coerce(text: str, default: object) -> object:
    """A command-line value as argparse's ``type`` would most likely make it (int, float)."""
    if isinstance(default, str):
        return text
    for convert in (int, float):
        with contextlib.suppress(ValueError):
            return convert(text)
    return text


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
# The environment the checkout's argument validation demands
# ---------------------------------------------------------------------------------------------

#: Files whose checks run in every worker before training: validate_args, then initialize.
VALIDATION_FILES = (*ARGUMENT_FILES, "megatron/training/initialize.py")
_ENVIRON_GETTERS = ("os.environ.get", "environ.get", "os.getenv", "getenv")


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


def probe_validation_env(megatron_path: Path) -> ValidationEnv:
    """Read the checks the checkout's argument validation makes on environment variables.

    Imports nothing. Raises MegatronSourceError when the checkout has no arguments.py.
    """
    root = Path(megatron_path)
    main = next((rel for rel in ARGUMENT_FILES if (root / rel).is_file()), None)
    if main is None:
        raise MegatronSourceError(
            f"{root}: no {' or '.join(ARGUMENT_FILES)}; "
            "point MEGATRON_PATH (--nvrx-megatron-path) at a Megatron-LM checkout"
        )
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
                    message = _const_str(node.msg) if node.msg is not None else None
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
                message = _const_str(node.exc.args[0])
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
        value = _const_str(other)
        read = _environ_read(side)
        if value is not None and read is not None:
            return read[0], relation, value, read[1]
    return None


def _environ_read(node: ast.expr) -> tuple[str, str | None] | None:
    """(name, value when unset) of a read of one environment variable."""
    if isinstance(node, ast.Call) and _dotted(node.func) in _ENVIRON_GETTERS and node.args:
        name = _const_str(node.args[0])
        if name is None:
            return None
        unset = _const_str(node.args[1]) if len(node.args) > 1 else None
        return name, unset
    if isinstance(node, ast.Subscript) and _dotted(node.value) in ("os.environ", "environ"):
        name = _const_str(node.slice)
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
            value, known = _literal(node)
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
            ns[dest] = _coerce(text, default)  # the last one wins, as in argparse
    return ns
