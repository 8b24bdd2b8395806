"""Bind a call to a signature the way Python would, and check evident types."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field

from pipeline.compat.aiterapi import Param, Signature, pretty_annotation
from pipeline.compat.calls import Arg, RawCall


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # too-many-positional / missing-argument / unexpected-keyword / duplicate-argument /
    #            positional-only-as-keyword / type-mismatch
    message: str
    key: str = ""  # what identifies the problem across signature versions ("fails the same way")
    soft: bool = False  # an int literal on a bool: converted, even by an op's binding, but rarely meant


@dataclass(slots=True)
class Binding:
    """Where each argument of a call lands: positional index (1-based) or keyword -> parameter."""

    positional: list[Param | None] = field(default_factory=list)  # None: beyond the signature
    keywords: dict[str, Param | None] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def landing(self) -> tuple[str | None, ...]:
        """Parameter names of the positional arguments (what a shift changes)."""
        return tuple(p.name if p is not None else None for p in self.positional)


_ACCEPTS: dict[str, set[str]] = {
    "int": {"int", "float", "complex"},  # not bool: see `soft`
    "bool": {"bool", "int", "float"},
    "float": {"float", "complex"},
    "None": {"None"},
    "str": {"str"},
    "bytes": {"bytes"},
    "Tensor": {"Tensor"},
    "list": {"list"},
    "tuple": {"list"},
    "dict": {"dict"},
}

_SIMPLE = {
    "Tensor": "Tensor",
    "int": "int",
    "float": "float",
    "bool": "bool",
    "str": "str",
    "bytes": "bytes",
    "None": "None",
    "NoneType": "None",
    "list": "list",
    "List": "list",
    "tuple": "list",
    "Tuple": "list",
    "Sequence": "list",
    "MutableSequence": "list",
    "dict": "dict",
    "Dict": "dict",
    "Mapping": "dict",
}


@functools.lru_cache(maxsize=4096)
def annotation_types(ann: str | None) -> frozenset[str] | None:
    t = _annotation_types(ann)
    return frozenset(t) if t is not None else None


def _annotation_types(ann: str | None) -> set[str] | None:
    """The set of evident types an annotation admits, or None when it admits anything we cannot tell."""
    if not ann:
        return None
    try:
        node = ast.parse(ann, mode="eval").body
    except SyntaxError:
        return None
    return _types(node)


def _types(node: ast.expr) -> set[str] | None:
    if isinstance(node, ast.Constant):
        if node.value is None:
            return {"None"}
        if isinstance(node.value, str):
            return _annotation_types(node.value)
        return None
    if isinstance(node, ast.Name | ast.Attribute):
        name = node.id if isinstance(node, ast.Name) else node.attr
        t = _SIMPLE.get(name)
        return {t} if t else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        a, b = _types(node.left), _types(node.right)
        return a | b if a is not None and b is not None else None
    if isinstance(node, ast.Subscript):
        head = (
            node.value.id
            if isinstance(node.value, ast.Name)
            else (node.value.attr if isinstance(node.value, ast.Attribute) else "")
        )
        if head == "Optional":
            inner = _types(node.slice)
            return inner | {"None"} if inner is not None else None
        if head == "Union":
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            out: set[str] = set()
            for e in elts:
                et = _types(e)
                if et is None:
                    return None
                out |= et
            return out
        simple = _SIMPLE.get(head)
        return {simple} if simple else None
    return None


def type_ok(etype: str | None, param: Param) -> bool:
    if etype is None:
        return True
    if etype == "None" and param.default_none:
        return True
    allowed = annotation_types(param.annotation)
    if allowed is None:
        return True
    return bool(_ACCEPTS.get(etype, {etype}) & allowed)


def arg_desc(i: int, a: Arg) -> str:
    t = f" ({a.etype})" if a.etype else ""
    return f"argument {i} `{a.text}`{t}"


_BIND_MEMO: dict[tuple[int, int], tuple[RawCall, Signature, Binding]] = {}


def bind(call: RawCall, sig: Signature) -> Binding:
    """Python's binding rules, then evident-type checks (memoized: a search binds the same pairs often)."""
    key = (id(call), id(sig))
    got = _BIND_MEMO.get(key)
    if got is not None and got[0] is call and got[1] is sig:
        return got[2]
    if len(_BIND_MEMO) > 200_000:
        _BIND_MEMO.clear()
    b = _bind(call, sig)
    _BIND_MEMO[key] = (call, sig, b)
    return b


def _bind(call: RawCall, sig: Signature) -> Binding:
    b = Binding()
    params = sig.params
    positional = [p for p in params if p.kind in ("posonly", "pos")]
    vararg = next((p for p in params if p.kind == "vararg"), None)
    varkw = next((p for p in params if p.kind == "varkw"), None)
    assigned: dict[str, str] = {}  # param name -> what fills it
    n = len(call.args)
    for i, _a in enumerate(call.args):
        if i < len(positional):
            b.positional.append(positional[i])
            assigned[positional[i].name] = f"argument {i + 1}"
        else:
            b.positional.append(vararg)
    if n > len(positional) and vararg is None:
        b.problems.append(
            Problem(
                "too-many-positional",
                f"{n} positional arguments given but `{sig.name}` takes at most "
                f"{len(positional)} positionally",
                "too-many-positional",
            )
        )
    by_name = {p.name: p for p in params if p.kind in ("pos", "kwonly", "posonly")}
    for name, _arg in call.kwargs:
        p = by_name.get(name)
        if p is not None and p.kind == "posonly":
            if varkw is not None:
                b.keywords[name] = varkw
                continue
            b.problems.append(
                Problem(
                    "positional-only-as-keyword",
                    f"`{name}` is positional-only in `{sig.name}`",
                    f"posonly:{name}",
                )
            )
            b.keywords[name] = None
            continue
        if p is None:
            if varkw is not None:
                b.keywords[name] = varkw
                continue
            b.problems.append(
                Problem("unexpected-keyword", f"`{sig.name}` has no parameter `{name}`", f"unexpected:{name}")
            )
            b.keywords[name] = None
            continue
        if name in assigned:
            b.problems.append(
                Problem(
                    "duplicate-argument",
                    f"`{name}` is given twice: by {assigned[name]} and by keyword",
                    f"duplicate:{name}",
                )
            )
        assigned[name] = "keyword"
        b.keywords[name] = p
    if not call.star_args and not call.star_kwargs:
        missing = [
            p.name
            for p in params
            if p.kind in ("posonly", "pos", "kwonly") and not p.has_default and p.name not in assigned
        ]
        if missing:
            names = ", ".join(f"`{m}`" for m in missing)
            b.problems.append(
                Problem(
                    "missing-argument",
                    f"missing required argument(s) {names}",
                    f"missing:{','.join(missing)}",
                )
            )
    # Evident types.
    for i, (a, p) in enumerate(zip(call.args, b.positional, strict=True)):
        if p is not None and p.kind != "vararg" and not type_ok(a.etype, p):
            b.problems.append(
                Problem(
                    "type-mismatch",
                    f"{arg_desc(i + 1, a)} lands on `{p.show()}`",
                    f"type:{i + 1}:{p.name}",
                    _int_for_flag(a.etype, p),
                )
            )
    for name, a in call.kwargs:
        p = b.keywords.get(name)
        if p is not None and p.kind != "varkw" and not type_ok(a.etype, p):
            t = f" ({a.etype})" if a.etype else ""
            b.problems.append(
                Problem(
                    "type-mismatch",
                    f"keyword `{name}={a.text}`{t} does not fit `{p.show()}`",
                    f"type:{name}:{name}",
                    _int_for_flag(a.etype, p),
                )
            )
    return b


def _int_for_flag(etype: str | None, param: Param) -> bool:
    return etype == "int" and type_ok("bool", param)


def show_param(p: Param | None) -> str:
    if p is None:
        return "(nothing)"
    ann = pretty_annotation(p.annotation)
    return f"{p.name}: {ann}" if ann else p.name
