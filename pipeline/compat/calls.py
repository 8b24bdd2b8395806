"""Every ATOM call of an aiter function, whatever the import style.

Per file (summaries cached by blob SHA), the scanner builds name environments
the way Python scopes work: module-level imports (also inside `if`/`try`),
imports inside functions, `import aiter as a`, `from aiter.ops.x import f as g`,
`import aiter.ops.x as m`, attribute chains `aiter.ops.x.f(...)`, aliases
`g = aiter.f`, re-wrapping `f = mark_trace(f, prefix=...)` (a wrapper called
with the aiter function as its only positional argument keeps its signature),
`self.f = aiter.f` / `getattr(aiter, "f", None)` kept on an instance, and the
guards that make a missing function a warning: `hasattr(aiter, "f")`,
`getattr(aiter, "f", None)`, an import or call inside `try/except ImportError`.

A nightly check scans a changed file from its previous version's scan (`scan_file_since`): each
outermost function scanned is recorded with the digests of its text and of what its scan read
from outside it (`ScanUnit`); an unchanged one read in the same context is not parsed again.
"""

from __future__ import annotations

import ast
import bisect
import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.compat import guards
from pipeline.compat.aiterapi import CALL, TORCH_OPS, VALUE_REASONS, table_key
from pipeline.compat.guards import GuardForm, Scope
from pipeline.compat.pysource import blake2b, def_spans, parse_source, says_word, words_at
from pipeline.pickling import by_fields

if TYPE_CHECKING:
    from pipeline.compat.aiterapi import Target


ROOT = "aiter"

# A reference into aiter: (module to import, attribute chain after it).
Ref = tuple[str, tuple[str, ...]]


@by_fields
@dataclass(frozen=True, slots=True)
class Arg:
    text: str  # source text, shortened
    etype: str | None  # evident type: int/float/str/bool/None/Tensor/list/tuple/dict, or None if unknown


@by_fields
@dataclass(frozen=True, slots=True)
class SigGuard:
    """Code that runs only when a check of an aiter function's signature passes (or fails)."""

    line: int
    text: str  # the guard's test (or the statement that exits), shortened
    ref: Ref  # the aiter function whose signature is inspected
    form: GuardForm | None  # see `pipeline.compat.guards`; None: the check cannot evaluate it
    when: bool = True  # the guarded code runs when the test is true (False: when it is false)


@by_fields
@dataclass(frozen=True, slots=True)
class RawCall:
    path: str
    line: int
    col: int
    display: str  # how the call spells the callee
    ref: Ref
    args: tuple[Arg, ...]
    kwargs: tuple[tuple[str, Arg], ...]
    star_args: bool
    star_kwargs: bool
    guarded: bool
    import_line: int | None = None  # line of the import that binds the callee (for missing modules)
    end_line: int | None = None
    sig_guards: tuple[SigGuard, ...] = ()  # `inspect.signature` checks the call runs under, outermost first

    @property
    def qualname(self) -> str:
        return qualname(self.ref)


def qualname(ref: Ref) -> str:
    """`aiter.dist.parallel_state.get_tp_group().all_reduce`: how the reference reads in Python."""
    out = ref[0]
    for part in ref[1]:
        out += part if part.startswith("(") else f".{part}"
    return out


@by_fields
@dataclass(frozen=True, slots=True)
class Unchecked:
    path: str
    line: int
    display: str
    reason: str


@by_fields
@dataclass(frozen=True, slots=True)
class ScanUnit:
    """One outermost function (a module's function, a class's method) whose body was scanned: what a
    later version of the file needs to take its results instead of parsing it again (`scan_file_since`)."""

    first: int  # the `def` line
    last: int  # the body's last line (trailing blank and comment lines included)
    text: bytes  # digest of its lines, decorators included
    context: bytes  # digest of all the body's scan reads from outside those lines (`_Scanner._context`)
    names: bytes  # digest of the module bindings among those (`_Scanner.names_read`): known before a parse
    calls: tuple[int, int]  # its calls: FileCalls.calls[a:b]
    unchecked: tuple[int, int]  # FileCalls.unchecked[a:b]
    inert: bool  # sets no `self.x` a class environment takes, defines no class: can be left unparsed
    # the lines of the bindings it reads from outside (module names, `self.x`), which `context` and
    # `names` leave out: an import added above moves them, and the results are taken moved with them
    outside: tuple[tuple[str, int], ...] = ()


@by_fields
@dataclass(slots=True)
class FileCalls:
    path: str
    calls: list[RawCall] = field(default_factory=list)
    unchecked: list[Unchecked] = field(default_factory=list)
    error: str | None = None
    ops: tuple[str, ...] = ()  # ops this ATOM file registers in the `aiter` namespace itself
    units: tuple[ScanUnit, ...] = ()  # the function bodies scanned (see `scan_file_since`)


STAR_ONLY = "arguments passed only through *args/**kwargs"
_UNKNOWN = "resolved through dynamic attribute access or an unparseable module"


def atom_ops(files: list[FileCalls]) -> dict[str, str]:
    """{op name: ATOM path} for the ops ATOM registers as `torch.ops.aiter.<name>` itself."""
    return {op: fc.path for fc in files for op in fc.ops}


def unchecked_reason(call: RawCall, t: Target, ops: dict[str, str]) -> str:
    """Why a call that resolves to no signature cannot be checked (for the unchecked list)."""
    if call.ref[0] == TORCH_OPS and call.ref[1] and call.ref[1][0] in ops:
        return f"an op ATOM registers in the `aiter` namespace itself ({ops[call.ref[1][0]]}), not aiter's"
    if t.kind == "class":
        return "class whose __init__ is inherited from a class we cannot see"
    if t.kind == "value":
        return "callable object, not a function aiter defines"
    if t.kind == "instance":
        return "calling an aiter object (no static signature for its __call__)"
    if t.reason:
        if t.reason.startswith(VALUE_REASONS):
            return f"calling {t.reason}"
        return t.reason
    return _UNKNOWN


@dataclass(frozen=True, slots=True)
class NameRef:
    """What a name in ATOM's scope is bound to in aiter (`bind.Binding` is a call bound to a signature)."""

    ref: Ref
    guarded: bool
    line: int


_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException", "AttributeError"}
_TORCH_FACTORIES = {
    "empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "full_like",
    "randn", "rand", "randint", "randn_like", "rand_like", "tensor", "as_tensor", "arange",
    "empty_strided", "cat", "stack", "from_numpy", "linspace",
}  # fmt: skip
_INT_METHODS = {"size", "dim", "numel", "stride", "element_size", "nelement", "ndimension", "get_device"}


_WORD_RE = re.compile(r"[A-Za-z_]\w*")
_NOT_WRAPPERS = {"view", "to", "type", "astype", "get", "append", "add", "index", "fill_", "copy_"}


def lines_naming(text: str, names: set[str]) -> list[int]:
    """The lines (1-based, ascending) where one of `names` occurs as a whole word."""
    return sorted(names_by_line(text, names))


def names_by_line(text: str, names: set[str]) -> dict[int, list[str]]:
    """{line (1-based): the `names` occurring on it as whole words}.

    `str.find` per name rather than one regex of all of them: compiling an
    alternation of a file's hundred names costs more than the search (re compiles in Python).
    """
    found: list[tuple[int, str]] = []
    n = len(text)
    for name in names:
        if not name.isidentifier():
            continue
        at = text.find(name)
        while at >= 0:
            end = at + len(name)
            before = text[at - 1] if at else " "
            after = text[end] if end < n else " "
            if not (before.isalnum() or before == "_" or after.isalnum() or after == "_"):
                found.append((at, name))
            at = text.find(name, end)
    found.sort()
    hits: dict[int, list[str]] = {}
    line, pos = 1, 0
    for at, name in found:  # (newlines counted between hits: no table of every line's start)
        line += text.count("\n", pos, at)
        pos = at
        hits.setdefault(line, []).append(name)
    return hits


def _handler_catches_import(h: ast.ExceptHandler) -> bool:
    if h.type is None:
        return True
    names: list[ast.expr] = list(h.type.elts) if isinstance(h.type, ast.Tuple) else [h.type]
    for n in names:
        last = n.attr if isinstance(n, ast.Attribute) else n.id if isinstance(n, ast.Name) else ""
        if last in _IMPORT_ERRORS:
            return True
    return False


def _short(node: ast.AST, limit: int = 60) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # pragma: no cover - unparse of odd nodes
        return "?"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def evident_type(node: ast.expr, local_types: dict[str, str | None], env: dict[str, NameRef]) -> str | None:
    """The type of an argument when it is evident without running anything."""
    if isinstance(node, ast.Constant):
        v = node.value
        if v is None:
            return "None"
        if isinstance(v, bool):
            return "bool"
        if isinstance(v, int):
            return "int"
        if isinstance(v, float):
            return "float"
        if isinstance(v, str):
            return "str"
        if isinstance(v, bytes):
            return "bytes"
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        t = evident_type(node.operand, local_types, env)
        return t if t in ("int", "float") else None
    if isinstance(node, ast.JoinedStr):
        return "str"
    if isinstance(node, ast.List | ast.ListComp):
        return "list"
    if isinstance(node, ast.Tuple):
        return "tuple"
    if isinstance(node, ast.Dict | ast.DictComp):
        return "dict"
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "shape"
    ):
        if not isinstance(node.slice, ast.Slice):
            return "int"
        return None
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name):
            if f.id == "len":
                return "int"
            if f.id in ("int", "float", "str", "bool") and f.id not in local_types and f.id not in env:
                return f.id
            return None
        if isinstance(f, ast.Attribute):
            if f.attr in _INT_METHODS and f.attr != "size":
                return "int"
            if f.attr == "size" and len(node.args) == 1 and not node.keywords:
                return "int"
            if isinstance(f.value, ast.Name) and f.value.id == "torch" and f.attr in _TORCH_FACTORIES:
                return "Tensor"
        return None
    if isinstance(node, ast.Name):
        return local_types.get(node.id)
    return None


def _unkeyed(ref: Ref) -> Ref:
    """The reference with every call's key dropped (`f(K)` -> `f()`)."""
    return ref[0], tuple(CALL if p.startswith("(") else p for p in ref[1])


def _attr_chain(node: ast.expr, *, through_calls: bool = False) -> tuple[str, list[str]] | None:
    """`a.b.c` -> ("a", ["b", "c"]); with `through_calls`, `f(x).m` -> ("f", ["()", "m"])."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif through_calls and isinstance(node, ast.Call) and not _is_getattr(node):
            # One literal or enum-member argument is kept: it may select from a dispatch table.
            key = table_key(node.args[0]) if len(node.args) == 1 and not node.keywords else None
            parts.append(f"({key})" if key is not None else CALL)
            node = node.func
        else:
            break
    if isinstance(node, ast.Name):
        return node.id, list(reversed(parts))
    return None


def _is_getattr(node: ast.Call) -> bool:
    return isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr", "isinstance")


_GUARD_RE = re.compile(
    r"""\bhasattr\(\s*[\w.]+\s*,\s*["'](\w+)["']\s*\)|\bgetattr\(\s*[\w.]+\s*,\s*["'](\w+)["']\s*,"""
)


def _guarded_names(text: str) -> set[str]:
    """Names tested by `hasattr(x, "name")` / `getattr(x, "name", default)`: `_GUARD_RE` matched
    where its literal starts (a search with the pattern itself, led by `\\b`, is slow on big files)."""
    out: set[str] = set()
    for lit in ("hasattr(", "getattr("):
        at = text.find(lit)
        while at >= 0:
            m = _GUARD_RE.match(text, at)
            if m is not None:
                out.add(m.group(1) or m.group(2))
            at = text.find(lit, at + 1)
    return out


class _Mismatch(Exception):
    """Function bodies left unparsed are read in another context than before (their `def` lines: to be
    parsed), or the text does not allow leaving any out (no lines: scan in full)."""

    def __init__(self, lines: set[int] | None = None) -> None:
        super().__init__(sorted(lines or ()))
        self.lines = lines or set()


class _Scanner:
    def __init__(
        self,
        path: str,
        tree: ast.Module,
        text: str,
        units: dict[int, tuple[int, bytes, int]] | None = None,
        reuse: dict[int, list[ScanUnit]] | None = None,
        before: FileCalls | None = None,
    ) -> None:
        self.path = path
        self.tree = tree
        self.text = text
        self.out = FileCalls(path)
        self.guard_names: set[str] = set()
        self.hot_lines: list[int] = []
        # Inside a function: the lines mentioning a name of that function's environment.
        self.fn_hot: list[list[int]] = []
        self.fn_dicts: list[dict[str, ast.expr]] = []  # per function: dict literals spread with `**`
        self.lines = text.split("\n")
        self._line_words: list[frozenset[str] | None] = [None] * len(self.lines)
        self.has_sig = "signature" in text  # no guard of this kind can be in a file that never says it
        self.says_self = "self." in text
        self.sig_guards: list[SigGuard] = []  # the signature guards the statements being scanned run under
        # per scope: names holding what `inspect.signature(f)` gives (see `guards.value`)
        self.sig_vars: list[Scope] = []
        # Outermost functions by `def` line: (last line, digest of their lines, first decorator line).
        self.units = units or {}
        self.reached: set[int] = set()
        self.reuse = reuse or {}  # `def` line -> an earlier version's units of the same text (left unparsed)
        self.before = before
        self.units_out: list[ScanUnit] = []
        self.contributors: set[int] = set()  # `def` lines of methods that set a class environment's `self.x`
        self.line_names: dict[int, list[str]] = {}  # the hot lines' names
        self.named: set[str] = set()  # the names hot lines were looked for
        self.known_lines: tuple[set[str], dict[int, list[str]]] | None = None  # (names, their lines)
        self.mismatched: set[int] = set()  # functions left unparsed whose context changed
        self._entries: dict[str, tuple[NameRef, bytes]] = {}
        self._unknown: tuple[dict[str, NameRef], set[str], list[str]] | None = None  # outer's unlooked-for

    def _text(self, node: ast.expr, limit: int = 60) -> str:
        """An argument's source text, shortened (sliced from the line when that is exact; else unparsed)."""
        lo, hi = node.lineno, node.end_lineno
        if lo == hi and hi is not None and node.end_col_offset is not None:
            line = self.lines[lo - 1]
            if line.isascii():
                seg = line[node.col_offset : node.end_col_offset]
                if not any(c in seg for c in "'\"#\\"):
                    seg = " ".join(seg.split())
                    return seg if len(seg) <= limit else seg[: limit - 1] + "…"
        return _short(node, limit)

    def _words(self, i: int) -> frozenset[str]:
        """The identifiers on line i (1-based), computed once per line."""
        got = self._line_words[i - 1]
        if got is None:
            got = self._line_words[i - 1] = frozenset(_WORD_RE.findall(self.lines[i - 1]))
        return got

    def _compute_hot(self, names: set[str]) -> None:
        """Lines mentioning an aiter-bound name: only statements spanning one are analysed."""
        known = self.known_lines
        if known is not None and known[0] <= names:  # (the module's names: looked for before the parse)
            self.line_names = {k: list(v) for k, v in known[1].items()}
            for line, more in names_by_line(self.text, names - known[0]).items():
                self.line_names.setdefault(line, []).extend(more)
        else:
            self.line_names = names_by_line(self.text, names)
        self.hot_lines = sorted(self.line_names)
        self.named = names

    def _function_hot(self, fn: ast.AST, names: set[str]) -> list[int]:
        lo = getattr(fn, "lineno", 1)
        hi = getattr(fn, "end_lineno", None) or lo
        return self._lines_naming(names, lo, hi)

    def _lines_naming(self, names: set[str], lo: int, hi: int) -> list[int]:
        out = []
        for i in range(lo, hi + 1):
            if not self._words(i).isdisjoint(names):
                out.append(i)
        return out

    def hot(self, node: ast.AST) -> bool:
        hot_lines = self.fn_hot[-1] if self.fn_hot else self.hot_lines
        lo = getattr(node, "lineno", None)
        decos = getattr(node, "decorator_list", None)
        if decos and lo is not None:
            lo = min(lo, *(d.lineno for d in decos))
        if lo is None:
            return True
        hi: int = getattr(node, "end_lineno", None) or lo
        i = bisect.bisect_left(hot_lines, lo)
        return i < len(hot_lines) and hot_lines[i] <= hi

    # -- references -------------------------------------------------------
    def ref_of(self, node: ast.expr, env: dict[str, NameRef], cls_env: dict[str, NameRef]) -> NameRef | None:
        """The aiter reference an expression denotes, if any."""
        # getattr(aiter, "f"[, default])
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and node.func.id not in env
            and len(node.args) >= 2
        ):
            base = self.ref_of(node.args[0], env, cls_env)
            name = node.args[1]
            if base is not None and isinstance(name, ast.Constant) and isinstance(name.value, str):
                guarded = base.guarded or len(node.args) >= 3
                return NameRef((base.ref[0], (*base.ref[1], name.value)), guarded, base.line)
            return None
        chain = _attr_chain(node, through_calls=True)
        if chain is None:
            return None
        head, attrs = chain
        if head == "torch" and attrs[:2] == ["ops", ROOT] and "torch" not in env:
            return NameRef((TORCH_OPS, tuple(attrs[2:])), False, node.lineno)
        if head == "self" and attrs and attrs[0] in cls_env:
            cb = cls_env[attrs[0]]
            return NameRef((cb.ref[0], (*cb.ref[1], *attrs[1:])), cb.guarded, cb.line)
        eb = env.get(head)
        if eb is None:
            return None
        return NameRef((eb.ref[0], (*eb.ref[1], *attrs)), eb.guarded, eb.line)

    def wrapped_ref(
        self, node: ast.expr, env: dict[str, NameRef], cls_env: dict[str, NameRef]
    ) -> NameRef | None:
        """`W(f, k=v)` where `f` is an aiter function and W is not aiter's: a signature-keeping wrapper."""
        if not isinstance(node, ast.Call) or len(node.args) != 1:
            return None
        if self.ref_of(node.func, env, cls_env) is not None:
            return None
        fn = _attr_chain(node.func)
        if fn is None or fn[0] in ("functools", "partial") or fn[1][-1:] == ["partial"]:
            return None
        if fn[1] and fn[1][-1] in _NOT_WRAPPERS:
            return None  # `x.view(aiter.dtypes.fp8)`: a method taking an aiter value, not a wrapper
        return self.ref_of(node.args[0], env, cls_env)

    # -- environments ----------------------------------------------------
    def collect_env(
        self,
        stmts: list[ast.stmt],
        env: dict[str, NameRef],
        cls_env: dict[str, NameRef],
        guarded: bool,
        *,
        module_level: bool,
        shadow: set[str],
    ) -> None:
        """Add the bindings `stmts` make (not descending into nested scopes)."""
        for st in stmts:
            if isinstance(st, ast.Import):
                for a in st.names:
                    if a.name != ROOT and not a.name.startswith(ROOT + "."):
                        name = a.asname or a.name.split(".")[0]
                        env.pop(name, None)
                        continue
                    if a.asname:
                        env[a.asname] = NameRef((a.name, ()), guarded, st.lineno)
                    else:
                        env[ROOT] = NameRef((ROOT, ()), guarded, st.lineno)
                        if a.name != ROOT:
                            # `import aiter.ops.x` imports the submodule: remember it
                            # is required (a missing module is reported on the call).
                            pass
            elif isinstance(st, ast.ImportFrom):
                if st.level or not st.module or (st.module != ROOT and not st.module.startswith(ROOT + ".")):
                    for a in st.names:
                        env.pop(a.asname or a.name, None)
                    continue
                for a in st.names:
                    if a.name == "*":
                        continue
                    env[a.asname or a.name] = NameRef((st.module, (a.name,)), guarded, st.lineno)
            elif isinstance(st, ast.Assign | ast.AnnAssign):
                targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                value = st.value
                if value is None:
                    continue
                b = self.ref_of(value, env, cls_env) or self.wrapped_ref(value, env, cls_env)
                if isinstance(value, ast.IfExp):
                    # `f = getattr(aiter, "f", None) if ok else None`
                    b = self.ref_of(value.body, env, cls_env) or self.ref_of(value.orelse, env, cls_env)
                    if b is not None:
                        b = NameRef(b.ref, True, b.line)
                for t in targets:
                    if isinstance(t, ast.Name):
                        if b is not None:
                            ref = b.ref
                            old = env.get(t.id)
                            if old is not None and old.ref != ref and _unkeyed(old.ref) == _unkeyed(ref):
                                # The same name set from `f(K1)` and `f(K2)` (the environment is not
                                # flow-sensitive): which entry of a dispatch table is not known.
                                ref = _unkeyed(ref)
                            env[t.id] = NameRef(ref, b.guarded or guarded, b.line)
                        elif isinstance(value, ast.Constant) and value.value is None:
                            continue  # fallback `f = None` after a failed import
                        elif t.id in env:
                            if module_level:
                                env.pop(t.id, None)
                            else:
                                shadow.add(t.id)
            elif isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if st.name in env:
                    env.pop(st.name, None)
                shadow.add(st.name)
            elif isinstance(st, ast.If):
                self.collect_env(st.body, env, cls_env, guarded, module_level=module_level, shadow=shadow)
                self.collect_env(st.orelse, env, cls_env, guarded, module_level=module_level, shadow=shadow)
            elif isinstance(st, ast.Try | ast.TryStar):
                g = guarded or any(_handler_catches_import(h) for h in st.handlers)
                self.collect_env(st.body, env, cls_env, g, module_level=module_level, shadow=shadow)
                for h in st.handlers:
                    self.collect_env(h.body, env, cls_env, guarded, module_level=module_level, shadow=shadow)
                self.collect_env(st.orelse, env, cls_env, g, module_level=module_level, shadow=shadow)
                self.collect_env(
                    st.finalbody, env, cls_env, guarded, module_level=module_level, shadow=shadow
                )
            elif isinstance(st, ast.With | ast.AsyncWith | ast.For | ast.AsyncFor | ast.While):
                self.collect_env(st.body, env, cls_env, guarded, module_level=module_level, shadow=shadow)
                orelse = getattr(st, "orelse", [])
                self.collect_env(orelse, env, cls_env, guarded, module_level=module_level, shadow=shadow)

    # -- scanning --------------------------------------------------------
    def scan(self) -> FileCalls:
        self.guard_names |= _guarded_names(self.text)
        env: dict[str, NameRef] = {}
        self.collect_env(self.tree.body, env, {}, False, module_level=True, shadow=set())
        self._compute_hot({ROOT, *env})
        # Instance attributes bound to aiter functions make their methods hot too.
        attrs: set[str] = set()
        for node in _walk_stmts(self.tree, into_defs=True, hot=self.hot) if self._has_self_binding() else ():
            if isinstance(node, ast.ClassDef):
                self._class_envs[node] = ce = self._class_env(node, env)
                attrs.update(ce)
        if attrs:
            self._compute_hot({ROOT, *env, *attrs})
        self.sig_vars.append(self._learn_sig_vars(self.tree.body, {}) if self.has_sig else {})
        self._scan_body(self.tree.body, env, {}, {}, False)
        # A function the scan never reached is not hot, here or in any version where it still is not:
        # it gave nothing and set no class environment (the context no scan reached it in: b"").
        n, m = len(self.out.calls), len(self.out.unchecked)
        for line, (last, text, _) in self.units.items():
            if line not in self.reached:
                self.units_out.append(ScanUnit(line, last, text, b"", b"", (n, n), (m, m), True))
        if self.mismatched:
            raise _Mismatch(self.mismatched)
        self.out.units = tuple(self.units_out)
        return self.out

    _class_envs: dict[ast.ClassDef, dict[str, NameRef]]

    def _has_self_binding(self) -> bool:
        self._class_envs = {}
        return self.says_self

    def _scan_body(
        self,
        stmts: list[ast.stmt],
        env: dict[str, NameRef],
        cls_env: dict[str, NameRef],
        local_types: dict[str, str | None],
        guarded: bool,
    ) -> None:
        pushed = 0
        try:
            for st in stmts:
                self._scan_stmt(st, env, cls_env, local_types, guarded)
                g = self._exit_guard(st, env, cls_env) if self.sig_vars_any(st) else None
                if g is not None:  # the statements after it run only when it did not exit
                    self.sig_guards.append(g)
                    pushed += 1
        finally:
            del self.sig_guards[len(self.sig_guards) - pushed :]

    # -- guards built on inspect.signature(...) -------------------------------------------------
    def sig_vars_any(self, st: ast.stmt) -> bool:
        """Could `st` be a signature guard (cheap: its text says `signature` or a name derived from it)?"""
        if not self.has_sig:
            return False
        text = self._fn_text(st)
        if "signature" in text:
            return True
        scope = self.sig_vars[-1] if self.sig_vars else {}
        return any(n in text for n in scope)

    def _learn_sig_vars(self, body: list[ast.stmt], outer: Scope) -> Scope:
        """The scope's names holding what a signature gives (see `pipeline.compat.guards`), with the
        enclosing scope's that it does not assign. A plain chain: a name assigned once (or again only in
        the `except` of the `try` that assigns it: a fallback for a signature that cannot be read) keeps
        its value; assigned otherwise it is derived, not followed."""
        stores = _scope_stores(body)
        scope: Scope = {k: v for k, v in outer.items() if k not in stores}
        self.sig_vars.append(scope)
        try:
            for node in _walk_stmts_in_order(body):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, val = node.targets[0], node.value
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    target, val = node.target, node.value
                else:
                    continue
                if not isinstance(target, ast.Name):
                    continue
                sv = guards.value(val, scope)
                if sv is None:
                    continue
                others = [
                    s for s, fallback_for in stores[target.id] if s is not node and not fallback_for(node)
                ]
                scope[target.id] = sv if not others else (sv[0], None)
        finally:
            self.sig_vars.pop()
        return scope

    def _resolver(
        self, env: dict[str, NameRef], cls_env: dict[str, NameRef]
    ) -> Callable[[ast.expr], Ref | None]:
        def resolve(f: ast.expr) -> Ref | None:
            b = self.ref_of(f, env, cls_env)
            return b.ref if b is not None else None

        return resolve

    def _guard_of(
        self, test: ast.expr, env: dict[str, NameRef], cls_env: dict[str, NameRef], when: bool
    ) -> SigGuard | None:
        scope = self.sig_vars[-1] if self.sig_vars else {}
        got = guards.finalize(guards.form_of(test, scope), self._resolver(env, cls_env))
        if got is None:
            return None  # reads no signature of aiter's: not about this call's layout
        return SigGuard(test.lineno, self._text(test, 100), got[0], got[1], when)

    def _exit_guard(
        self, st: ast.stmt, env: dict[str, NameRef], cls_env: dict[str, NameRef]
    ) -> SigGuard | None:
        """`if <signature test>: return` / `try: <reads that can fail> except ...: return`: what follows
        runs only when the test passed (`names.index("x")` did not raise: "x" is a name)."""
        if isinstance(st, ast.If) and not st.orelse and _exits(st.body):
            return self._guard_of(st.test, env, cls_env, when=False)
        if not (isinstance(st, ast.Try) and any(_exits(h.body) for h in st.handlers)):
            return None
        scope = self.sig_vars[-1] if self.sig_vars else {}
        leaves: list[GuardForm] = []
        first: ast.stmt | None = None
        for x in st.body:
            if guards.derived_from(x, scope) is None:
                continue  # reads no signature (what else may raise is a runtime condition)
            sv = guards.value(x.value, scope) if isinstance(x, ast.Assign | ast.Expr) else None
            leaf = guards.raises_unless(sv) if sv is not None else None
            if leaf == guards.FREE:
                continue  # reading a signature, or deriving from it, does not fail: not a test of its layout
            f = sv[0] if sv is not None else guards.derived_from(x, scope)
            leaves.append(leaf if leaf is not None else ("leaf", f, guards.UNKNOWN))
            first = first or x
        if first is None:
            return None
        form = leaves[0] if len(leaves) == 1 else ("and", tuple(leaves))
        got = guards.finalize(form, self._resolver(env, cls_env))
        if got is None:
            return None
        return SigGuard(first.lineno, self._text_stmt(first), got[0], got[1], True)

    def _text_stmt(self, st: ast.stmt) -> str:
        line = self.lines[st.lineno - 1].strip() if st.lineno - 1 < len(self.lines) else ""
        return line if len(line) <= 100 else line[:97] + "..."

    def _scan_stmt(
        self,
        st: ast.stmt,
        env: dict[str, NameRef],
        cls_env: dict[str, NameRef],
        local_types: dict[str, str | None],
        guarded: bool,
    ) -> None:
        if not self.hot(st):
            return
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef):
            for d in st.decorator_list:
                self._scan_expr(d, env, cls_env, local_types, guarded)
            self._scan_function(st, env, cls_env)
            return
        if isinstance(st, ast.ClassDef):
            for d in [*st.decorator_list, *st.bases]:
                self._scan_expr(d, env, cls_env, local_types, guarded)
            new_cls_env = self._class_envs.get(st)
            if new_cls_env is None:
                new_cls_env = self._class_env(st, env)
            for sub in st.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    self._scan_stmt(sub, env, new_cls_env, {}, guarded)
                else:
                    self._scan_stmt(sub, env, {}, {}, guarded)
            return
        if isinstance(st, ast.If) and self.sig_vars_any(st):
            g_if = self._guard_of(st.test, env, cls_env, when=True)
            if g_if is not None:
                self._scan_expr(st.test, env, cls_env, local_types, guarded)
                for body, when in ((st.body, True), (st.orelse, False)):
                    self.sig_guards.append(dataclasses.replace(g_if, when=when))
                    try:
                        self._scan_body(body, env, cls_env, local_types, guarded)
                    finally:
                        self.sig_guards.pop()
                return
        if isinstance(st, ast.Try | ast.TryStar):
            g = guarded or any(_handler_catches_import(h) for h in st.handlers)
            self._scan_body(st.body, env, cls_env, local_types, g)
            for h in st.handlers:
                self._scan_body(h.body, env, cls_env, local_types, guarded)
            self._scan_body(st.orelse, env, cls_env, local_types, guarded)
            self._scan_body(st.finalbody, env, cls_env, local_types, guarded)
            return
        # Generic: scan expressions of this statement, then nested statement lists.
        for name, value in ast.iter_fields(st):
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    self._scan_body(value, env, cls_env, local_types, guarded)
                else:
                    for v in value:
                        if isinstance(v, ast.expr):
                            self._scan_expr(v, env, cls_env, local_types, guarded)
                        elif isinstance(v, ast.AST) and not isinstance(v, ast.stmt):
                            for child in ast.iter_child_nodes(v):
                                if isinstance(child, ast.expr):
                                    self._scan_expr(child, env, cls_env, local_types, guarded)
                                elif isinstance(child, ast.stmt):
                                    self._scan_stmt(child, env, cls_env, local_types, guarded)
            elif isinstance(value, ast.expr):
                self._scan_expr(value, env, cls_env, local_types, guarded)
            del name

    def _class_env(self, cls: ast.ClassDef, env: dict[str, NameRef]) -> dict[str, NameRef]:
        """`self.x = <aiter function>` anywhere in the class's methods."""
        out: dict[str, NameRef] = {}
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or not self.hot(fn):
                continue
            fenv = dict(env)
            self.collect_env(fn.body, fenv, {}, False, module_level=False, shadow=set())
            for node in _walk_stmts(fn, into_defs=True):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    t = node.targets[0]
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                    ):
                        v = node.value
                        b = self.ref_of(v, fenv, {}) or self.wrapped_ref(v, fenv, {})
                        if b is None and isinstance(v, ast.IfExp):
                            b = self.ref_of(v.body, fenv, {}) or self.ref_of(v.orelse, fenv, {})
                            if b is not None:
                                b = NameRef(b.ref, True, b.line)
                        if b is not None:
                            old = out.get(t.attr)
                            if old is not None and old.ref != b.ref and _unkeyed(old.ref) == _unkeyed(b.ref):
                                b = NameRef(_unkeyed(b.ref), b.guarded, b.line)  # set from two table keys
                            out[t.attr] = b
                            self.contributors.add(fn.lineno)
        return out

    def _constant_dict(self, node: ast.expr) -> list[tuple[str, ast.expr]] | None:
        """`**{"k": v}`, `**dict(k=v)` or `**params` (a local dict literal never changed): its items."""
        if isinstance(node, ast.Name) and self.fn_dicts:
            got = self.fn_dicts[-1].get(node.id)
            if got is None:
                return None
            node = got
        if isinstance(node, ast.Dict):
            items: list[tuple[str, ast.expr]] = []
            for k, v in zip(node.keys, node.values, strict=True):
                if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                    return None
                items.append((k.value, v))
            return items
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "dict"
            and not node.args
            and all(k.arg is not None for k in node.keywords)
        ):
            return [(str(k.arg), k.value) for k in node.keywords]
        return None

    def _dict_literals(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, ast.expr]:
        """Names assigned once to a dict literal and only ever used as `**name`."""
        assigned: dict[str, list[ast.expr]] = {}
        loads: list[ast.Name] = []
        spread: set[int] = set()
        for node in _walk_scope(fn):
            if isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load):
                    loads.append(node)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    for n in _names_in_target(t):
                        assigned.setdefault(n, []).append(node.value)
            elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
                assigned.setdefault(node.target.id, []).extend([ast.Constant(None), ast.Constant(None)])
            elif isinstance(node, ast.Call):
                spread.update(
                    id(k.value) for k in node.keywords if k.arg is None and isinstance(k.value, ast.Name)
                )
        cands = {
            n: vs[0]
            for n, vs in assigned.items()
            if len(vs) == 1 and not isinstance(vs[0], ast.Name) and self._constant_dict(vs[0]) is not None
        }
        for name in loads:
            if name.id in cands and id(name) not in spread:
                cands.pop(name.id)  # read, changed or passed on: its keys may not be the literal's
        a = fn.args
        for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            if p is not None:
                cands.pop(p.arg, None)
        return cands

    def _scan_function(
        self,
        fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
        outer: dict[str, NameRef],
        cls_env: dict[str, NameRef],
    ) -> None:
        unit = None if self.fn_hot or isinstance(fn, ast.Lambda) else self.units.get(fn.lineno)
        if unit is None or isinstance(fn, ast.Lambda):
            self._scan_function_body(fn, outer, cls_env)
            return
        context = said = None
        outside: tuple[tuple[str, int], ...] = ()
        if min([fn.lineno, *(d.lineno for d in fn.decorator_list)]) == unit[2]:
            with contextlib.suppress(_Unstable):
                context, said, outside = self._context(outer, cls_env, unit)
        earlier = self.reuse.get(fn.lineno)
        got = moves = None
        if earlier is not None and context is not None and self.before is not None:
            got = next((u for u in earlier if u.context == context), None)
            moves = _moves(got.outside, outside) if got is not None else None
        if earlier is not None and moves is None:
            self.mismatched.add(fn.lineno)  # (to be parsed: the caller scans again)
            return
        if context is None or said is None:  # (a decorator above the ones its text holds; an unstable value)
            self.reached.add(fn.lineno)  # (scanned, and not a unit: never left unparsed)
            self._scan_function_body(fn, outer, cls_env)
            return
        c0, u0 = len(self.out.calls), len(self.out.unchecked)
        if got is not None and self.before is not None:  # left unparsed: the earlier results, moved
            assert moves is not None
            self._take(got, self.before, fn.lineno - got.first, moves)
            inert = got.inert
        else:
            self._scan_function_body(fn, outer, cls_env)
            inert = fn.lineno not in self.contributors and not any(
                isinstance(n, ast.ClassDef) for n in _walk_stmts(fn, into_defs=True)
            )
        calls, unchecked = (c0, len(self.out.calls)), (u0, len(self.out.unchecked))
        self.units_out.append(
            ScanUnit(fn.lineno, unit[0], unit[1], context, said, calls, unchecked, inert, outside)
        )
        self.reached.add(fn.lineno)

    def _context(
        self, outer: dict[str, NameRef], cls_env: dict[str, NameRef], unit: tuple[int, bytes, int]
    ) -> tuple[bytes, bytes, tuple[tuple[str, int], ...]]:
        """Digest of everything the scan of a function's lines reads from outside them: the bindings
        of the module's names it says and of the class's `self.x` it says, the guard names among
        them, the signature variables it says, the enclosing signature guards. (Every read of a
        scope is by a name in the function's text; a name said is a superset of a name read.)
        The bindings' lines are left out: they come back apart (`ScanUnit.outside`)."""
        lo, hi = unit[2], unit[0]
        text = "\n".join(self.lines[lo - 1 : hi])
        names, said = self.names_read(outer, lo, hi)
        attrs = sorted(n for n in cls_env if n in text)
        refs = [outer[n] for n in names] + [cls_env[n] for n in attrs]
        parts = {p for r in refs for p in (*r.ref[0].split("."), *r.ref[1])}
        scope = self.sig_vars[-1] if self.sig_vars else {}
        h = blake2b(digest_size=16)
        h.update(b"%d%d" % (self.has_sig, self.says_self))
        h.update(_stable(sorted(g for g in self.guard_names if g in parts or g in text)).encode())
        h.update(said)
        for n in attrs:
            h.update(self._entry(n, cls_env[n], "self."))
        h.update(_stable({n: v for n, v in scope.items() if n in text}).encode())
        h.update(_stable(tuple(self.sig_guards)).encode())
        outside = (*((n, outer[n].line) for n in names), *(("self." + n, cls_env[n].line) for n in attrs))
        return h.digest(), said, outside

    def names_read(self, outer: dict[str, NameRef], lo: int, hi: int) -> tuple[list[str], bytes]:
        """The module's names lines lo..hi say (as words), and the digest of their bindings."""
        used: set[str] = set()
        hot = self.hot_lines
        for line in hot[bisect.bisect_left(hot, lo) : bisect.bisect_right(hot, hi)]:
            used.update(self.line_names[line])
        if self._unknown is None or self._unknown[0] is not outer or self._unknown[1] is not self.named:
            self._unknown = (outer, self.named, [n for n in outer if n not in self.named])  # (none, usually)
        unknown = self._unknown[2]
        names = sorted({n for n in used if n in outer}.union(unknown))
        h = blake2b(digest_size=16)
        for n in names:
            h.update(self._entry(n, outer[n]))
        return names, h.digest()

    def _entry(self, name: str, ref: NameRef, scope: str = "") -> bytes:
        """`_stable((name, ref))` of a binding, once per run (every function reads the module's)."""
        got = self._entries.get(scope + name)
        if got is not None and got[0] is ref:
            return got[1]
        b = _stable((scope + name, ref.ref, ref.guarded)).encode()  # (not its line: `ScanUnit.outside`)
        self._entries[scope + name] = (ref, b)
        return b

    def _take(self, unit: ScanUnit, before: FileCalls, delta: int, moves: dict[int, int]) -> None:
        """An earlier scan's results for a function whose lines moved by `delta`: every line inside it
        moves with it; a line outside moves as the binding on it did (`moves`: an import), or is in
        the context, unchanged (an enclosing guard)."""
        lo, hi = unit.first, unit.last

        def moved(n: int) -> int:
            return n + delta if lo <= n <= hi else moves.get(n, n)

        for c in before.calls[unit.calls[0] : unit.calls[1]]:
            if delta or moves:
                c = dataclasses.replace(
                    c,
                    line=moved(c.line),
                    end_line=None if c.end_line is None else moved(c.end_line),
                    import_line=None if c.import_line is None else moved(c.import_line),
                    sig_guards=tuple(dataclasses.replace(g, line=moved(g.line)) for g in c.sig_guards),
                )
            self.out.calls.append(c)
        for u in before.unchecked[unit.unchecked[0] : unit.unchecked[1]]:
            self.out.unchecked.append(dataclasses.replace(u, line=moved(u.line)) if delta or moves else u)

    def _scan_function_body(
        self,
        fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
        outer: dict[str, NameRef],
        cls_env: dict[str, NameRef],
    ) -> None:
        env = dict(outer)
        a = fn.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
        if a.vararg:
            params.append(a.vararg)
        if a.kwarg:
            params.append(a.kwarg)
        for p in params:
            env.pop(p.arg, None)
        for d in [*a.defaults, *(x for x in a.kw_defaults if x is not None)]:
            self._scan_expr(d, outer, cls_env, {}, False)
        if isinstance(fn, ast.Lambda):
            self._scan_expr(fn.body, env, cls_env, {}, False)
            return
        shadow: set[str] = set()
        self.collect_env(fn.body, env, cls_env, False, module_level=False, shadow=shadow)
        # Any other local assignment of a name shadows the module-level binding.
        local_types = self._local_types(fn, env)
        for name in shadow:
            env.pop(name, None)
        for name in local_types:
            if name in env and name not in self._aiter_assigned(fn, env, cls_env):
                env.pop(name, None)
        self.fn_hot.append(self._function_hot(fn, {ROOT, *env, *cls_env}))
        self.fn_dicts.append(self._dict_literals(fn) if _may_spread_a_local_dict(self._fn_text(fn)) else {})
        # A nested function sees the enclosing scope's names (the guards it runs under are inherited).
        outer_vars = self.sig_vars[-1] if self.sig_vars else {}
        text = self._fn_text(fn) if self.has_sig else ""
        learn = "signature" in text or any(n in text for n in outer_vars)
        self.sig_vars.append(self._learn_sig_vars(fn.body, outer_vars) if learn else outer_vars)
        try:
            self._scan_body(fn.body, env, cls_env, local_types, False)
        finally:
            self.fn_hot.pop()
            self.fn_dicts.pop()
            self.sig_vars.pop()

    def _fn_text(self, fn: ast.AST) -> str:
        lo = getattr(fn, "lineno", 1)
        hi = getattr(fn, "end_lineno", None) or lo
        return "\n".join(self.lines[lo - 1 : hi])

    def _aiter_assigned(
        self, fn: ast.FunctionDef | ast.AsyncFunctionDef, env: dict[str, NameRef], cls_env: dict[str, NameRef]
    ) -> set[str]:
        out: set[str] = set()
        for node in _walk_stmts(fn):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and (self.ref_of(node.value, env, cls_env) or self.wrapped_ref(node.value, env, cls_env))
            ):
                out.add(node.targets[0].id)
        return out

    def _local_types(
        self, fn: ast.FunctionDef | ast.AsyncFunctionDef, env: dict[str, NameRef]
    ) -> dict[str, str | None]:
        """Names assigned in the function; the evident type when all assignments agree."""
        seen: dict[str, list[ast.expr | None]] = {}
        for node in _walk_stmts(fn):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for n in _names_in_target(t):
                        seen.setdefault(n, []).append(node.value if isinstance(t, ast.Name) else None)
            elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor):
                for n in _names_in_target(node.target):
                    seen.setdefault(n, []).append(None)
            elif isinstance(node, ast.With | ast.AsyncWith):
                for item in node.items:
                    if item.optional_vars is not None:
                        for n in _names_in_target(item.optional_vars):
                            seen.setdefault(n, []).append(None)
            elif isinstance(node, ast.Try | ast.TryStar):
                for h in node.handlers:
                    if h.name:
                        seen.setdefault(h.name, []).append(None)
            elif isinstance(node, ast.Global | ast.Nonlocal):
                for n in node.names:
                    seen.setdefault(n, []).append(None)
        a = fn.args
        for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
            seen.setdefault(p.arg, []).append(None)
        out: dict[str, str | None] = {}
        for name, values in seen.items():
            types = {evident_type(v, {}, env) if v is not None else None for v in values}
            out[name] = types.pop() if len(types) == 1 else None
        return out

    def _scan_expr(
        self,
        node: ast.expr,
        env: dict[str, NameRef],
        cls_env: dict[str, NameRef],
        local_types: dict[str, str | None],
        guarded: bool,
    ) -> None:
        stack: list[ast.AST] = [node]
        while stack:
            n = stack.pop()
            if isinstance(n, ast.Lambda):
                self._scan_function(n, env, cls_env)
                continue
            if isinstance(n, ast.Call):
                self._call(n, env, cls_env, local_types, guarded)
            stack.extend(ast.iter_child_nodes(n))

    def _call(
        self,
        node: ast.Call,
        env: dict[str, NameRef],
        cls_env: dict[str, NameRef],
        local_types: dict[str, str | None],
        guarded: bool,
    ) -> None:
        f = node.func
        display = self._text(f, 80)
        # getattr(aiter, name)(...) with a non-constant name: dynamic.
        if (
            isinstance(f, ast.Call)
            and isinstance(f.func, ast.Name)
            and f.func.id == "getattr"
            and len(f.args) >= 2
            and not (isinstance(f.args[1], ast.Constant) and isinstance(f.args[1].value, str))
            and self.ref_of(f.args[0], env, cls_env) is not None
        ):
            self.out.unchecked.append(Unchecked(self.path, node.lineno, display, "dynamic getattr on aiter"))
            return
        b = self.ref_of(f, env, cls_env)
        if b is None:
            return
        if not b.ref[1] and b.ref[0] in (ROOT, TORCH_OPS):
            return  # calling the package itself: not a function call
        args: list[Arg] = []
        star_args = star_kwargs = False
        for a in node.args:
            if isinstance(a, ast.Starred):
                v = a.value
                if (
                    not star_args
                    and isinstance(v, ast.List | ast.Tuple)
                    and not any(isinstance(e, ast.Starred) for e in v.elts)
                ):
                    # `*(x, y)`: as good as writing them out
                    args.extend(Arg(self._text(e), evident_type(e, local_types, env)) for e in v.elts)
                    continue
                star_args = True  # later positionals land at positions we cannot know
                continue
            if not star_args:
                args.append(Arg(self._text(a), evident_type(a, local_types, env)))
        kwargs: list[tuple[str, Arg]] = []
        for k in node.keywords:
            if k.arg is not None:
                kwargs.append((k.arg, Arg(self._text(k.value), evident_type(k.value, local_types, env))))
                continue
            items = self._constant_dict(k.value)
            if items is None:
                star_kwargs = True
                continue
            kwargs.extend((key, Arg(self._text(v), evident_type(v, local_types, env))) for key, v in items)
        name = (b.ref[1][-1:] or (b.ref[0].rsplit(".", 1)[-1],))[0]
        self.out.calls.append(
            RawCall(
                path=self.path,
                line=node.lineno,
                end_line=node.end_lineno,
                col=node.col_offset + 1,
                display=display,
                ref=b.ref,
                args=tuple(args),
                kwargs=tuple(kwargs),
                star_args=star_args,
                star_kwargs=star_kwargs,
                guarded=guarded or b.guarded or name in self.guard_names,
                import_line=b.line,
                sig_guards=tuple(self.sig_guards),
            )
        )


def _names_in_target(t: ast.expr) -> list[str]:
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, ast.Tuple | ast.List):
        out: list[str] = []
        for e in t.elts:
            out.extend(_names_in_target(e))
        return out
    if isinstance(t, ast.Starred):
        return _names_in_target(t.value)
    return []


def _bound_names(st: ast.stmt) -> list[str]:
    """The names a statement itself binds (not those of the statements nested in it)."""
    if isinstance(st, ast.Assign):
        return [n for t in st.targets for n in _names_in_target(t)]
    if isinstance(st, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor):
        return _names_in_target(st.target)
    if isinstance(st, ast.With | ast.AsyncWith):
        return [n for i in st.items if i.optional_vars is not None for n in _names_in_target(i.optional_vars)]
    if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [st.name]
    if isinstance(st, ast.Import | ast.ImportFrom):
        return [a.asname or a.name.split(".")[0] for a in st.names]
    if isinstance(st, ast.Global | ast.Nonlocal):
        return list(st.names)
    return []


StoreSite = tuple[ast.stmt, Callable[[ast.stmt], bool]]


def _scope_stores(body: list[ast.stmt]) -> dict[str, list[StoreSite]]:
    """Every statement of a scope that binds a name (nested definitions not entered), each with a test:
    does it sit in an `except` of a `try` whose body holds a given statement (a fallback for it)?"""
    out: dict[str, list[StoreSite]] = {}

    def fallback(trys: tuple[ast.Try | ast.TryStar, ...]) -> Callable[[ast.stmt], bool]:
        return lambda node: any(node is x for t in trys for b in t.body for x in ast.walk(b))

    def visit(stmts: list[ast.stmt], trys: tuple[ast.Try | ast.TryStar, ...]) -> None:
        for st in stmts:
            for n in _bound_names(st):
                out.setdefault(n, []).append((st, fallback(trys)))
            if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if isinstance(st, ast.Try | ast.TryStar):
                visit(st.body, trys)
                for h in st.handlers:
                    if h.name:
                        out.setdefault(h.name, []).append((st, fallback(trys)))
                    visit(h.body, (*trys, st))
                visit(st.orelse, trys)
                visit(st.finalbody, trys)
                continue
            for fname in ("body", "orelse", "finalbody"):
                sub = getattr(st, fname, None)
                if isinstance(sub, list):
                    visit(sub, trys)
            if isinstance(st, ast.Match):
                for c in st.cases:
                    visit(c.body, trys)

    visit(body, ())
    return out


def _walk_stmts(
    node: ast.AST, *, into_defs: bool = False, hot: Callable[[ast.AST], bool] | None = None
) -> Iterator[ast.stmt]:
    """Statements under `node` (not expressions): cheap, and enough to see assignments.

    Nested functions and classes are yielded but not entered unless `into_defs`.
    """
    stack: list[ast.stmt] = list(reversed(getattr(node, "body", [])))
    while stack:
        st = stack.pop()
        if hot is not None and not hot(st):
            continue
        yield st
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and not into_defs:
            continue
        for fname in ("body", "orelse", "finalbody"):
            sub = getattr(st, fname, None)
            if sub:
                stack.extend(reversed(sub))
        if isinstance(st, ast.Try | ast.TryStar):
            for h in st.handlers:
                stack.extend(reversed(h.body))
        elif isinstance(st, ast.Match):
            for c in st.cases:
                stack.extend(reversed(c.body))


_SPREAD_RE = re.compile(r"\*\*\s*([A-Za-z_]\w*)")


def _may_spread_a_local_dict(text: str) -> bool:
    """Whether a function's text passes `**name` for a `name` it assigns a dict literal to.

    A text test before `_dict_literals` walks the whole body: most functions never do.
    """
    if "**" not in text:
        return False
    for name in set(_SPREAD_RE.findall(text)):
        if re.search(rf"\b{name}\s*(?::[^=\n]*)?=\s*\(?\s*(?:\{{|dict\s*\()", text):
            return True
    return False


def _walk_scope(fn: ast.AST) -> list[ast.AST]:
    """Nodes of a function body, not descending into nested functions/classes."""
    out: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        n = stack.pop()
        out.append(n)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        stack.extend(ast.iter_child_nodes(n))
    return out


_IMPORTS_AITER = re.compile(
    rb"^[ \t]*(?:from[ \t]+aiter[\w.]*[ \t]+import"
    rb"|import[ \t]+(?:[\w.]+(?:[ \t]+as[ \t]+\w+)?[ \t]*,[ \t]*)*aiter\b)",
    re.M,
)
_SELF_ATTR_RE = re.compile(rb"self\.(\w+)\s*=(?!=)(?=([^\n]*(?:\n[^\n]*){0,2}))")


_WORDS_RE = re.compile(rb"\w+")  # (bytes: ASCII word characters, those of `pysource.WORD_BYTES`)
_CALL_TAIL_RE = re.compile(rb"(?:\s*\.\s*\w+)*\s*\(")  # after a name: `(`, or `.m(`, `.a.m(` ...
_SPACE = frozenset(b" \t\r\n\f\v")
_PASSING = frozenset(b"=(,")


def _may_call(body: bytes, bound: set[bytes]) -> bool:
    """Can this function body call aiter? It says `aiter`, or calls / aliases / passes on a name
    bound to aiter (`f(`, `m.f(`, `= f`, `(f,` ...). Plain attribute reads (`dtypes.fp8`) are not calls.

    A search per name, not one regex of all of them: compiling an alternation of a file's
    names cost more than the whole search (re compiles in Python).
    """
    if says_word(body, b"aiter"):
        return True
    for name in bound:
        if name not in body:
            continue
        for at, end in words_at(body, name):
            if _CALL_TAIL_RE.match(body, end):
                return True
            k = at - 1
            while k >= 0 and body[k] in _SPACE:
                k -= 1
            if k >= 0 and body[k] in _PASSING:
                return True
    return False


def worth_scanning(data: bytes) -> bool:
    """Can this file call aiter or register an op? (Most of ATOM cannot: skipped unread.)"""
    return b"aiter" in data or b"_op(" in data or b"torch_compile_guard" in data


def _exits(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], ast.Return | ast.Raise)


def _walk_stmts_in_order(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements in source order, into compound statements but not into nested definitions."""
    for st in body:
        yield st
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for name in ("body", "orelse", "finalbody", "handlers"):
            sub = getattr(st, name, None)
            if isinstance(sub, list):
                for x in sub:
                    if isinstance(x, ast.ExceptHandler):
                        yield from _walk_stmts_in_order(x.body)
                    elif isinstance(x, ast.stmt):
                        yield from _walk_stmts_in_order([x])


def scan_file(data: bytes, path: str) -> FileCalls:
    """Calls of aiter in one ATOM file, and the ops it registers in the `aiter` namespace."""
    return _with_ops(_scan_file(data, path), data)


def scan_file_since(data: bytes, path: str, before: FileCalls) -> FileCalls:
    """`scan_file(data, path)`, re-scanning only the functions that changed since `before` (a scan of
    an earlier version of the same path): a night's commits change a few functions of 200 KB files.

    A function whose lines are those of one `before` scanned (`ScanUnit.text`) and that sets no class
    environment (`ScanUnit.inert`) is left out of the parse: its body becomes one `...` on its last
    line, so every extent the scan reads stays as it is. Where the scan reaches it, the context
    it is read in (`_Scanner._context`) must be the one `before` recorded, and its results are
    `before`'s, with the lines inside it moved; any other context means a scan in full.
    """
    exclude: set[int] = set()
    for _ in range(3) if before.units and before.path == path else ():
        try:
            return _with_ops(_scan_file(data, path, before, exclude), data)
        except _Mismatch as e:
            if not e.lines:
                break
            exclude |= e.lines  # (parsed the next time: a context changed, an import, a guard)
    return scan_file(data, path)


def _with_ops(out: FileCalls, data: bytes) -> FileCalls:
    if b"direct_register_custom_op" in data or b"torch_compile_guard" in data or b"_op(" in data:
        text = data.decode("utf-8", "replace")
        out.ops = tuple(sorted({m.group(1) or m.group(2) for m in _REGISTERS_RE.finditer(text)}))
    return out


def _scan_file(
    data: bytes, path: str, before: FileCalls | None = None, exclude: set[int] | None = None
) -> FileCalls:
    """Calls of aiter in one ATOM file (a file that never says `aiter` is skipped unparsed).

    Speed: the module skeleton (all function bodies stripped, line numbers
    kept) is parsed first to learn the names bound to aiter; then only the
    bodies that mention one of them (or `aiter`, or an instance attribute set
    from one) are parsed. A body that mentions none cannot call aiter.
    With `before`, the bodies it scanned that are unchanged are not parsed either, but those
    on the `def` lines `exclude`d (`scan_file_since`); raises `_Mismatch` when that cannot be done
    exactly.
    """
    if ROOT.encode() not in data or (not _IMPORTS_AITER.search(data) and b"torch.ops.aiter" not in data):
        return FileCalls(path)  # says `aiter` (rocm_aiter, torch.ops.aiter, ...) but never imports it
    text = data.decode("utf-8", "replace")
    tree: ast.Module | str | None = None
    units: dict[int, tuple[int, bytes, int]] = {}
    reuse: dict[int, list[ScanUnit]] = {}
    skel: _Scanner | None = None
    spans = def_spans(data)
    skeleton = _strip(spans[0], spans[1], set(), {}) if spans is not None else None
    if spans is not None and skeleton is not None:
        sk = parse_source(skeleton, path)
        if isinstance(sk, ast.Module):
            env: dict[str, NameRef] = {}
            skel = _Scanner(path, sk, text)
            skel.collect_env(sk.body, env, {}, False, module_level=True, shadow=set())
            bound = {n.encode() for n in (ROOT, *env)}
            bound |= {  # (`self.x = <a bound name ...>`: its words, each a `says_word` of it)
                m.group(1)
                for m in _SELF_ATTR_RE.finditer(data)
                if not bound.isdisjoint(_WORDS_RE.findall(m.group(2)))
            }
            lines, defs = spans
            kept: set[int] = set()
            stand_ins: dict[int, tuple[int, bytes]] = {}
            expect: dict[int, int] = {}
            earlier: dict[bytes, list[ScanUnit]] = {}
            for u in before.units if before is not None else ():
                if u.inert:
                    earlier.setdefault(u.text, []).append(u)
            # (a lone carriage return ends a line for Python, not for these lines: no units then)
            lined = b"\r" not in data or data.count(b"\r") == data.count(b"\r\n")
            if before is not None and not lined:
                raise _Mismatch()
            for x in _outermost(defs):
                j, _, b0, k = defs[x]
                if not _may_call(b"\n".join(lines[b0:k]), bound):
                    continue
                kept.add(x)
                i = _def_line(lines, j) if lined else None
                if i is None:
                    continue
                d = _decorated_from(lines, i)
                digest = blake2b(b"\n".join(lines[d:k]), digest_size=16).digest()
                units[i + 1] = (k, digest, d + 1)
                same = earlier.get(digest)
                if same and i + 1 not in (exclude or ()):
                    if not skel.named:
                        skel._compute_hot({ROOT, *env})
                    said = skel.names_read(env, d + 1, k)[1]  # (a binding it reads changed: parse it)
                    same = [u for u in same if u.names in (said, b"")]
                stand_in = _stand_in(lines, i, b0, k) if same else None
                if same and stand_in is not None and i + 1 not in (exclude or ()):
                    stand_ins[x] = stand_in
                    reuse[i + 1] = same
                    expect[i + 1] = stand_in[0] + 1
            tree = parse_source(_strip(lines, defs, kept, stand_ins), path)
            if before is not None and not (isinstance(tree, ast.Module) and _stood_in(tree, expect)):
                raise _Mismatch()  # (a body left out changed how the rest parses: scan in full)
    if not isinstance(tree, ast.Module):
        if before is not None:
            raise _Mismatch()
        tree, units = parse_source(data, path), {}
    if isinstance(tree, str):
        return FileCalls(path, error=tree)
    scanner = _Scanner(path, tree, text, units, reuse, before)
    if skel is not None and skel.named:
        scanner.known_lines = (skel.named, skel.line_names)
    return scanner.scan()


def _outermost(defs: list[tuple[int, int, int, int]]) -> list[int]:
    """The functions not nested in another's body (as `strip_bodies` decides them)."""
    out: list[int] = []
    covered = -1
    for x, (j, _, _, k) in enumerate(defs):
        if j < covered:
            continue
        out.append(x)
        covered = k
    return out


def _strip(
    lines: list[bytes],
    defs: list[tuple[int, int, int, int]],
    kept: set[int],
    stand_ins: dict[int, tuple[int, bytes]],
) -> bytes:
    """The source with the outermost function bodies not `kept` replaced by `...` on the header line
    (`pysource.strip_bodies`), and those with a stand-in by one `...` on the line given: line numbers,
    and every statement's extent, unchanged."""
    out = list(lines)
    for x in _outermost(defs):
        j, end_col, b0, k = defs[x]
        if x in kept and x not in stand_ins:
            continue
        for y in range(b0, k):
            out[y] = b""
        if x in stand_ins:
            at, indent = stand_ins[x]
            out[at] = indent + b"..."
        else:
            out[j] = lines[j][: end_col + 1] + b" ..."
    return b"\n".join(out)


def _def_line(lines: list[bytes], j: int) -> int | None:
    """The `def` line of a header ending on line j (checked against the parse: `_Scanner.units`)."""
    for x in range(j, max(-1, j - 200), -1):
        if _DEF_LINE_RE.match(lines[x]):
            return x
    return None


def _decorated_from(lines: list[bytes], i: int) -> int:
    """The first line of the one-line decorators right above the `def` on line i (checked against the
    parse: `_Scanner._scan_function`)."""
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    d = i
    while d > 0 and lines[d - 1].startswith(indent + b"@"):
        d -= 1
    return d


_DEF_LINE_RE = re.compile(rb"[ \t]*(?:async[ \t]+)?def[ \t]+\w+[ \t]*\(")


def _stand_in(lines: list[bytes], i: int, b0: int, k: int) -> tuple[int, bytes] | None:
    """Where a body's `...` goes so that the function ends where it does: the last line of its last
    statement (the last line neither blank nor a comment), indented as it is; None when that line
    cannot be told from the text (a comment-like line after it could end a string)."""
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    for y in range(k - 1, b0 - 1, -1):
        stripped = lines[y].strip()
        if not stripped:
            continue
        if stripped.startswith(b"#"):
            if any(c in lines[y] for c in (b'"', b"'", b"\\")):
                return None
            continue
        lead = lines[y][: len(lines[y]) - len(lines[y].lstrip())]
        if not lead.startswith(indent) or len(lead) <= len(indent) or stripped.endswith(b"\\"):
            return None
        return y, lead
    return None


def _stood_in(tree: ast.Module, expect: dict[int, int]) -> bool:
    """Is each body left out the whole body of the function on its `def` line: one `...` on the line
    `expect`ed ({def line: stand-in line})? (Outermost functions: not looked for inside functions.)"""
    found = 0
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.lineno not in expect:
                continue
            body = node.body
            if not (
                len(body) == 1
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and body[0].value.value is Ellipsis
                and body[0].lineno == body[0].end_lineno == expect[node.lineno]
            ):
                return False
            found += 1
            continue
        for fname in ("body", "orelse", "finalbody"):
            stack.extend(getattr(node, fname, None) or ())
        for h in getattr(node, "handlers", None) or ():
            stack.extend(h.body)
        for c in getattr(node, "cases", None) or ():
            stack.extend(c.body)
    return found == len(expect)


def _moves(was: tuple[tuple[str, int], ...], now: tuple[tuple[str, int], ...]) -> dict[int, int] | None:
    """{old line: new line} of the outside bindings one function read (the same names: its context
    matched); None when one old line went to two lines for it (an import split in two: which one a
    call of it went through, only its parse says)."""
    new = dict(now)
    out: dict[int, int] = {}
    for name, line in was:
        to = new.get(name)
        if to is None or out.setdefault(line, to) != to:
            return None
    return {a: b for a, b in out.items() if a != b}


def _stable(x: object) -> str:
    """A text that is equal for equal values, across processes (ASTs dumped with their positions)."""
    if isinstance(x, ast.AST):
        return ast.dump(x, include_attributes=True)
    if isinstance(x, dict):
        return "{" + ",".join(sorted(f"{_stable(k)}:{_stable(v)}" for k, v in x.items())) + "}"
    if isinstance(x, set | frozenset):
        return "{" + ",".join(sorted(_stable(v) for v in x)) + "}"
    if isinstance(x, list | tuple):
        return "(" + ",".join(_stable(v) for v in x) + ")"
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return type(x).__name__ + _stable(tuple(getattr(x, f.name) for f in dataclasses.fields(x)))
    if x is None or isinstance(x, str | int | float | bytes):
        return repr(x)
    raise _Unstable(type(x).__name__)


class _Unstable(Exception):
    """A value with no text equal across processes: the function it is the context of is not reused."""


# ATOM registering its own ops in the `aiter` namespace: `direct_register_custom_op("name", ...)`, or a
# registering decorator (aiter's `@torch_compile_guard(...)`, ATOM's `@mark_spliting_op(...)`) on `def name(`.
_REGISTERS_RE = re.compile(
    r"""direct_register_custom_op\(\s*(?:op_name\s*=\s*)?["'](\w+)["']"""
    r"""|@(?:torch_compile_guard|mark_spliting_op|custom_op|register_custom_op)\b(?:\([^@]*?\)\s*\n|\s*\n)"""
    r"""(?:[ \t]*@[^\n]*\n)*[ \t]*(?:async[ \t]+)?def[ \t]+(\w+)"""
)
