"""Guards built on `inspect.signature(...)`: what ATOM derives from a signature, and whether a guard holds.

The scanner follows a signature through a plain chain of assignments (constant
propagation within a function, and from module level into functions):
`sig = inspect.signature(f)`, `params = sig.parameters`, `names = list(params)` or a
comprehension keeping some kinds (`[n for n, p in params.items() if p.kind == ...]`),
`i = names.index("x")`, `n = len(params)`, `HAS_X = "x" in params`. A test over those
values becomes a form the check evaluates against the pin's signature, with Python's
semantics: names in, count, name at a position, position of a name, a slice of names
(from a constant or from a found name), a parameter's kind. A part that reads no
signature is a runtime condition (`free`: either way); a part that reads one in a way
not followed is `unknown`, and the guard is evaluated as far as that allows
(`False and unknown` is False).

Forms (picklable, in `calls.SigGuard.form`); `kinds` is a tuple of `Param.kind` values kept,
or None for every parameter:
    ("in", name, kinds)                     name in the names
    ("len", op, n, kinds)                   len(names) <op> n
    ("at", i, name, kinds)                  names[i] == name
    ("pos", name, op, n, kinds)             names.index(name) <op> n
    ("slice", lo, hi, names, kinds)         names[lo:hi] == [names...]; a bound is (anchor, offset),
                                            anchor a name whose index it is offset from, or None
    ("kind", name, kinds)                   the parameter `name` has one of these kinds
    ("not", form), ("and", forms), ("or", forms), ("free",), ("unknown",)
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.compat.aiterapi import ApiIndex, Param
    from pipeline.compat.calls import SigGuard

GuardForm = tuple[Any, ...]
Kinds = tuple[str, ...] | None
Val = tuple[Any, ...]  # what an expression holds (see `value`)
# (the function whose signature it comes from, its value; None: derived, not followed)
SigVal = tuple[ast.expr, Val | None]
Scope = dict[str, SigVal]
Ref = tuple[str, tuple[str, ...]]

FREE: GuardForm = ("free",)
UNKNOWN: GuardForm = ("unknown",)
ALL_KINDS = ("posonly", "pos", "vararg", "kwonly", "varkw")
_KIND_NAMES = {
    "POSITIONAL_ONLY": "posonly",
    "POSITIONAL_OR_KEYWORD": "pos",
    "VAR_POSITIONAL": "vararg",
    "KEYWORD_ONLY": "kwonly",
    "VAR_KEYWORD": "varkw",
}
_SEQS = ("names", "params", "items")  # sequences of parameters: their names, Parameter objects, (name, p)
_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


# -- what an expression holds ------------------------------------------------------------------


def signature_of(node: ast.expr) -> ast.expr | None:
    """f, when `node` is `inspect.signature(f)` (`signature(f)`, `inspect.signature(inspect.unwrap(f))`)."""
    if not (isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords):
        return None
    f = node.func
    named = (isinstance(f, ast.Attribute) and f.attr == "signature" and isinstance(f.value, ast.Name)) or (
        isinstance(f, ast.Name) and f.id == "signature"
    )
    if not named:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr == "unwrap":
        arg = arg.args[0] if arg.args else arg
    return arg


def derived_from(node: ast.AST, scope: Scope) -> ast.expr | None:
    """The function whose signature any part of `node` reads, or None."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = signature_of(n)
            if f is not None:
                return f
        elif isinstance(n, ast.Name) and n.id in scope:
            return scope[n.id][0]
    return None


def value(node: ast.expr, scope: Scope) -> SigVal | None:
    """What `node` holds of a signature, or None when it reads none. Values:
    ("sig",); ("names", kinds) the parameters mapping, its keys or a list of names; ("params", kinds)
    Parameter objects; ("items", kinds); ("param", name) one Parameter; ("param_at", i, kinds);
    ("kind_of", name); ("name_at", i, kinds); ("index", name, kinds); ("len", kinds);
    ("slice", lo, hi, kinds); ("form", form) a truth value."""
    f = signature_of(node)
    if f is not None:
        return f, ("sig",)
    if isinstance(node, ast.Name):
        return scope.get(node.id)
    if isinstance(node, ast.Compare | ast.BoolOp) or _is_not(node):
        form = form_of(node, scope)
        first = _first_fn(form)
        return (first, ("form", form)) if first is not None else None
    got = _followed(node, scope)
    if got is not None:
        return got
    first = derived_from(node, scope)
    return (first, None) if first is not None else None


def _is_not(node: ast.expr) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)


def _known(node: ast.expr, scope: Scope) -> tuple[ast.expr, Val] | None:
    sv = value(node, scope)
    return (sv[0], sv[1]) if sv is not None and sv[1] is not None else None


def _followed(node: ast.expr, scope: Scope) -> SigVal | None:
    """The shapes a plain derivation takes (see `value`)."""
    if isinstance(node, ast.Attribute):
        base = _known(node.value, scope)
        if base is None:
            return None
        f, v = base
        if v[0] == "sig" and node.attr == "parameters":
            return f, ("names", None)
        if v[0] == "param" and node.attr == "kind":
            return f, ("kind_of", v[1])
        if v[0] == "param_at" and node.attr == "name":
            return f, ("name_at", v[1], v[2])
        return None
    if isinstance(node, ast.Call):
        if node.keywords:
            return None
        fn = node.func
        if isinstance(fn, ast.Attribute):
            base = _known(fn.value, scope)
            if base is None or base[1][0] != "names":
                return None
            f, v = base
            if not node.args and fn.attr in ("keys", "values", "items"):
                return f, ({"keys": "names", "values": "params", "items": "items"}[fn.attr], v[1])
            s = _str(node.args[0]) if fn.attr == "index" and len(node.args) == 1 else None
            return (f, ("index", s, v[1])) if s is not None else None
        if isinstance(fn, ast.Name) and len(node.args) == 1:
            base = _known(node.args[0], scope)
            if base is None or base[1][0] not in _SEQS:
                return None
            f, v = base
            if fn.id in ("list", "tuple"):
                return f, v
            if fn.id == "len":
                return f, ("len", v[1])
        return None
    if isinstance(node, ast.ListComp | ast.GeneratorExp):
        return _comprehension(node, scope)
    if isinstance(node, ast.Subscript):
        base = _known(node.value, scope)
        if base is None:
            return None
        f, v = base
        sl = node.slice
        if v[0] == "names":
            s, i = _str(sl), _int(sl)
            if s is not None:
                return f, ("param", s)
            if i is not None:
                return f, ("name_at", i, v[1])
            if isinstance(sl, ast.Slice) and sl.step is None:
                lo = _bound(sl.lower, scope, v[1]) if sl.lower is not None else (None, 0)
                hi = _bound(sl.upper, scope, v[1]) if sl.upper is not None else None
                if lo is not None and (hi is not None or sl.upper is None):
                    return f, ("slice", lo, hi, v[1])
        if v[0] == "params":
            i = _int(sl)
            if i is not None:
                return f, ("param_at", i, v[1])
    return None


def _comprehension(node: ast.ListComp | ast.GeneratorExp, scope: Scope) -> SigVal | None:
    """`[n for n in params]`, `[n for n, p in params.items() if p.kind ...]`, `[p.name for p in ...]`."""
    if len(node.generators) != 1 or node.generators[0].is_async:
        return None
    gen = node.generators[0]
    base = _known(gen.iter, scope)
    if base is None or base[1][0] not in _SEQS:
        return None
    f, (what, kinds) = base[0], base[1][:2]
    name_var = param_var = None
    t = gen.target
    if what == "names" and isinstance(t, ast.Name):
        name_var = t.id
    elif what == "params" and isinstance(t, ast.Name):
        param_var = t.id
    elif what == "items" and isinstance(t, ast.Tuple) and len(t.elts) == 2:
        a, b = t.elts
        if not (isinstance(a, ast.Name) and isinstance(b, ast.Name)):
            return None
        name_var, param_var = a.id, b.id
    else:
        return None
    for cond in gen.ifs:
        keep = _kind_filter(cond, param_var)
        if keep is None:
            return None
        kinds = _meet(kinds, keep)
    e = node.elt
    if isinstance(e, ast.Name) and e.id == name_var:
        return f, ("names", kinds)
    if isinstance(e, ast.Name) and e.id == param_var:
        return f, ("params", kinds)
    if isinstance(e, ast.Attribute) and e.attr == "name" and _is_name(e.value, param_var):
        return f, ("names", kinds)
    return None


def _kind_filter(cond: ast.expr, param_var: str | None) -> tuple[str, ...] | None:
    """The kinds `cond` keeps when it tests only `param_var.kind` (`==`, `!=`, `in`, `not in`, `is`)."""
    if param_var is None:
        return None
    if isinstance(cond, ast.BoolOp):
        parts = [_kind_filter(v, param_var) for v in cond.values]
        if any(p is None for p in parts):
            return None
        if isinstance(cond.op, ast.Or):
            return tuple(k for k in ALL_KINDS if any(k in p for p in parts if p is not None))
        return tuple(k for k in ALL_KINDS if all(k in p for p in parts if p is not None))
    if not (isinstance(cond, ast.Compare) and len(cond.ops) == 1):
        return None
    left, op, right = cond.left, cond.ops[0], cond.comparators[0]

    def is_kind(n: ast.expr) -> bool:
        return (
            isinstance(n, ast.Attribute)
            and n.attr == "kind"
            and isinstance(n.value, ast.Name)
            and n.value.id == param_var
        )

    if not is_kind(left):
        if not (is_kind(right) and isinstance(op, ast.Eq | ast.NotEq | ast.Is | ast.IsNot)):
            return None
        left, right = right, left
    consts = kind_consts(right)
    if consts is None:
        return None
    if isinstance(op, ast.Eq | ast.Is | ast.In):
        return tuple(k for k in ALL_KINDS if k in consts)
    if isinstance(op, ast.NotEq | ast.IsNot | ast.NotIn):
        return tuple(k for k in ALL_KINDS if k not in consts)
    return None


def kind_consts(node: ast.expr) -> tuple[str, ...] | None:
    """`inspect.Parameter.KEYWORD_ONLY` (any `X.KEYWORD_ONLY`), or a tuple/list/set of them."""
    if isinstance(node, ast.Attribute) and node.attr in _KIND_NAMES:
        return (_KIND_NAMES[node.attr],)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        out: list[str] = []
        for e in node.elts:
            got = kind_consts(e)
            if got is None:
                return None
            out.extend(got)
        return tuple(out)
    return None


def _is_name(node: ast.expr, name: str | None) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _meet(a: Kinds, b: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(k for k in (a if a is not None else ALL_KINDS) if k in b)


def _str(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _int(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return -inner if inner is not None else None
    return None


def _bound(node: ast.expr, scope: Scope, kinds: Kinds) -> tuple[str | None, int] | None:
    """A slice bound: a constant (None, n >= 0), or a found name's index plus a constant (name, n)."""
    n = _int(node)
    if n is not None:
        return (None, n) if n >= 0 else None
    off = 0
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        k = _int(node.right)
        if k is None:
            return None
        off, node = (k if isinstance(node.op, ast.Add) else -k), node.left
    got = _known(node, scope)
    if got is None or got[1][0] != "index" or got[1][2] != kinds:
        return None
    return str(got[1][1]), off


# -- tests over those values -------------------------------------------------------------------
# Internal forms carry the inspected function at each leaf: ("leaf", f, form); `finalize` keeps those
# of the guard's aiter function, makes a non-aiter function's signature a runtime condition (free).


def form_of(node: ast.expr, scope: Scope) -> GuardForm:
    """`node` as a test, with the function each leaf inspects (see `finalize`)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return ("not", form_of(node.operand, scope))
    if isinstance(node, ast.BoolOp):
        parts = tuple(form_of(v, scope) for v in node.values)
        return ("and" if isinstance(node.op, ast.And) else "or", parts)
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        leaf = _compare(node, scope)
        if leaf is not None:
            return leaf
    else:
        got = _known(node, scope)
        if got is not None:
            fn, v = got
            if v[0] == "form":
                form: GuardForm = v[1]
                return form
            if v[0] in _SEQS:  # `if params:`
                return ("leaf", fn, ("len", ">", 0, v[1]))
    f = derived_from(node, scope)
    return FREE if f is None else ("leaf", f, UNKNOWN)


def _compare(node: ast.Compare, scope: Scope) -> GuardForm | None:
    left, op, right = node.left, node.ops[0], node.comparators[0]
    if isinstance(op, ast.In | ast.NotIn):
        s, rv = _str(left), _known(right, scope)
        form: GuardForm | None = None
        if s is not None and rv is not None and rv[1][0] == "names":
            form = ("leaf", rv[0], ("in", s, rv[1][1]))
        lv, consts = _known(left, scope), kind_consts(right)
        if lv is not None and lv[1][0] == "kind_of" and consts is not None:
            form = ("leaf", lv[0], ("kind", lv[1][1], consts))
        if form is None:
            return None
        return form if isinstance(op, ast.In) else ("not", form)
    if isinstance(op, ast.Is | ast.IsNot):
        sym = "==" if isinstance(op, ast.Is) else "!="
    elif type(op) in _OPS:
        sym = _OPS[type(op)]
    else:
        return None
    for a, b, o in ((left, right, sym), (right, left, _FLIP[sym])):
        got = _known(a, scope)
        if got is None:
            continue
        f, v = got
        leaf: GuardForm | None = None
        n, s = _int(b), _str(b)
        if v[0] == "len" and n is not None and o in _FLIP:
            leaf = ("len", o, n, v[1])
        elif v[0] == "index" and n is not None:
            leaf = ("pos", v[1], o, n, v[2])
        elif v[0] == "name_at" and s is not None and o in ("==", "!="):
            leaf = ("at", v[1], s, v[2])
        elif v[0] == "slice" and o in ("==", "!=") and isinstance(b, ast.List):
            names = [_str(e) for e in b.elts]
            if all(x is not None for x in names):
                leaf = ("slice", v[1], v[2], tuple(names), v[3])
        elif v[0] == "kind_of" and o in ("==", "!=") and kind_consts(b) is not None:
            leaf = ("kind", v[1], kind_consts(b))
        if leaf is None:
            return None
        if o == "!=" and leaf[0] in ("at", "slice", "kind"):
            return ("not", ("leaf", f, leaf))
        return ("leaf", f, leaf)
    return None


def _first_fn(form: GuardForm) -> ast.expr | None:
    if form[0] == "leaf":
        f: ast.expr = form[1]
        return f
    if form[0] == "not":
        return _first_fn(form[1])
    if form[0] in ("and", "or"):
        for x in form[1]:
            got = _first_fn(x)
            if got is not None:
                return got
    return None


def finalize(
    form: GuardForm, resolve: Callable[[ast.expr], Ref | None]
) -> tuple[Ref, GuardForm | None] | None:
    """(the aiter function the guard inspects, the form about it), or None when it inspects none of aiter's.
    A leaf about a function that is not aiter's is a runtime condition; about another aiter function,
    unknown. A form that is wholly unknown is None."""
    refs: dict[int, Ref | None] = {}

    def ref(f: ast.expr) -> Ref | None:
        if id(f) not in refs:
            refs[id(f)] = resolve(f)
        return refs[id(f)]

    def leaves(x: GuardForm) -> list[ast.expr]:
        if x[0] == "leaf":
            return [x[1]]
        if x[0] == "not":
            return leaves(x[1])
        if x[0] in ("and", "or"):
            return [f for y in x[1] for f in leaves(y)]
        return []

    target = next((r for r in (ref(f) for f in leaves(form)) if r is not None), None)
    if target is None:
        return None

    def conv(x: GuardForm) -> GuardForm:
        if x[0] == "leaf":
            r = ref(x[1])
            return x[2] if r == target else FREE if r is None else UNKNOWN
        if x[0] == "not":
            return ("not", conv(x[1]))
        if x[0] in ("and", "or"):
            return (x[0], tuple(conv(y) for y in x[1]))
        return x

    out = conv(form)
    return target, None if out == UNKNOWN else out


def raises_unless(sv: SigVal) -> GuardForm | None:
    """What must hold for reading this value not to raise (`names.index("x")`: ValueError unless "x" is
    there), as a leaf; FREE when reading it cannot fail; None when the check cannot tell."""
    f, v = sv
    if v is None:
        return None
    if v[0] == "index":
        return ("leaf", f, ("in", v[1], v[2]))
    if v[0] in ("param", "kind_of"):
        return ("leaf", f, ("in", v[1], None))
    if v[0] in ("name_at", "param_at"):
        i = v[1]
        assert isinstance(i, int)
        return ("leaf", f, ("len", ">", i, v[2]) if i >= 0 else ("len", ">=", -i, v[2]))
    return FREE


# -- whether a guard holds at a pin ------------------------------------------------------------


def guard_holds(g: SigGuard, idx: ApiIndex) -> bool | None:
    """Whether the code under `g` can run at this aiter (None: the check cannot tell)."""
    if g.form is None:
        return None
    t = idx.resolve_ref(g.ref)
    if t.kind not in ("func", "class") or t.sig is None:
        return None
    if t.sig.op == "torch_compile_guard":
        return None  # what it returns is a wrapper without functools.wraps: not the def's signature
    got = possible(g.form, t.sig.params)
    return None if got is None else g.when in got


def possible(form: GuardForm, params: tuple[Param, ...]) -> frozenset[bool] | None:
    """The values `form` can take with these parameters (None: the check cannot tell)."""
    op = form[0]
    if op == "free":
        return frozenset((True, False))
    if op == "unknown":
        return None
    if op == "not":
        inner = possible(form[1], params)
        return None if inner is None else frozenset(not x for x in inner)
    if op in ("and", "or"):
        parts = [possible(x, params) for x in form[1]]
        decisive = frozenset((op == "or",))  # a part that settles it: True for `or`, False for `and`
        if decisive in parts:
            return decisive
        if any(p is None for p in parts):
            return None
        known = [p for p in parts if p is not None]
        every, some = (all, any) if op == "and" else (any, all)
        can_be_true, can_be_false = every(True in p for p in known), some(False in p for p in known)
        return frozenset(v for v, can in ((True, can_be_true), (False, can_be_false)) if can)
    got = _leaf(form, params)
    return None if got is None else frozenset((got,))


def _cmp(a: int, op: object, b: int) -> bool:
    return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[str(op)]


def _leaf(form: GuardForm, params: tuple[Param, ...]) -> bool | None:
    op = form[0]
    kinds = form[-1]
    names = [p.name for p in params if kinds is None or p.kind in kinds]
    if op == "in":
        return form[1] in names
    if op == "len":
        return _cmp(len(names), form[1], form[2])
    if op == "at":
        i = form[1]
        assert isinstance(i, int)
        return names[i] == form[2] if -len(names) <= i < len(names) else None  # IndexError: not this
    if op == "pos":
        return _cmp(names.index(str(form[1])), form[2], form[3]) if form[1] in names else None
    if op == "slice":
        lo, hi, want = form[1], form[2], form[3]

        def at(b: tuple[str | None, int]) -> int | None:
            anchor, off = b
            if anchor is None:
                return int(off)
            if anchor not in names:
                return None
            n = names.index(anchor) + int(off)
            return n if n >= 0 else None

        start = at(lo)
        end = at(hi) if hi is not None else len(names)
        if start is None or end is None:
            return None
        return bool(names[start:end] == list(want))
    if op == "kind":
        p = next((p for p in params if p.name == form[1]), None)
        return None if p is None else p.kind in form[2]
    return None


def params_phrase(g: SigGuard, idx: ApiIndex) -> str:
    t = idx.resolve_ref(g.ref)
    if t.sig is None:
        return "its signature is not known"
    return f"`{t.sig.name}` has parameters ({python_params(t.sig.params)}) at {t.sig.path}:{t.sig.line}"


def python_params(params: tuple[Param, ...]) -> str:
    """The parameters as Python writes them: `/` after the positional-only, `*` before the keyword-only."""
    out: list[str] = []
    for i, p in enumerate(params):
        before = params[i - 1].kind if i else None
        if before == "posonly" and p.kind != "posonly":
            out.append("/")
        if p.kind == "kwonly" and before not in ("kwonly", "vararg"):
            out.append("*")
        out.append(p.show())
    if params and params[-1].kind == "posonly":
        out.append("/")
    return ", ".join(out)
