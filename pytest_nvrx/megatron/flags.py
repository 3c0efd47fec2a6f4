"""The options a Megatron-LM checkout's parser declares, read from its source (never imported):
literal ``add_argument(...)`` calls in ``megatron/training/arguments.py``, plus the dataclass
fields that Megatron >= 0.16 turns into options through ``ArgumentGroupFactory``."""

from __future__ import annotations

import ast
import contextlib
import io
import tokenize
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_nvrx.megatron.source_ast import (
    argument_file,
    call_name,
    coerce,
    const_str,
    dotted,
    literal,
)

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
                ns[spec.dest] = coerce(text, spec.default)
            elif i < len(argv) and not argv[i].startswith("-"):
                ns[spec.dest] = coerce(argv[i], spec.default)
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


def probe_megatron_flags(megatron_path: Path) -> MegatronFlags:
    """Read the options of the checkout at ``megatron_path`` from source; imports nothing.

    Declared is not the same as usable: an option added under a runtime condition is reported
    as present. Raises MegatronSourceError when the checkout has no arguments.py.
    """
    root = Path(megatron_path)
    main = argument_file(root)
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
            name = call_name(node)
            if name == "add_argument":
                spec = _spec_from_add_argument(node, rel)
                if spec is not None:
                    self._add(spec)
            elif name == "set_defaults":
                for kw in node.keywords:
                    if kw.arg is not None:
                        value, known = literal(kw.value)
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
                names, known = literal(value) if value is not None else (None, False)
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
        if isinstance(value, ast.Call) and call_name(value) == "field":
            kwargs = {kw.arg: kw.value for kw in value.keywords if kw.arg is not None}
            value = kwargs.get("default")
            if "default_factory" in kwargs:
                value = _factory_value(kwargs["default_factory"])
            init_value, known = literal(kwargs["init"]) if "init" in kwargs else (True, True)
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
        default, known = literal(value) if value is not None else (None, False)
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
        names, ok = literal(meta["arg_names"])
        if ok and isinstance(names, list | tuple):
            options = tuple(str(n) for n in names)
    if "dest" in meta:
        value, ok = literal(meta["dest"])
        dest = str(value) if ok else None
    if "action" in meta:
        value, ok = literal(meta["action"])
        action = str(value) if ok else None
    if "choices" in meta:
        value, ok = literal(meta["choices"])
        choices = tuple(str(c) for c in value) if ok and isinstance(value, list | tuple) else None
    if "default" in meta:
        default, known = literal(meta["default"])
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
        outer = dotted(node.value).rsplit(".", 1)[-1]
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
    options = [s for s in (const_str(a) for a in call.args) if s is not None and s[:1] == "-"]
    if not options:
        return None  # a positional argument, or names passed through a variable
    kwargs = {kw.arg: kw.value for kw in call.keywords if kw.arg is not None}
    return _make_spec(options, kwargs, f"{rel}:{call.lineno}")


def _make_spec(options: list[str], kwargs: Mapping[str, ast.expr], where: str) -> ArgSpec:
    def lit(key: str) -> tuple[object, bool]:
        return literal(kwargs[key]) if key in kwargs else (None, False)

    action, _ = lit("action")
    if "action" in kwargs and not isinstance(action, str):  # a class: argparse.X or X
        action = dotted(kwargs["action"]).rsplit(".", 1)[-1] or None
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
            text = tokens[j].string
            if text in "([{" and tokens[j].type == tokenize.OP:
                depth += 1
                if depth == 1:
                    j += 1
                    continue
            elif text in ")]}" and tokens[j].type == tokenize.OP:
                depth -= 1
                if depth == 0:
                    break
            if depth == 1 and text == "," and tokens[j].type == tokenize.OP:
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
