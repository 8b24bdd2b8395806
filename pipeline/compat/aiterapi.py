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
import re
from dataclasses import dataclass, field
from typing import Literal

from pipeline.compat.pysource import (
    SummaryCache,
    Tree,
    module_files,
    parse_source,
    resolve_relative,
    strip_bodies,
)

ParamKind = Literal["posonly", "pos", "vararg", "kwonly", "varkw"]


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


@dataclass(frozen=True, slots=True)
class Signature:
    name: str
    path: str
    line: int
    params: tuple[Param, ...]
    # A compiled or registered op (`@compile_ops`, `torch.library.custom_op`, ...), or a plain
    # wrapper of one defined beside it: its schema enforces the annotations. Plain Python does not.
    compiled: bool = False

    def bound_params(self) -> tuple[Param, ...]:
        return self.params

    def shape(self) -> tuple[tuple[str, str, bool, str | None], ...]:
        return tuple((p.name, p.kind, p.has_default, p.annotation) for p in self.params)


# Binding events: (name, kind, payload, line)
#  def    -> Signature
#  class  -> Signature | None (its own __init__, self dropped; None when inherited)
#  from   -> (absolute module, original name)
#  module -> absolute module
#  alias  -> tuple of names (same-module attribute path, e.g. ("f",) or ("ops", "g"))
#  value  -> None (something that is not a function we can see)
Event = tuple[str, str, object, int]


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


def sig_from_def(fn: ast.FunctionDef | ast.AsyncFunctionDef, path: str, drop_first: bool) -> Signature:
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
    return Signature(fn.name, path, fn.lineno, tuple(params), _is_op(fn))


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
    return ast.unparse(node)


def _is_staticmethod(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def _class_init(cls: ast.ClassDef, path: str) -> Signature | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "__init__":
            sig = sig_from_def(node, path, drop_first=True)
            return Signature(cls.name, path, cls.lineno, sig.params)
    return None


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
    stripped = strip_bodies(data)
    tree = parse_source(stripped, path) if stripped is not None else "not stripped"
    if isinstance(tree, str):
        tree = parse_source(data, path)
    if isinstance(tree, str):
        s.error = tree
        return s
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
                s.events.append((st.name, "def", sig_from_def(st, path, False), st.lineno))
            elif isinstance(st, ast.ClassDef):
                s.events.append((st.name, "class", _class_init(st, path), st.lineno))
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

    kind: Literal["func", "class", "module", "value", "missing", "unknown"]
    sig: Signature | None = None
    module: str | None = None  # for kind == "module", or the module where it was looked up
    missing_what: str | None = None  # "function" / "module" for kind == "missing"
    # kind == "unknown" only because the module has a __getattr__ hook: `from m import *` ignores it.
    dynamic_miss: bool = False


class ApiIndex:
    """Lazy resolver of aiter names at one commit."""

    def __init__(self, tree: Tree, cache: SummaryCache, root: str = "aiter") -> None:
        self.tree = tree
        self.cache = cache
        self.root = root
        self.mods = module_files({p: s for p, s in tree.blobs.items() if p.split("/")[0] == root})
        # Directories without __init__.py are namespace packages: importable, no attributes of their own.
        self.namespaces: set[str] = set()
        for m in self.mods:
            parts = m.split(".")
            for i in range(1, len(parts)):
                pkg = ".".join(parts[:i])
                if pkg not in self.mods:
                    self.namespaces.add(pkg)
        self._summaries: dict[str, ModSummary] = {}
        self._memo: dict[tuple[str, str], tuple[Target, frozenset[Dep]]] = {}
        self._deps: list[set[Dep]] = []  # open dependency collectors (see resolve_attr)
        self.ref_memo: dict[tuple[str, tuple[str, ...]], Target] = {}
        self._raw_read: set[str] = set()

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

    def _valid(self, deps: frozenset[Dep]) -> bool:
        for kind, dotted, flag, sha in deps:
            if kind == "e":
                if (dotted in self.mods or dotted in self.namespaces) != flag:
                    return False
            elif kind == "f":
                if (dotted in self.mods) != flag:
                    return False
            else:
                path = self.mods.get(dotted)
                if path is None:
                    if sha:
                        return False
                elif self.tree.blobs.get(path) != sha:
                    return False
        return True

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
        return [(self.mods[m], s.error) for m, s in self._summaries.items() if s.error]

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
        self._memo[key] = (Target("unknown"), frozenset())  # cycle guard
        self._deps.append(set())
        try:
            t = self._resolve_attr(module, name, depth)
        finally:
            deps = frozenset(self._deps.pop())
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
                    fallback = fallback or Target("unknown")
                    continue
                if not self._star_may_export(payload, name):
                    continue
                t = self.resolve_attr(payload, name, depth + 1)
                if t.kind == "missing" or t.dynamic_miss:
                    continue
                return t
            if ev_name != name:
                continue
            if kind == "def":
                assert isinstance(payload, Signature)
                return Target("func", sig=payload, module=module)
            if kind == "class":
                return Target("class", sig=payload if isinstance(payload, Signature) else None, module=module)
            if kind == "from":
                assert isinstance(payload, tuple)
                base_mod: str = payload[0]
                orig_name: str = payload[1]
                return self._resolve_from(base_mod, orig_name, depth)
            if kind == "module":
                assert isinstance(payload, str)
                t = self.resolve_module_path(payload)
                return t if t.kind == "module" else Target("unknown")
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
        module that mentions it is parsed.
        """
        if name.startswith("_"):
            return False
        path = self.mods.get(module)
        self._dep(("m", module, True, self.tree.blobs[path] if path else ""))
        s = self._summaries.get(module)
        if s is not None:
            return name in s.all_names if s.all_names is not None else True
        if path is None:
            return False
        sha = self.tree.blobs[path]
        memo_key = (sha, path, name)
        got = self.cache.mentions.get(memo_key)
        if got is None:
            raw = self.cache.raw.get(sha)
            if raw is None:
                raw = next(iter(self.tree.repo.read_blobs([sha])))[1]
                self.cache.raw[sha] = raw
            self._raw_read.add(module)
            if name.encode() in raw:
                got = True
            else:
                got = False
                if depth < 10:
                    for m in _STAR_RE.finditer(raw):
                        level = len(m.group(1))
                        target = resolve_relative(
                            module, path.endswith("__init__.py"), level, m.group(2).decode() or None
                        )
                        if target and self._star_may_export(target, name, depth + 1):
                            got = True
                            break
            self.cache.mentions[memo_key] = got
        else:
            self._raw_read.add(module)
        return got

    def attr_of(self, t: Target, name: str, depth: int = 0) -> Target:
        if t.kind == "module":
            assert t.module is not None
            return self.resolve_attr(t.module, name, depth)
        if t.kind == "missing":
            return t
        return Target("unknown")

    def resolve(self, path: tuple[str, ...]) -> Target:
        """`aiter.a.b.c` as an attribute chain from the root package."""
        t = self.resolve_module_path(self.root)
        for p in path:
            t = self.attr_of(t, p)
            if t.kind in ("missing", "unknown"):
                return t
        return t


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
