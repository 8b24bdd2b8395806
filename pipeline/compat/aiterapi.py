"""aiter's API as the source spells it: signatures and what each module binds.

A module summary lists, in source order, every name the module binds at its
top level (including inside `if`/`try` blocks): functions with their written
signature (decorators such as `@compile_ops(...)` are not applied), classes
with their `__init__`, imports and re-exports (`from .ops.x import *`, aliases),
and backward-compatibility module maps (a package `__getattr__`/`sys.meta_path`
hook driven by a `{old: new}` dict, as in `aiter/ops/triton/__init__.py`).

`ApiIndex` resolves `aiter.<a>.<b>...` the way the import system would, parsing
only the modules it has to (a star-imported module is parsed only when its
source mentions the name looked up).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pipeline.compat import incremental
from pipeline.compat.extbind import SOURCES as EXT_SOURCES
from pipeline.compat.extbind import extension_names, is_extension_module
from pipeline.compat.pysource import (
    OPS_AHEAD,
    SummaryCache,
    Tree,
    def_spans,
    module_files,
    parse_source,
    resolve_relative,
    says_word,
    strip_bodies,
)
from pipeline.pickling import by_fields

# References from ATOM (pipeline.compat.calls): `(module, attribute chain)`, where the segment CALL
# means "the result of calling what precedes it", and the module TORCH_OPS holds the ops registered
# as `aiter::name`.
CALL = "()"
TORCH_OPS = "torch.ops.aiter"

ParamKind = Literal["posonly", "pos", "vararg", "kwonly", "varkw"]


@by_fields
@dataclass(frozen=True, slots=True)
class Param:
    name: str
    kind: ParamKind
    has_default: bool
    annotation: str | None
    default_none: bool = False  # `x: Tensor = None` accepts None whatever the annotation says

    def show(self) -> str:
        prefix = {"vararg": "*", "varkw": "**"}.get(self.kind, "")
        ann = f": {pretty_annotation(self.annotation)}" if self.annotation else ""
        return f"{prefix}{self.name}{ann}"


@by_fields
@dataclass(frozen=True, slots=True)
class Signature:
    name: str
    path: str
    line: int
    params: tuple[Param, ...]
    # A compiled or registered op (`@compile_ops`, `torch.library.custom_op`, ...), or a plain
    # wrapper of one defined beside it: its schema enforces the annotations. Plain Python does not.
    compiled: bool = False
    # The return annotation as written, or for an unannotated function a hint read from its
    # body: "call:X" (every `return` is `return X(...)`) or "name:X" (every `return` is `return X`).
    returns: str | None = None
    # How aiter registers it as a torch op (`torch.ops.aiter.<name>`): "compile_ops" or
    # "torch_compile_guard" (schema inferred from this signature, a leading `Tensor dummy` added when
    # the first parameter is not a Tensor), "custom_op" (schema as written); None: plain Python.
    op: str | None = None

    def bound_params(self) -> tuple[Param, ...]:
        return self.params

    def shape(self) -> tuple[tuple[str, str, bool, str | None], ...]:
        return tuple((p.name, p.kind, p.has_default, p.annotation) for p in self.params)


@by_fields
@dataclass(frozen=True, slots=True)
class Member:
    kind: Literal["method", "static", "class", "property"]
    sig: Signature  # as written (self/cls included)


@by_fields
@dataclass(frozen=True, slots=True)
class ClassInfo:
    """What a class defines: enough to resolve `obj.method(...)` on its instances."""

    name: str
    path: str
    line: int
    init: Signature | None  # its own __init__ (self dropped), None when inherited
    members: dict[str, Member] = field(default_factory=dict)
    attrs: frozenset[str] = frozenset()  # class-body assignments, nested classes, `self.x = ...`
    attr_ann: dict[str, str] = field(default_factory=dict)  # annotated attributes: name -> annotation
    bases: tuple[tuple[str, ...] | None, ...] = ()  # attribute paths (None: not a plain name)
    dynamic: bool = False  # __getattr__ / __getattribute__: any attribute may exist


# Binding events: (name, kind, payload, line)
#  def    -> Signature
#  class  -> ClassInfo
#  from   -> (absolute module, original name)
#  module -> absolute module
#  alias  -> tuple of names (same-module attribute path, e.g. ("f",) or ("ops", "g"))
#  inst   -> ("call", attribute path) `x = X(...)`, or ("ann", annotation) `x: X | None = ...`
#  value  -> None (something that is not a function we can see)
Event = tuple[str, str, object, int]


@by_fields
@dataclass(slots=True)
class ModSummary:
    module: str
    is_package: bool
    events: list[Event] = field(default_factory=list)
    stars: list[tuple[int, str]] = field(default_factory=list)  # (line, absolute module)
    all_names: tuple[str, ...] | None = None
    dynamic: bool = False  # module-level __getattr__ or globals() tricks
    compat_map: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    # `direct_register_custom_op("name", func, ...)` at module level: op name -> attribute path of func
    registered: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def find_sig(self, name: str) -> Signature | None:
        """The signature `name` denotes in this module: `f`, `C` (its __init__), `C.m` or `C().m`."""
        head, sep, member = name.partition(".")
        via_instance = head.endswith("()")
        head = head.removesuffix("()")
        for ev_name, kind, payload, _ in reversed(self.events):
            if ev_name != head or kind not in ("def", "class"):
                continue
            if kind == "def":
                return payload if not sep and isinstance(payload, Signature) else None
            if not isinstance(payload, ClassInfo):
                return None
            if not sep:
                return payload.init
            m = payload.members.get(member)
            return member_sig(payload, member, m, via_instance) if m is not None else None
        return None


def member_sig(cls: ClassInfo, name: str, m: Member, via_instance: bool) -> Signature | None:
    """A method as its call binds it: `obj.m(...)` without self, `C.m(obj, ...)` with it."""
    if m.kind == "property":
        return None
    params = m.sig.params
    drop = m.kind == "class" or (m.kind == "method" and via_instance)
    if drop and params and params[0].kind in ("posonly", "pos"):
        params = params[1:]
    qual = f"{cls.name}().{name}" if via_instance else f"{cls.name}.{name}"
    return Signature(qual, m.sig.path, m.sig.line, params, m.sig.compiled, returns=m.sig.returns, op=m.sig.op)


def op_signature(name: str, sig: Signature) -> Signature:
    """`torch.ops.aiter.<name>` as registered from the Python def `sig`: the schema is inferred from the
    def, with a leading `Tensor dummy` when aiter's JIT registers one whose first parameter is no Tensor."""
    params = sig.params
    if sig.op in ("compile_ops", "torch_compile_guard"):
        first = params[0] if params else None
        if first is None or (first.annotation or "") not in ("torch.Tensor", "Tensor"):
            params = (Param("dummy", "pos", False, "torch.Tensor"), *params)
    return Signature(f"{TORCH_OPS}.{name}", sig.path, sig.line, params, True, returns=sig.returns, op=sig.op)


def sig_from_def(
    fn: ast.FunctionDef | ast.AsyncFunctionDef, path: str, drop_first: bool, returns: str | None = None
) -> Signature:
    a = fn.args
    params: list[Param] = []
    pos = [*a.posonlyargs, *a.args]
    n_def = len(a.defaults)
    first_default = len(pos) - n_def
    for i, arg in enumerate(pos):
        kind: ParamKind = "posonly" if i < len(a.posonlyargs) else "pos"
        d = a.defaults[i - first_default] if i >= first_default else None
        params.append(Param(arg.arg, kind, d is not None, _ann(arg.annotation), _is_none(d)))
    if a.vararg:
        params.append(Param(a.vararg.arg, "vararg", True, _ann(a.vararg.annotation)))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append(Param(arg.arg, "kwonly", d is not None, _ann(arg.annotation), _is_none(d)))
    if a.kwarg:
        params.append(Param(a.kwarg.arg, "varkw", True, _ann(a.kwarg.annotation)))
    if drop_first and params and params[0].kind in ("posonly", "pos"):
        params = params[1:]
    return Signature(fn.name, path, fn.lineno, tuple(params), _is_op(fn), returns=_ann(fn.returns) or returns)


# Decorators that turn a Python def into a torch op with a schema (aiter's JIT and torch.library).
_OP_DECORATORS = {"compile_ops", "torch_compile_guard", "custom_op", "register_custom_op", "impl"}


def _is_op(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for d in fn.decorator_list:
        node = d.func if isinstance(d, ast.Call) else d
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        if name in _OP_DECORATORS:
            return True
    return False


def _mark_op_wrappers(s: ModSummary) -> None:
    """`def f(...)` beside its op `@compile_ops def _f_hip(...)` forwards to it: it is op-backed."""
    ops = [p.name for _, k, p, _ in s.events if k == "def" and isinstance(p, Signature) and p.compiled]
    if not ops:
        return
    for i, (name, kind, payload, line) in enumerate(s.events):
        wraps = isinstance(payload, Signature) and any(o != name and name in o for o in ops)
        if kind == "def" and isinstance(payload, Signature) and not payload.compiled and wraps:
            s.events[i] = (name, kind, dataclasses.replace(payload, compiled=True), line)


def _is_none(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _ann(node: ast.expr | None) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value  # string annotation
    return _plain(node) or ast.unparse(node)


def _plain(node: ast.expr) -> str | None:
    """`ast.unparse` of the shapes annotations and defaults almost always have (it is slow), else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _plain(node.value) if isinstance(node.value, ast.Name | ast.Attribute) else None
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Constant):
        v = node.value
        if v is None or isinstance(v, bool):
            return str(v)
        if v is Ellipsis:
            return "..."
        if type(v) is int and v >= 0:
            return str(v)
        return None
    if isinstance(node, ast.Subscript):
        base = _plain(node.value) if isinstance(node.value, ast.Name | ast.Attribute) else None
        sl = node.slice
        if base is None:
            return None
        if isinstance(sl, ast.Tuple) and sl.elts:
            items = [_plain(e) for e in sl.elts]
            return f"{base}[{', '.join(items)}]" if all(items) else None  # type: ignore[arg-type]
        inner = _plain(sl) if not isinstance(sl, ast.Tuple) else None
        return f"{base}[{inner}]" if inner else None
    if isinstance(node, ast.List):
        items = [_plain(e) for e in node.elts]
        return f"[{', '.join(items)}]" if all(items) else None  # type: ignore[arg-type]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        if isinstance(node.right, ast.BinOp):
            return None  # `a | (b | c)`: unparse's parentheses
        left, right = _plain(node.left), _plain(node.right)
        if left and right and (not isinstance(node.left, ast.BinOp) or isinstance(node.left.op, ast.BitOr)):
            return f"{left} | {right}"
    return None


def _is_staticmethod(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


_RETURN_RE = re.compile(r"^[ \t]*return[ \t]+([A-Za-z_][\w.]*)[ \t]*(\(?)")
_SELF_SET_RE = re.compile(r"\bself\.(\w+)[ \t]*(?::[ \t]*([^=\n]+?))?[ \t]*=(?!=)")
_SELF_CTOR_RE = re.compile(r"\bself\.(\w+)[ \t]*=[ \t]*([A-Z]\w*(?:\.\w+)*)\(")  # `self.x = Class(`
_LOCAL_IMPORT_RE = re.compile(r"^[ \t]+from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\(?[\w ,]*\)?)$")
_WORD_RE = re.compile(r"(?<![\w.])[A-Za-z_]\w*")


def _learn_imports(local: dict[str, str], mod: str, names: str, path: str) -> None:
    base = _absolute(mod, path)
    if not base:
        return
    for part in names.split(","):
        name, _, alias = part.strip().partition(" as ")
        if name.isidentifier():
            local[(alias or name).strip()] = f"{base}.{name}"


def _absolute(mod: str, path: str) -> str | None:
    """`from <mod> import ...` written in the file `path`, as an absolute module (relative levels)."""
    level = len(mod) - len(mod.lstrip("."))
    if not level:
        return mod
    parts = path[:-3].split("/")  # `from .` is the package: the file's directory
    pkg = parts[: len(parts) - level]
    if not pkg:
        return None
    rest = mod[level:]
    return ".".join(pkg) + (f".{rest}" if rest else "")


def table_key(node: ast.expr) -> str | None:
    """How a dispatch table's key is spelled, the same in aiter and ATOM: a literal's repr, or an enum
    member's last two names (`QuantType.per_1x32`, also as `aiter.QuantType.per_1x32` or `.value`)."""
    if isinstance(node, ast.Constant) and type(node.value) in (str, int):
        return repr(node.value)
    path = _attr_path(node)
    if path is None or len(path) < 2:
        return None
    if path[-1] == "value" and len(path) >= 3:
        path = path[:-1]
    if not path[-2][:1].isupper():
        return None  # `self.kind`, `torch.float16`: not an enum member we can name
    return ".".join(path[-2:])


def _table_hint(body: list[bytes]) -> str | None:
    """`table:` when the body returns `T.get(<param>[.value], ...)` or `T[<param>[.value]]` from a dict
    literal `T = {KEY: function, ...}`: each key with the dotted name of its function ("?" when the
    value is not a plain name: a lambda, a partial)."""
    text = b"\n".join(body).decode("utf-8", "replace")
    if "return" not in text or "{" not in text:
        return None
    try:
        import textwrap  # (rare: a nested definition's text)

        tree = ast.parse(textwrap.dedent(text))
    except (SyntaxError, ValueError):
        return None
    tables: dict[str, ast.Dict] = {}
    returns: list[ast.expr | None] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.Dict):
                tables[node.targets[0].id] = node.value
        elif isinstance(node, ast.Return):
            returns.append(node.value)
    if len(returns) != 1 or returns[0] is None:
        return None
    r = returns[0]
    if isinstance(r, ast.Call) and isinstance(r.func, ast.Attribute) and r.func.attr == "get" and r.args:
        table = r.func.value
    elif isinstance(r, ast.Subscript):
        table = r.value
    else:
        return None
    if not isinstance(table, ast.Name) or table.id not in tables:
        return None
    entries: list[str] = []
    for k, v in zip(tables[table.id].keys, tables[table.id].values, strict=True):
        key = table_key(k) if k is not None else None
        if key is None:
            continue
        target = _attr_path(v)
        value = ".".join(target) if target else "?"
        if (
            isinstance(v, ast.Call)
            and (_attr_path(v.func) or ("",))[-1] == "partial"
            and len(v.args) == 1
            and _attr_path(v.args[0])
            and all(k.arg for k in v.keywords)
        ):  # `functools.partial(f, group_size=128)`: f, with those keywords given
            value = ".".join(_attr_path(v.args[0]) or ()) + "+" + ",".join(str(k.arg) for k in v.keywords)
        entries.append(f"{key}\x1e{value}")
    return "table:" + "\x1f".join(entries) if entries else None


def _return_hint(body: list[bytes]) -> str | None:
    """`call:X` / `name:X` when every `return` of an unannotated body says the same `X(...)` / `X`;
    `table:...` for a dispatch table (`_table_hint`)."""
    if any(b".get(" in raw or b"[" in raw for raw in body if b"return" in raw):
        table = _table_hint(body)
        if table is not None:
            return table
    hints: set[str] = set()
    for raw in body:
        if b"return" not in raw:
            continue
        line = raw.decode("utf-8", "replace")
        if not line.lstrip().startswith("return"):
            continue
        m = _RETURN_RE.match(line)
        if m is None:
            return None
        hints.add(("call:" if m.group(2) else "name:") + m.group(1))
    return hints.pop() if len(hints) == 1 else None


def _decorator_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    out: set[str] = set()
    for d in fn.decorator_list:
        node = d.func if isinstance(d, ast.Call) else d
        if isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.Name):
            out.add(node.id)
    return out


_LITERALS: dict[type, str] = {
    ast.Dict: "dict", ast.DictComp: "dict", ast.List: "list", ast.ListComp: "list", ast.Tuple: "tuple",
    ast.Set: "set", ast.SetComp: "set", ast.JoinedStr: "str",
}  # fmt: skip
_LITERAL_TYPES = tuple(_LITERALS)


def _op_kind(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    for d in fn.decorator_list:
        node = d.func if isinstance(d, ast.Call) else d
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        if name in ("compile_ops", "torch_compile_guard"):
            return name
        if name == "custom_op" and isinstance(d, ast.Call) and d.args:
            first = d.args[0]
            if isinstance(first, ast.Constant) and str(first.value).startswith("aiter::"):
                return "custom_op"
    return None


def _registration(call: ast.Call) -> tuple[str, tuple[str, ...]] | None:
    """`direct_register_custom_op("name", func, ...)` (or op_name=/op_func=): (name, path of func)."""
    f = call.func
    fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if fname != "direct_register_custom_op":
        return None
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    name = call.args[0] if call.args else kw.get("op_name")
    func = call.args[1] if len(call.args) > 1 else kw.get("op_func")
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)) or func is None:
        return None
    path = _attr_path(func)
    return (name.value, path) if path else None


class _Hints:
    """Return hints of unannotated functions, computed only for the functions a summary records."""

    def __init__(self, body_of: dict[int, tuple[int, int]], lines: list[bytes]) -> None:
        self.body_of, self.lines = body_of, lines

    def of(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
        if fn.returns is not None or not fn.body:
            return None
        got = self.body_of.get(fn.body[0].lineno)
        return _return_hint(self.lines[got[0] : got[1]]) if got is not None else None


def _class_info(cls: ast.ClassDef, path: str, lines: list[bytes], end: int, hint: _Hints) -> ClassInfo:
    """Methods (signatures as written), attributes and bases of a class; `end` bounds its raw text."""
    init: Signature | None = None
    members: dict[str, Member] = {}
    attrs: set[str] = set()
    ann: dict[str, str] = {}
    dynamic = False
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name in ("__getattr__", "__getattribute__"):
                dynamic = True
            decos = _decorator_names(node)
            kind: Literal["method", "static", "class", "property"] = "method"
            if "staticmethod" in decos:
                kind = "static"
            elif "classmethod" in decos:
                kind = "class"
            elif decos & {"property", "cached_property", "setter", "getter", "deleter"}:
                kind = "property"
            sig = sig_from_def(node, path, False, hint.of(node))
            if node.name == "__init__":
                init = Signature(cls.name, path, cls.lineno, sig.params[1:], sig.compiled)
            if kind == "property" and node.name in members and members[node.name].kind == "property":
                continue  # the setter of a property keeps the getter's return type
            members[node.name] = Member(kind, sig)
        elif isinstance(node, ast.ClassDef):
            attrs.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    attrs.add(t.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            attrs.add(node.target.id)
            a = _ann(node.annotation)
            if a:
                ann[node.target.id] = a
    ctors: dict[str, set[str]] = {}  # attribute -> the classes constructed into it (`self.x = C(...)`)
    local: dict[str, str] = {}  # names the class's methods import: name -> absolute dotted path
    pending: tuple[str, list[str]] | None = None  # a parenthesized `from m import (` being read
    for raw in lines[cls.lineno - 1 : end]:
        if pending is not None:
            line = raw.decode("utf-8", "replace")
            pending[1].append(line.split(")", 1)[0])
            if ")" in line:
                _learn_imports(local, pending[0], ",".join(pending[1]), path)
                pending = None
            continue
        if b"import " in raw:
            m_imp = _LOCAL_IMPORT_RE.match(raw.decode("utf-8", "replace").rstrip())
            if m_imp is not None:
                names = m_imp.group(2).strip()
                if names.startswith("(") and ")" not in names:
                    pending = (m_imp.group(1), [names[1:]])
                else:
                    _learn_imports(local, m_imp.group(1), names.strip("()"), path)
        if b"self." not in raw:
            continue
        text = raw.decode("utf-8", "replace")
        for m in _SELF_SET_RE.finditer(text):
            attrs.add(m.group(1))
            if m.group(2) and m.group(1) not in ann:
                ann[m.group(1)] = m.group(2).strip()
        for m in _SELF_CTOR_RE.finditer(text):
            ctors.setdefault(m.group(1), set()).add(m.group(2))
    for attr, a_text in list(ann.items()):  # an annotation naming a class a method imports
        if any(n in a_text for n in local):
            ann[attr] = _WORD_RE.sub(lambda m: local.get(m.group(0), m.group(0)), a_text)
    for attr, made in ctors.items():
        # Typed by its constructor when every `self.x = C(...)` names the same class (None aside).
        if attr not in ann and len(made) == 1:
            (c,) = made
            head = c.split(".", 1)[0]
            ann[attr] = local[head] + c[len(head) :] if head in local else c
    bases = tuple(_attr_path(b.value if isinstance(b, ast.Subscript) else b) for b in cls.bases)
    return ClassInfo(
        cls.name, path, cls.lineno, init, members, frozenset(attrs - set(members)), ann, bases, dynamic
    )


def _is_torch_module(base: tuple[str, ...]) -> bool:
    return base[-1] == "Module" and (len(base) == 1 or base[-2] == "nn")


def _torch_module_only(chain: list[tuple[ClassInfo, str]]) -> bool:
    """Is every base of the chain that is not an aiter class torch's `nn.Module` (and is there one)?"""
    names = {c.name for c, _ in chain}
    others = [b for c, _ in chain for b in c.bases if b is None or b[-1] not in names]
    return (
        bool(others)
        and all(b is not None and (_is_torch_module(b) or b[-1] in _HARMLESS_BASES) for b in others)
        and any(b is not None and _is_torch_module(b) for b in others)
    )


def _attr_path(node: ast.expr) -> tuple[str, ...] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return tuple(reversed(parts))
    return None


def summarize_module(data: bytes, path: str, module: str) -> ModSummary:
    is_pkg = path.endswith("__init__.py")
    s = ModSummary(module, is_pkg)
    spans = def_spans(data)
    stripped = strip_bodies(data, spans=spans) if spans is not None else None
    tree = parse_source(stripped, path) if stripped is not None else "not stripped"
    if isinstance(tree, str):
        tree = parse_source(data, path)
    if isinstance(tree, str):
        s.error = tree
        return s
    lines = spans[0] if spans is not None else data.split(b"\n")
    # Return hints of unannotated functions, by def line (bodies are stripped from the tree).
    body_of = {j + 1: (b0, k) for j, _c, b0, k in spans[1]} if spans is not None else {}
    hint = _Hints(body_of, lines)
    top = tree.body
    ends = {id(st): (top[i + 1].lineno - 1 if i + 1 < len(top) else len(lines)) for i, st in enumerate(top)}
    hook = False
    str_maps: list[dict[str, str]] = []

    def visit(stmts: list[ast.stmt]) -> None:
        nonlocal hook
        for st in stmts:
            if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef):
                if st.name in ("__getattr__", "__dir__"):
                    if st.name == "__getattr__":
                        hook = True
                    continue
                sig = sig_from_def(st, path, False, hint.of(st))
                op = _op_kind(st)
                if op is not None:
                    sig = dataclasses.replace(sig, op=op)
                s.events.append((st.name, "def", sig, st.lineno))
            elif isinstance(st, ast.ClassDef):
                end = ends.get(id(st), getattr(st, "end_lineno", None) or len(lines))
                s.events.append((st.name, "class", _class_info(st, path, lines, end, hint), st.lineno))
            elif isinstance(st, ast.ImportFrom):
                base = resolve_relative(module, is_pkg, st.level, st.module)
                if base is None:
                    continue
                for alias in st.names:
                    if alias.name == "*":
                        s.stars.append((st.lineno, base))
                        s.events.append(("*", "star", base, st.lineno))
                    else:
                        s.events.append((alias.asname or alias.name, "from", (base, alias.name), st.lineno))
            elif isinstance(st, ast.Import):
                for alias in st.names:
                    if alias.asname:
                        s.events.append((alias.asname, "module", alias.name, st.lineno))
                    else:
                        top = alias.name.split(".")[0]
                        s.events.append((top, "module", top, st.lineno))
            elif isinstance(st, ast.Assign | ast.AnnAssign):
                targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                value = st.value
                for t in targets:
                    if not isinstance(t, ast.Name):
                        continue
                    if t.id == "__all__" and isinstance(value, ast.List | ast.Tuple):
                        names = [e.value for e in value.elts if isinstance(e, ast.Constant)]
                        s.all_names = tuple(str(n) for n in names)
                        continue
                    if isinstance(value, ast.Dict):
                        pairs = [
                            (k.value, v.value)
                            for k, v in zip(value.keys, value.values, strict=True)
                            if isinstance(k, ast.Constant)
                            and isinstance(v, ast.Constant)
                            and isinstance(k.value, str)
                            and isinstance(v.value, str)
                        ]
                        if pairs and len(pairs) == len(value.keys):
                            str_maps.append(dict(pairs))
                    ap = _attr_path(value) if value is not None else None
                    if ap is not None:
                        s.events.append((t.id, "alias", ap, st.lineno))
                    elif isinstance(st, ast.AnnAssign) and _ann(st.annotation):
                        # `_TP: GroupCoordinator | None = None`: a module-level singleton slot
                        s.events.append((t.id, "inst", ("ann", _ann(st.annotation)), st.lineno))
                    elif isinstance(value, _LITERAL_TYPES):
                        s.events.append((t.id, "inst", ("ann", _LITERALS[type(value)]), st.lineno))
                    elif isinstance(value, ast.Call) and (fp := _attr_path(value.func)) is not None:
                        s.events.append((t.id, "inst", ("call", fp), st.lineno))  # `tgemm = TunedGemm()`
                    elif isinstance(value, ast.Constant) and value.value is None:
                        continue  # `f = None` fallback after a failed import: not a definition
                    else:
                        s.events.append((t.id, "value", None, st.lineno))
            elif isinstance(st, ast.If):
                visit(st.body)
                visit(st.orelse)
            elif isinstance(st, ast.Try | ast.TryStar):
                visit(st.body)
                for h in st.handlers:
                    visit(h.body)
                visit(st.orelse)
                visit(st.finalbody)
            elif isinstance(st, ast.With | ast.AsyncWith):
                visit(st.body)
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
                f = st.value.func
                reg = _registration(st.value)
                if reg is not None:
                    s.registered[reg[0]] = reg[1]
                # sys.meta_path.insert(0, finder) / globals().update(...)
                ap = _attr_path(f)
                if ap and ap[:2] == ("sys", "meta_path"):
                    hook = True
                if ap == ("globals", "update") or (
                    isinstance(f, ast.Attribute)
                    and isinstance(f.value, ast.Call)
                    and isinstance(f.value.func, ast.Name)
                    and f.value.func.id == "globals"
                ):
                    s.dynamic = True

    visit(tree.body)
    _mark_op_wrappers(s)
    if hook:
        s.dynamic = True
        for m in str_maps:
            s.compat_map.update(m)
    return s


# ---------------------------------------------------------------------------
# Resolution

_STAR_RE = re.compile(rb"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]*\*", re.M)


# A dependency of a resolution: ("e", module, exists, "") module or namespace existence,
# ("f", module, exists, "") file module existence, ("m", module, True, blob sha or "") contents.
Dep = tuple[str, str, bool, str]


@dataclass(frozen=True, slots=True)
class Target:
    """What `aiter.<path>` is at one commit."""

    # instance: an object of an aiter class; foreign: a value of a type that is not aiter's
    # (a Tensor, an int, a logging.Logger): calls on it are not calls of aiter.
    kind: Literal["func", "class", "instance", "module", "value", "foreign", "missing", "unknown"]
    sig: Signature | None = None
    module: str | None = None  # for kind == "module", or the module where it was looked up
    missing_what: str | None = None  # "function" / "module" / "method" for kind == "missing"
    # kind == "unknown" only because the module has a __getattr__ hook: `from m import *` ignores it.
    dynamic_miss: bool = False
    cls: ClassInfo | None = None  # kind == "class" / "instance"
    reason: str | None = None  # why an "unknown" cannot be resolved, for the unchecked list


# Types whose values are never aiter objects (calls on them are not calls of aiter).
_FOREIGN_ROOTS = frozenset(
    {
        "torch", "typing", "typing_extensions", "collections", "logging", "numpy", "np", "enum",
        "dataclasses", "functools", "os", "sys", "re", "abc", "math", "pathlib", "json", "threading",
        "multiprocessing", "ctypes", "contextlib", "itertools", "triton", "subprocess", "queue",
    }
)  # fmt: skip
_BUILTIN_TYPES = frozenset(
    {
        "int", "float", "str", "bool", "bytes", "list", "dict", "tuple", "set", "frozenset", "None",
        "object", "type", "List", "Dict", "Tuple", "Set", "Sequence", "Iterable", "Iterator",
        "Generator", "Mapping", "Callable", "Tensor", "dtype", "device", "Enum", "IntEnum",
    }
)  # fmt: skip
_HARMLESS_BASES = frozenset({"object", "ABC", "Generic", "Protocol"})


_CYCLE = Target("unknown", reason="(import cycle)")


def _nearest(cache: SummaryCache, tree: Tree) -> tuple[ApiIndex | None, frozenset[str] | None]:
    """The recent index of the same repository whose tree differs least, and the modules that differ.

    A changed module is one whose file changed, appeared or went away, and for the last two, every
    package above it (namespace packages exist because of their files).
    """
    best: tuple[int, ApiIndex, set[str]] | None = None
    for other in reversed(cache.recent):
        if other.tree.repo is not tree.repo and other.tree.repo.path != tree.repo.path:
            continue
        a, b = other.tree.blobs, tree.blobs
        paths = {p for p, sha in b.items() if a.get(p) != sha} | (a.keys() - b.keys())
        if best is None or len(paths) < best[0]:
            best = (len(paths), other, paths)
    if best is None:
        return None, None
    _, other, paths = best
    changed: set[str] = set()
    for p in paths:
        m = module_from_path(p)
        changed.add(m)
        if (p in tree.blobs) != (p in other.tree.blobs):
            parts = m.split(".")
            changed.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return other, frozenset(changed)


# Reasons that describe a value (the callee is that value, or a member of it), not a statement.
VALUE_REASONS = ("the result of", "attribute `", "property `", "annotated `", "annotation `")


class ApiIndex:
    """Lazy resolver of aiter names at one commit."""

    def __init__(self, tree: Tree, cache: SummaryCache, root: str = "aiter") -> None:
        self.tree = tree
        self.cache = cache
        self.root = root
        # The nearest of the last few indexes of this run (a search walks adjacent commits): its
        # resolutions are reused when no module they read changed in between.
        self._prev, self._changed = _nearest(cache, tree)
        if self._prev is not None:
            self._prev._prev = None  # keep chains short: a search builds hundreds of indexes
        self.mods: dict[str, str]
        self.namespaces: set[str]
        if self._prev is not None and self._prev.tree.blobs.keys() == tree.blobs.keys():
            self.mods, self.namespaces = self._prev.mods, self._prev.namespaces
        else:
            self.mods = module_files({p: s for p, s in tree.blobs.items() if p.split("/")[0] == root})
            # Directories without __init__.py are namespace packages: importable, no attributes of their own.
            self.namespaces = set()
            for m in self.mods:
                parts = m.split(".")
                for i in range(1, len(parts)):
                    pkg = ".".join(parts[:i])
                    if pkg not in self.mods:
                        self.namespaces.add(pkg)
        # ref -> (target, modules it read, (module, name) pairs whose text it relied on not naming it)
        self._smemo: dict[tuple[str, str, bool], tuple[bool, frozenset[Dep]]] = {}  # star checks
        self._ref_deps: dict[
            tuple[str, tuple[str, ...]], tuple[Target, frozenset[str], tuple[tuple[str, str], ...]]
        ] = {}
        self._ref_raw: dict[tuple[str, tuple[str, ...]], frozenset[Dep]] = {}  # each dependency, exactly
        recent: list[ApiIndex] = cache.recent
        recent.append(self)
        del recent[:-4]
        self._summaries: dict[str, ModSummary] = {}
        self._memo: dict[tuple[str, str], tuple[Target, frozenset[Dep]]] = {}
        self._deps: list[set[Dep]] = []  # open dependency collectors (see resolve_attr)
        self.ref_memo: dict[tuple[str, tuple[str, ...]], Target] = {}
        self._raw_read: set[str] = set()
        # Names ATOM calls as `torch.ops.aiter.<name>` (set by the checker): looked up in every aiter file.
        self.op_names: frozenset[str] = frozenset()
        self._op_files: dict[str, list[str]] | None = None
        self._ext: tuple[frozenset[str] | None] | None = None  # (names,) once read

    # -- dependencies -----------------------------------------------------
    # A resolution depends on the blobs it read and on which modules exist.
    # Results are shared between the indexes of one run (a search examines
    # hundreds of aiter commits) and reused when every dependency still holds.
    def _dep(self, d: Dep) -> None:
        if self._deps:
            self._deps[-1].add(d)

    def _has(self, dotted: str) -> bool:
        r = dotted in self.mods or dotted in self.namespaces
        self._dep(("e", dotted, r, ""))
        return r

    def _has_file(self, dotted: str) -> bool:
        r = dotted in self.mods
        self._dep(("f", dotted, r, ""))
        return r

    def _valid(self, deps: frozenset[Dep], same_text: Callable[[str], bool] | None = None) -> bool:
        """`same_text(path)`: the file is known unchanged since the commit the facts were read at. A
        "does not mention" fact then holds (the modules it star-imports are facts of their own)."""
        # Blob and existence checks first (dict look-ups); "does not mention" checks read text.
        soft = [
            (dotted, name, flag)
            for kind, dotted, flag, name in deps
            if kind == "n"
            and not (same_text is not None and dotted in self.mods and same_text(self.mods[dotted]))
        ]
        for kind, dotted, flag, sha in deps:
            if kind == "e":
                if (dotted in self.mods or dotted in self.namespaces) != flag:
                    return False
            elif kind == "f":
                if (dotted in self.mods) != flag:
                    return False
            elif kind == "x":
                return False  # read the C++ bindings: not shared between commits
            elif kind == "n":
                continue
            else:
                path = self.mods.get(dotted)
                if path is None:
                    if sha:
                        return False
                elif self.tree.blobs.get(path) != sha:
                    return False
        return all(self._star_may_export(dotted, name) == flag for dotted, name, flag in soft)

    # -- loading ----------------------------------------------------------
    def summary(self, module: str) -> ModSummary | None:
        path = self.mods.get(module)
        self._dep(("m", module, True, self.tree.blobs[path] if path else ""))
        got = self._summaries.get(module)
        if got is not None:
            return got
        if path is None:
            return None
        sha = self.tree.blobs[path]
        res = self.cache.get_many(self.tree.repo, [(path, sha)], lambda b, p: summarize_module(b, p, module))
        summ: ModSummary = res[path]
        self._summaries[module] = summ
        return summ

    def preload(self, modules: list[str]) -> None:
        pairs = [(self.mods[m], self.tree.blobs[self.mods[m]]) for m in modules if m in self.mods]
        pairs = [(p, s) for p, s in pairs if module_from_path(p) not in self._summaries]
        if not pairs:
            return
        res = self.cache.get_many(
            self.tree.repo, pairs, lambda b, p: summarize_module(b, p, module_from_path(p))
        )
        for path, summ in res.items():
            self._summaries[module_from_path(path)] = summ

    def unparseable(self) -> list[tuple[str, str]]:
        return sorted((self.mods[m], s.error) for m, s in self._summaries.items() if s.error)

    def unparseable_in(self, deps: frozenset[Dep]) -> tuple[tuple[str, str], ...]:
        """The files among a resolution's dependencies whose summaries were read and do not parse."""
        out = []
        for kind, module, _, _ in deps:
            s = self._summaries.get(module) if kind == "m" else None
            if s is not None and s.error:
                out.append((self.mods[module], s.error))
        return tuple(sorted(out))

    def raw_read(self) -> set[str]:
        """Modules whose text was searched for a name without being parsed."""
        return set(self._raw_read)

    def paths_used(self) -> set[str]:
        return {self.mods[m] for m in self._summaries if m in self.mods}

    # -- resolution -------------------------------------------------------
    def resolve_module_path(self, dotted: str) -> Target:
        """`import a.b.c`: the module, following compat aliases."""
        parts = dotted.split(".")
        if parts[0] != self.root:
            return Target("unknown")
        cur = self.root
        if not self._has(cur):
            return Target("missing", module=cur, missing_what="module")
        for p in parts[1:]:
            nxt = f"{cur}.{p}"
            if self._has(nxt):
                cur = nxt
                continue
            s = self.summary(cur)
            if s is not None and p in s.compat_map:
                alias = resolve_relative(cur, True, 1, s.compat_map[p])
                if alias and self._has_file(alias):
                    cur = alias
                    continue
            if s is not None and s.dynamic:
                return Target("unknown", module=cur)
            return Target("missing", module=nxt, missing_what="module")
        return Target("module", module=cur)

    def resolve_attr(self, module: str, name: str, depth: int = 0) -> Target:
        key = (module, name)
        got = self._memo.get(key)
        if got is not None:
            if self._deps:
                self._deps[-1].update(got[1])
            return got[0]
        shared_hits: list[tuple[frozenset[Dep], Target]] = self.cache.resolved.get(key, [])
        for deps, hit in shared_hits:
            if self._valid(deps):
                self._memo[key] = (hit, deps)
                if self._deps:
                    self._deps[-1].update(deps)
                return hit
        if depth > 40:
            return Target("unknown")
        self._memo[key] = (_CYCLE, frozenset())  # cycle guard
        self._deps.append(set())
        try:
            t = self._resolve_attr(module, name, depth)
        finally:
            deps = frozenset(self._deps.pop())
        if t.reason == _CYCLE.reason:
            del self._memo[key]  # found only through an import cycle: look again next time
            return t
        self._memo[key] = (t, deps)
        if self._deps:
            self._deps[-1].update(deps)
        shared = self.cache.resolved.setdefault(key, [])
        if len(shared) < 16:
            shared.append((deps, t))
        return t

    def _resolve_attr(self, module: str, name: str, depth: int) -> Target:
        s = self.summary(module)
        if s is None:
            sub = f"{module}.{name}"
            if self._has(module):
                if self._has(sub):
                    return Target("module", module=sub)
                return Target("missing", module=module, missing_what="function")
            return Target("unknown")
        if s.error:
            return Target("unknown", module=module)
        # Last binding in source order wins; star imports are bindings too.
        fallback: Target | None = None
        for ev_name, kind, payload, _line in reversed(s.events):
            if kind == "star":
                assert isinstance(payload, str)
                if not payload.startswith(self.root + ".") and payload != self.root:
                    ext = self._extension_names() if is_extension_module(payload) else None
                    if ext is None:
                        fallback = fallback or Target("unknown")
                    elif name in ext:
                        return Target(
                            "unknown",
                            reason=f"defined by aiter's compiled extension `{payload}` "
                            f"(bound in {EXT_SOURCES}/ C++, no Python signature)",
                        )
                    continue
                if not self._star_may_export(payload, name):
                    continue
                t = self.resolve_attr(payload, name, depth + 1)
                if t.kind == "missing" or t.dynamic_miss or t.reason == _CYCLE.reason:
                    continue  # (a module re-exporting the package's own name back to it binds it later)
                return t
            if ev_name != name:
                continue
            if kind == "def":
                assert isinstance(payload, Signature)
                return Target("func", sig=payload, module=module)
            if kind == "class":
                assert isinstance(payload, ClassInfo)
                return Target("class", sig=self._init_of(payload, module, depth), module=module, cls=payload)
            if kind == "from":
                assert isinstance(payload, tuple)
                base_mod: str = payload[0]
                orig_name: str = payload[1]
                return self._resolve_from(base_mod, orig_name, depth)
            if kind == "module":
                assert isinstance(payload, str)
                if payload.split(".")[0] in _FOREIGN_ROOTS:
                    return Target("foreign", module=module, reason=f"module `{payload}`")
                t = self.resolve_module_path(payload)
                return t if t.kind == "module" else Target("unknown")
            if kind == "inst":
                assert isinstance(payload, tuple)
                how: str = payload[0]
                if how == "ann":
                    return self._type_of(module, payload[1], depth + 1)
                t = self._resolve_path(module, payload[1], depth + 1)
                return self.attr_of(t, "()", depth + 1)
            if kind == "alias":
                ap: tuple[str, ...] = payload  # type: ignore[assignment]
                if ap[0] == name and len(ap) == 1:
                    continue
                t = self.resolve_attr(module, ap[0], depth + 1)
                for a in ap[1:]:
                    t = self.attr_of(t, a, depth + 1)
                if t.kind == "missing":
                    return Target("unknown")  # alias of something we cannot see (e.g. torch)
                return t
            if kind == "value":
                return Target("value", module=module)
        if fallback is not None:
            return fallback
        # A submodule is an attribute of its package once imported.
        sub = f"{module}.{name}"
        if self._has(sub):
            return Target("module", module=sub)
        if name in s.compat_map:
            alias = resolve_relative(module, True, 1, s.compat_map[name])
            if alias and self._has_file(alias):
                return Target("module", module=alias)
        if s.dynamic:
            return Target("unknown", module=module, dynamic_miss=True)
        return Target("missing", module=module, missing_what="function")

    def _resolve_from(self, base: str, orig: str, depth: int) -> Target:
        if base.split(".")[0] in _FOREIGN_ROOTS:
            return Target("foreign", reason=f"`{base}.{orig}`")
        if base != self.root and not base.startswith(self.root + "."):
            return Target("unknown")
        m = self.resolve_module_path(base)
        if m.kind != "module":
            return Target("unknown") if m.kind == "unknown" else m
        assert m.module is not None
        sub = f"{m.module}.{orig}"
        if self._has(sub):
            return Target("module", module=sub)  # `from . import mla`: the submodule
        return self.resolve_attr(m.module, orig, depth + 1)

    def _star_may_export(self, module: str, name: str, depth: int = 0) -> bool:
        """Can `from module import *` bind `name`? Decided on the raw text when possible.

        Most star-imported modules of aiter/__init__.py never mention the name
        looked up; neither do the modules they star-import in turn. Only a
        module that mentions it is parsed. "Does not mention" is its own kind
        of dependency ("n"): a later commit that changes the module but still
        does not mention the name keeps every resolution that relied on it.
        """
        if name.startswith("_"):
            return False
        key = (module, name, module in self._summaries)  # a parsed module answers from its summary
        got = self._smemo.get(key)
        if got is None:
            self._deps.append(set())
            try:
                found = self._star_may_export_here(module, name, depth)
            finally:
                deps = frozenset(self._deps.pop())
            got = self._smemo[key] = (found, deps)
        if self._deps:
            self._deps[-1].update(got[1])
        return got[0]

    def _star_may_export_here(self, module: str, name: str, depth: int) -> bool:
        # The same answer whether or not the module was parsed before (the order in which calls
        # are resolved must not matter): its summary when it has `__all__`, else its text.
        path = self.mods.get(module)
        s = self._summaries.get(module)
        if s is None and path is not None and self._mentions(path, "__all__"):
            s = self.summary(module)
        if s is not None and not s.error and s.all_names is not None:
            self._dep(("m", module, True, self.tree.blobs[path] if path else ""))
            return name in s.all_names
        if path is None:
            self._dep(("m", module, True, ""))
            return False
        sha = self.tree.blobs[path]
        self._raw_read.add(module)
        if self._mentions(path, name):
            self._dep(("m", module, True, sha))
            return True
        self._dep(("n", module, False, name))
        if depth < 10:
            for target in self._star_targets(module, path, sha):
                if self._star_may_export(target, name, depth + 1):
                    return True
        return False

    def _mentions(self, path: str, name: str) -> bool:
        """Does the file's text name `name` anywhere (kept per blob, across runs: a nightly check
        asks the same of the same star-imported modules, most of them unchanged)?"""
        key = (self.tree.blobs[path], path, name)
        got = self.cache.mentions.get(key)
        if got is None:
            table: dict[str, bool] | None = self.cache.data.get(f"mentions:{key[0]}")
            got = table.get(name) if table is not None else None
            if got is None:
                got = name.encode() in self._raw(key[0])
                table = table if table is not None else {}
                table[name] = got
                self.cache.data[f"mentions:{key[0]}"] = table  # (set again: saved with the new name)
                self.cache.dirty = True
            self.cache.mentions[key] = got
        return got

    def _raw(self, sha: str) -> bytes:
        raw = self.cache.raw.get(sha)
        if raw is None:
            raw = self.cache.raw[sha] = next(iter(self.tree.repo.read_blobs([sha])))[1]
        return raw

    def _star_targets(self, module: str, path: str, sha: str) -> list[str]:
        """The modules a file star-imports (kept per blob and path, across runs: a nightly check
        walks the same unchanged star-imports of aiter/__init__.py, and reading their text is
        most of the walk's cost)."""
        got: list[str] | None = self.cache.data.get(f"stars:{sha}:{path}")  # (unpickled once a run)
        if got is None:
            got = []
            for m in _STAR_RE.finditer(self._raw(sha)):
                target = resolve_relative(
                    module, path.endswith("__init__.py"), len(m.group(1)), m.group(2).decode() or None
                )
                if target:
                    got.append(target)
            self.cache.data[f"stars:{sha}:{path}"] = got
            self.cache.dirty = True
        return got

    def attr_of(self, t: Target, name: str, depth: int = 0) -> Target:
        """`t.name`, or with name "()" the result of calling `t`."""
        if depth > 40:
            return Target("unknown")
        called = name.startswith("(")  # "()", or "(KEY)": called with one literal or enum member
        if t.kind == "module":
            assert t.module is not None
            if called:
                return Target("unknown")
            return self.resolve_attr(t.module, name, depth)
        if t.kind in ("missing", "foreign"):
            return t
        if called:
            if t.kind == "class" and t.cls is not None:
                return Target("instance", module=t.module, cls=t.cls)
            if t.kind == "instance" and t.cls is not None:
                return self._call_instance(t, depth + 1)
            if t.kind == "func" and t.sig is not None:
                return self._returns(t, depth + 1, name[1:-1] or None)
            return Target("unknown", reason=t.reason)
        if t.kind in ("class", "instance") and t.cls is not None:
            return self._member(t, name, depth + 1)
        if t.kind == "unknown":
            return Target("unknown", reason=t.reason)
        return Target("unknown")

    # -- objects ----------------------------------------------------------
    def _resolve_path(self, module: str, path: tuple[str, ...], depth: int) -> Target:
        """A dotted name as the code of `module` sees it."""
        if path[0] in _BUILTIN_TYPES and not self._binds(module, path[0]):
            return Target("foreign", reason=f"`{path[0]}`")
        t = self.resolve_attr(module, path[0], depth)
        for p in path[1:]:
            t = self.attr_of(t, p, depth)
        return t

    def _binds(self, module: str, name: str) -> bool:
        s = self.summary(module)
        return s is not None and any(ev[0] == name for ev in s.events)

    def _type_of(self, module: str, ann: str, depth: int) -> Target:
        """A value annotated `ann` in `module`: an instance of an aiter class, or foreign."""
        node = _parse_annotation(ann)
        if node is None:
            return Target("unknown", reason=f"annotation `{ann}`")
        return self._type_node(module, node, ann, depth)

    def _type_node(self, module: str, node: ast.expr, ann: str, depth: int) -> Target:
        if isinstance(node, ast.Constant):
            if node.value is None:
                return Target("foreign", reason="None")
            if isinstance(node.value, str):
                return self._type_of(module, node.value, depth + 1)
        members: list[ast.expr] | None = None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            members = [node.left, node.right]
        elif isinstance(node, ast.Subscript):
            head = _attr_path(node.value)
            if head and head[-1] in ("Optional", "Union"):
                members = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
            elif head and (head[-1] in _BUILTIN_TYPES or head[0] in _FOREIGN_ROOTS):
                return Target("foreign", reason=f"`{ann}`")
            else:
                return Target("unknown", reason=f"annotation `{ann}`")
        if members is not None:
            kept = [m for m in members if not (isinstance(m, ast.Constant) and m.value is None)]
            got = [self._type_node(module, m, ann, depth + 1) for m in kept]
            aiter_objs = [g for g in got if g.kind != "foreign"]
            if not aiter_objs:
                return Target("foreign", reason=f"`{ann}`")
            return aiter_objs[0] if len(aiter_objs) == 1 else Target("unknown", reason=f"`{ann}`")
        path = _attr_path(node)
        if path is None:
            return Target("unknown", reason=f"annotation `{ann}`")
        if path[0] == self.root and len(path) > 1 and not self._binds(module, path[0]):
            # A class a method imported (`self.x = C(...)`), by its absolute path: the longest module
            # prefix is imported (an attribute `aiter.dist` may be something else than the module).
            k = next((k for k in range(len(path) - 1, 0, -1) if ".".join(path[:k]) in self.mods), 1)
            t = self.resolve_module_path(".".join(path[:k]))
            for p in path[k:]:
                t = self.attr_of(t, p, depth + 1)
        else:
            t = self._resolve_path(module, path, depth + 1)
        if t.kind == "class":
            return Target("instance", module=t.module, cls=t.cls)
        if t.kind == "foreign":
            return t
        return Target("unknown", reason=f"annotated `{ann}`")

    def _returns(self, t: Target, depth: int, key: str | None = None) -> Target:
        """What calling the function of `t` returns, from its annotation or its `return` statements
        (`key`: the call's one literal or enum-member argument, which selects from a dispatch table)."""
        assert t.sig is not None
        ret, mod = t.sig.returns, t.module or self.root
        where = f"`{t.sig.name}`"
        if ret is None:
            return Target("unknown", reason=f"the result of {where} (no return annotation)")
        if ret.startswith("table:"):
            table = dict(e.split("\x1e", 1) for e in ret[6:].split("\x1f"))
            if key is None or key not in table:
                why = (
                    "the key is not one literal or enum member"
                    if key is None
                    else f"no entry `{key}` in its table"
                )
                return Target("unknown", reason=f"the result of {where} (a dispatch table: {why})")
            if table[key] == "?":
                return Target(
                    "unknown", reason=f"the result of {where} (its entry for `{key}` is not a function)"
                )
            name, _, given = table[key].partition("+")
            got = self._resolve_path(mod, tuple(name.split(".")), depth + 1)
            if got.kind != "func" or got.sig is None:
                return Target("unknown", reason=got.reason)
            if given:  # a partial: the keywords it gives have a value (a call may still pass them)
                kws = set(given.split(","))
                params = tuple(
                    dataclasses.replace(p, has_default=True) if p.name in kws else p for p in got.sig.params
                )
                got = dataclasses.replace(got, sig=dataclasses.replace(got.sig, params=params))
            return got
        if ret.startswith("call:"):
            callee = self._resolve_path(mod, tuple(ret[5:].split(".")), depth + 1)
            got = self.attr_of(callee, "()", depth + 1)
        elif ret.startswith("name:"):
            param = next((p for p in t.sig.params if p.name == ret[5:]), None)
            if param is not None:  # `return input_`: the parameter's annotation
                if param.annotation is None:
                    return Target("unknown", reason=f"the result of {where} (type not evident)")
                got = self._type_of(mod, param.annotation, depth + 1)
            else:
                got = self._resolve_path(mod, tuple(ret[5:].split(".")), depth + 1)
        else:
            got = self._type_of(mod, ret, depth + 1)
        if got.kind in ("instance", "foreign"):
            return got
        return Target("unknown", reason=got.reason or f"the result of {where} (type not evident)")

    def _classes(self, t: Target, depth: int) -> tuple[list[tuple[ClassInfo, str]], str | None]:
        """The class and its aiter bases (depth first, left to right), and a base we cannot see."""
        assert t.cls is not None
        out: list[tuple[ClassInfo, str]] = []
        opaque: str | None = None
        todo = [(t.cls, t.module or self.root)]
        while todo and len(out) < 32:
            cls, mod = todo.pop(0)
            out.append((cls, mod))
            for b in cls.bases:
                if b is None:
                    opaque = opaque or "a computed base class"
                    continue
                if b[-1] in _HARMLESS_BASES:
                    continue
                bt = self._resolve_path(mod, b, depth + 1)
                if bt.kind == "class" and bt.cls is not None:
                    todo.append((bt.cls, bt.module or mod))
                else:
                    opaque = opaque or f"base class `{'.'.join(b)}`"
        return out, opaque

    def _call_instance(self, t: Target, depth: int) -> Target:
        """`obj(...)`: its `__call__`, or for a torch module (a base named `Module`) its `forward`."""
        chain, _ = self._classes(t, depth)
        torch_module = any(b is not None and b[-1] == "Module" for cls, _m in chain for b in cls.bases)
        for name in ("__call__", "forward") if torch_module else ("__call__",):
            for cls, mod in chain:
                m = cls.members.get(name)
                if m is not None and m.kind == "method":
                    sig = member_sig(cls, name, m, True)
                    assert sig is not None
                    return Target("func", sig=sig, module=mod)
        assert t.cls is not None
        return Target("unknown", reason=f"calling a `{t.cls.name}` object (no `__call__` we can see)")

    def _init_of(self, cls: ClassInfo, module: str, depth: int) -> Signature | None:
        if cls.init is not None or not cls.bases:
            return cls.init
        chain, _ = self._classes(Target("class", module=module, cls=cls), depth)
        for base, _mod in chain[1:]:
            if base.init is not None:
                return dataclasses.replace(base.init, name=cls.name)
        return None

    def _member(self, t: Target, name: str, depth: int) -> Target:
        via_instance = t.kind == "instance"
        chain, opaque = self._classes(t, depth)
        assert t.cls is not None
        for cls, mod in chain:
            m = cls.members.get(name)
            if m is not None:
                if m.kind == "property":
                    if not via_instance:
                        return Target("value", module=mod)
                    if m.sig.returns and not m.sig.returns.startswith(("call:", "name:")):
                        return self._type_of(mod, m.sig.returns, depth + 1)
                    return Target("unknown", reason=f"property `{cls.name}.{name}` (type not evident)")
                sig = member_sig(cls, name, m, via_instance)
                return Target("func", sig=sig, module=mod)
            if name in cls.attrs:
                ann = cls.attr_ann.get(name)
                if ann is not None:
                    got = self._type_of(mod, ann, depth + 1)
                    if got.kind != "unknown":
                        return got
                return Target("unknown", reason=f"attribute `{cls.name}.{name}` (type not evident)")
            if cls.dynamic:
                return Target("unknown", reason=f"`{cls.name}` defines __getattr__")
        if opaque is not None and via_instance and _torch_module_only(chain):
            # Not in any aiter class of the chain, whose only other base is torch's Module: one of its
            # methods or a buffer/submodule it returns (`register_buffer`, `to`, `cos_cache`), not aiter's.
            return Target("foreign", reason=f"`{t.cls.name}.{name}` from torch.nn.Module")
        if opaque is not None or name.startswith("__"):
            return Target("unknown", reason=f"`{t.cls.name}.{name}` may come from {opaque or 'object'}")
        return Target("missing", module=t.module, missing_what="method", cls=t.cls)

    def resolve_ref(self, ref: tuple[str, tuple[str, ...]]) -> Target:
        """What a reference from ATOM denotes: `(module, attribute chain with "()" for calls)`."""
        got = self.ref_memo.get(ref)
        if got is not None:
            return got
        if self._prev is not None and self._changed is not None:
            hit = self._prev._ref_deps.get(ref)
            if hit is not None and self._same_op_files(ref) and self._still_holds(ref, hit):
                self.ref_memo[ref] = hit[0]
                self._ref_deps[ref] = hit
                self._ref_raw[ref] = self._prev._ref_raw[ref]
                return hit[0]
        self._deps.append(set())
        try:
            t = self._resolve_ref(ref)
        finally:
            deps = self._deps.pop()
        self.ref_memo[ref] = t
        if not any(d[0] == "x" for d in deps):
            hard = frozenset(d[1] for d in deps if d[0] != "n")
            soft = tuple(sorted({(d[1], d[3]) for d in deps if d[0] == "n"}))
            self._ref_deps[ref] = (t, hard, soft)
            self._ref_raw[ref] = frozenset(deps)
        return t

    def _still_holds(
        self,
        ref: tuple[str, tuple[str, ...]],
        hit: tuple[Target, frozenset[str], tuple[tuple[str, str], ...]],
    ) -> bool:
        """Does the resolution `_prev` made of `ref` hold here? First by the modules that changed
        (set operations); when one of them was read, by each fact it relied on (a file added beside
        a module read changes its package's module set, but no fact the resolution read)."""
        assert self._prev is not None and self._changed is not None
        changed = self._changed
        if hit[1].isdisjoint(changed):
            return all(not self._star_may_export(m, n) for m, n in hit[2] if m in changed)
        return self._valid(self._prev._ref_raw[ref])

    def still_holds(self, deps: frozenset[Dep], same_text: Callable[[str], bool] | None = None) -> bool:
        """Does every fact a resolution made at another commit relied on hold at this one?"""
        return self._valid(deps, same_text)

    def deps_of(self, ref: tuple[str, tuple[str, ...]]) -> frozenset[Dep] | None:
        """Every fact the resolution of `ref` here relied on (None: not traced, e.g. C++ bindings)."""
        return self._ref_raw.get(ref)

    def _same_op_files(self, ref: tuple[str, tuple[str, ...]]) -> bool:
        """An op is found by the files that name it: none of them may have changed since `_prev`."""
        if ref[0] != TORCH_OPS or not ref[1]:
            return True
        assert self._prev is not None and self._changed is not None
        name = ref[1][0]
        files = {
            *self._files_mentioning_ops().get(name, []),
            *self._prev._files_mentioning_ops().get(name, []),
        }
        return not any(module_from_path(f) in self._changed for f in files)

    def _resolve_ref(self, ref: tuple[str, tuple[str, ...]]) -> Target:
        mod, attrs = ref
        if mod == TORCH_OPS:
            t = self._torch_op(attrs)
        else:
            t = self.resolve_module_path(mod)
            for i, a in enumerate(attrs):
                if t.kind == "unknown":
                    if any(x.startswith("(") for x in attrs[i + 1 :]):
                        # A call on what an unresolved call returned: the chain is listed once, at its
                        # first link that cannot be resolved.
                        t = Target("foreign", reason="derived from an unresolved aiter value")
                    elif t.reason and t.reason.startswith(VALUE_REASONS):
                        t = Target("unknown", reason=f"method or attribute of {t.reason}")
                if t.kind in ("missing", "unknown", "foreign"):
                    break
                t = self.attr_of(t, a)
            if t.kind == "instance":
                t = self.attr_of(t, CALL)  # the callee is an aiter object: its __call__ (or forward)
        return t

    def _torch_op(self, attrs: tuple[str, ...]) -> Target:
        """`torch.ops.aiter.<name>[.default]`: an op aiter registers, with the schema its wrapper infers."""
        if not attrs or attrs[1:] not in ((), ("default",)):
            return Target("unknown", reason="an attribute of a registered op")
        name = attrs[0]
        t = self.resolve((name,))
        sig = t.sig if t.kind == "func" and t.sig is not None and t.sig.op else None
        if sig is None:  # the files that name the op, in path order (not the summaries read so far:
            # the answer must not depend on which calls were bound before)
            for file in self.op_files(name):
                found = self.summary(module_from_path(file))
                if found is None:
                    continue
                reg = found.registered.get(name)
                ft = (
                    self._resolve_path(found.module, reg, 1) if reg else self.resolve_attr(found.module, name)
                )
                if ft.kind == "func" and ft.sig is not None and (reg or ft.sig.op):
                    sig = ft.sig if ft.sig.op else dataclasses.replace(ft.sig, op="custom_op")
                    t = ft
                    break
        if sig is None:
            return Target("unknown", reason="no aiter source file registers an op of this name")
        return Target("func", sig=op_signature(name, sig), module=t.module)

    def _extension_names(self) -> frozenset[str] | None:
        self._dep(("x", EXT_SOURCES, True, ""))
        if self._ext is None:
            self._ext = (extension_names(self.tree.repo, self.tree.sha, self.cache),)
        return self._ext[0]

    def op_files(self, name: str) -> tuple[str, ...]:
        """The aiter files whose text names the op `name` (one of `op_names`), in path order."""
        return tuple(sorted(self._files_mentioning_ops().get(name, ())))

    def _files_mentioning_ops(self) -> dict[str, list[str]]:
        """{op name: aiter files whose text names it}, for the names in `op_names`.

        What each blob mentions is kept in the cache (by blob SHA), so a search over many aiter
        commits reads only the blobs that changed; a cold commit is searched with one `git grep`.
        """
        if self._op_files is not None:
            return self._op_files
        names = sorted(self.op_names)
        self._op_files = {}
        if not names:
            return self._op_files
        key = "op-mentions:" + ",".join(names)
        table: dict[str, frozenset[str]] | None = self.cache.data.get(key)
        if table is None:
            table = self.cache.data[key] = self._mentions_from_before(names)
        # Only Python modules can register an op (a registration is read from the module's summary).
        blobs = self._module_blobs()
        todo = {p: b for p, b in blobs.items() if b not in table}
        ahead = self.cache.pending.pop(OPS_AHEAD, None) if todo else None
        got = ahead.get() if ahead is not None else None  # (a night's: read by a child meanwhile)
        if got is not None and set(names) <= got[0]:
            for p, b in list(todo.items()):
                if b in got[1]:
                    table[b] = frozenset(n for n in got[1][b] if n in self.op_names)
                    del todo[p]
            self.cache.data[key] = table  # (set again: a value changed in place is not saved)
            self.cache.dirty = True
        if todo:
            words = [n.encode() for n in names]
            if len(todo) > 64:  # one `git grep` of just those files, not a read of each
                pats = [x for n in names for x in ("-e", n)]
                paths = sorted(todo)
                hits: set[str] = set()
                for k in range(0, len(paths), 400):
                    res = self.tree.repo.run(
                        "grep", "-l", "-F", "-w", *pats, self.tree.sha, "--", *paths[k : k + 400]
                    )
                    hits |= {line.split(":", 1)[1] for line in res.stdout.splitlines() if ":" in line}
                for p, b in todo.items():
                    if p not in hits:
                        table[b] = frozenset()
                todo = {p: b for p, b in todo.items() if p in hits}
            for sha, data in self.tree.repo.read_blobs(sorted(set(todo.values()))):
                table[sha] = frozenset(n.decode() for n in words if says_word(data, n))  # (not one regex:
                # an alternation of two dozen names, scanned byte by byte, is 3x a search per name)
            self.cache.data[key] = table  # (set again: a value changed in place is not saved)
            self.cache.dirty = True
        for p, b in blobs.items():
            for n in table.get(b, ()):
                self._op_files.setdefault(n, []).append(p)
        return self._op_files

    def ops_unread(self) -> tuple[frozenset[str], list[str]]:
        """The op names of the newest op-mentions table kept, and the blobs here it does not cover:
        what `_files_mentioning_ops` will read if this run's ATOM calls the same ops."""
        for key in incremental.newest(self.cache.data, "op-mentions:"):
            table = self.cache.data.get(key)
            if table is not None:
                unread = set(self._module_blobs().values()) - table.keys()
                return frozenset(key[len("op-mentions:") :].split(",")), sorted(unread)
        return frozenset(), []

    def _module_blobs(self) -> dict[str, str]:
        """{path: blob} of the package's Python modules (only a module can register an op)."""
        prefix = self.root + "/"
        return {p: b for p, b in self.tree.blobs.items() if p.startswith(prefix) and p.endswith(".py")}

    def _mentions_from_before(self, names: list[str]) -> dict[str, frozenset[str]]:
        """The blobs' mentions for `names`, from the table of a wider set of names (an ATOM that
        called more ops): what each blob mentions of `names` is known there."""
        want = set(names)
        best: dict[str, frozenset[str]] | None = None
        for k in list(self.cache.data):  # (keys first: the values are unpickled when read)
            wider = isinstance(k, str) and k.startswith("op-mentions:") and want <= set(k[12:].split(","))
            v = self.cache.data.get(k) if wider else None
            if v is not None and (best is None or len(v) > len(best)):
                best = v
        if best is None:
            return {}
        return {b: frozenset(n for n in got if n in want) for b, got in best.items()}

    def resolve(self, path: tuple[str, ...]) -> Target:
        """`aiter.a.b.c` as an attribute chain from the root package."""
        t = self.resolve_module_path(self.root)
        for p in path:
            t = self.attr_of(t, p)
            if t.kind in ("missing", "unknown"):
                return t
        return t


@functools.lru_cache(maxsize=4096)
def _parse_annotation(ann: str) -> ast.expr | None:
    try:
        return ast.parse(ann, mode="eval").body
    except SyntaxError:
        return None


def module_from_path(path: str) -> str:
    from pipeline.compat.pysource import module_of

    m = module_of(path)
    return m or path


def pretty_annotation(ann: str | None) -> str:
    """`Optional[Tensor]` -> `Tensor | None`, `torch.Tensor` -> `Tensor`."""
    if not ann:
        return ""
    try:
        node = ast.parse(ann, mode="eval").body
    except SyntaxError:
        return ann
    return _pretty(node)


def _pretty(node: ast.expr) -> str:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id
        in (
            "torch",
            "typing",
            "t",
        )
    ):
        return node.attr
    if isinstance(node, ast.Subscript):
        head = _pretty(node.value)
        if head == "Optional":
            return f"{_pretty(node.slice)} | None"
        if head == "Union" and isinstance(node.slice, ast.Tuple):
            return " | ".join(_pretty(e) for e in node.slice.elts)
        return f"{head}[{_pretty(node.slice)}]"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return f"{_pretty(node.left)} | {_pretty(node.right)}"
    if isinstance(node, ast.Tuple):
        return ", ".join(_pretty(e) for e in node.elts)
    return ast.unparse(node)
