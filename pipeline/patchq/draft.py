"""`patch draft`: the first draft of the ATOM fix for each breaking call whose fix is mechanical.

A call is rewritten from what it was *written for* (the signature the check decided the call
was written against) to the pin's signature, never from a guess:

- a shift (a parameter inserted, moved or removed): from the first positional argument that no
  longer lands on the parameter it was written for, every argument becomes a keyword naming that
  parameter as the pin calls it (a parameter renamed in place keeps its slot under its new name);
  an argument whose parameter is gone is dropped, with a note;
- a keyword renamed: the new name; a keyword whose parameter is gone: dropped, with a note;
- a required parameter no argument maps to: `name=PIPELINE_DRAFT_TODO`, a name bound nowhere,
  so `patch apply` refuses the draft until a person writes the value (never an invented one);
- a value that no longer fits is not carried over: a parameter split in two (renamed in place to
  `kv_cache_k`, `kv_cache_v` inserted beside it) keeps the value in its slot and gets a placeholder
  for the new part (unless the value is None); a value of a type the renamed parameter does not
  take (`False` for `scale_layout: str`) becomes a placeholder.

The source is rewritten with libcst (a concrete syntax tree: the file's formatting and comments
stay as they are), and the draft is a DEP-3 patch (`Status: draft`) appended to the series.
Anything else (a missing function, an argument passed through `*args`, a positional-only
parameter) is not mechanical: it is listed with the reason and no draft is written for it.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.utils import format_datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import libcst as cst

    from pipeline.compat.aiterapi import Param, Signature
    from pipeline.compat.calls import Arg, RawCall
    from pipeline.compat.report import Finding
    from pipeline.gitw import GitRepo
    from pipeline.patchq.model import Patch

PLACEHOLDER = "PIPELINE_DRAFT_TODO"
MECHANICAL_KINDS = (
    "positional-shift",
    "unexpected-keyword",
    "too-many-positional",
    "missing-argument",
    "type-mismatch",
)


@dataclass(frozen=True)
class CallRewrite:
    """How to rewrite one call: the plan, independent of the source text."""

    line: int
    col: int  # 1-based, as the check reports it (the call's start)
    display: str  # how the call spells the callee
    keep: int  # leading positional arguments kept as they are
    keywords: tuple[tuple[int, str], ...]  # (positional index, keyword) for the rest
    dropped: tuple[int, ...]  # positional indices whose parameter is gone
    renamed: tuple[tuple[str, str], ...]  # keyword -> new keyword
    dropped_kw: tuple[str, ...]
    placeholders: tuple[str, ...]  # required parameters nothing maps to (and split or retyped ones)
    notes: tuple[str, ...]
    after: tuple[tuple[str, str], ...] = ()  # placeholder -> the keyword it goes right after
    blank: tuple[str, ...] = ()  # keywords kept in place with the placeholder as their value


class NotMechanical(Exception):
    """This call's fix needs a person: the reason is the message."""


def plan_call(call: RawCall, written_for: Signature, pin: Signature) -> CallRewrite:
    """Map every argument to the parameter it was written for, then to that parameter at the pin."""
    from pipeline.compat.bind import bind
    from pipeline.compat.calls import Arg
    from pipeline.compat.cause import param_map

    ob, nb = bind(call, written_for), bind(call, pin)
    pm = param_map(written_for, pin)
    new_by = {p.name: p for p in pin.params}
    notes: list[str] = []

    def target(name: str) -> str | None:
        t = name if name in new_by else pm.get(name)
        return t if t in new_by else None

    keep = 0
    for i, op in enumerate(ob.positional):
        now = nb.positional[i]
        if op is None or now is None or op.name != now.name or op.kind == "vararg":
            break
        keep = i + 1
    keywords: list[tuple[int, str]] = []
    dropped: list[int] = []
    retyped: list[str] = []  # parameters whose value no longer fits: placeholders
    if keep < len(call.args) and call.star_args:
        raise NotMechanical("positional arguments before a `*args` would move: their slots depend on it")
    for i in range(keep, len(call.args)):
        op = ob.positional[i]
        if op is None:
            raise NotMechanical(
                f"argument {i + 1} `{call.args[i].text}` had no parameter in the signature it was written for"
            )
        if op.kind == "vararg":
            raise NotMechanical(f"argument {i + 1} `{call.args[i].text}` went to `*{op.name}`")
        t = target(op.name)
        if t is None:
            dropped.append(i)
            notes.append(
                f"argument {i + 1} `{call.args[i].text}` (written for `{op.name}`) dropped: "
                f"`{pin.name}` has no such parameter any more"
            )
            continue
        p = new_by[t]
        if p.kind not in ("pos", "kwonly"):
            raise NotMechanical(f"`{t}` is {p.kind} in `{pin.name}`: it cannot be passed by keyword")
        keywords.append((i, t))
        why = _retyped(call.args[i], op, p)
        if why is not None:  # the value was written for another type: a person writes the new one
            retyped.append(t)
            notes.append(f"argument {i + 1}: {why}: `{t}={PLACEHOLDER}`")
            continue
        if t != op.name:
            notes.append(
                f"`{op.show()}` is now `{p.show()}` (same slot): check `{call.args[i].text}` still means it"
            )
    renamed: list[tuple[str, str]] = []
    dropped_kw: list[str] = []
    old_by = {q.name: q for q in written_for.params}
    for k, a in call.kwargs:
        t = target(k)
        if t is None:
            dropped_kw.append(k)
            notes.append(f"keyword `{k}={a.text}` dropped: `{pin.name}` has no such parameter any more")
            continue
        why = _retyped(a, old_by[k], new_by[t]) if k in old_by else None
        if why is not None:
            if t != k:
                renamed.append((k, t))
            retyped.append(t)
            notes.append(f"keyword `{k}={a.text}`: {why}: `{t}={PLACEHOLDER}`")
        elif t != k:
            renamed.append((k, t))
            shown, shown_now = (old_by[k].show() if k in old_by else k), new_by[t].show()
            notes.append(f"keyword `{shown}` renamed to `{shown_now}`: check `{a.text}` still means it")
    used = [t for _, t in keywords] + [t for _, t in renamed] + [k for k, _ in call.kwargs if k in new_by]
    if len(used) != len(set(used)):
        raise NotMechanical("two arguments would map to the same parameter")
    kwargs = tuple((t, call.args[i]) for i, t in keywords)
    kwargs += tuple((dict(renamed).get(k, k), a) for k, a in call.kwargs if k not in dropped_kw)
    drafted = dataclasses.replace(call, args=tuple(call.args[:keep]), kwargs=kwargs)
    missing: list[str] = []
    for prob in bind(drafted, pin).problems:
        if prob.kind == "missing-argument":
            missing.extend(n for n in prob.key.removeprefix("missing:").split(",") if n not in retyped)
    split, after = _splits(call, written_for, pin, keywords, renamed, notes)
    placeholders = retyped + [n for n in split if n not in retyped] + [n for n in missing if n not in split]
    back = {v: k for k, v in pm.items()}
    for name in (n for n in missing if n not in split):
        was = next((q for q in written_for.params if q.name in (name, back.get(name))), None)
        had = " (it had a default in the signature the call was written for)"
        notes.append(
            f"`{name}` is required by `{pin.name}` and no argument maps to it: `{name}={PLACEHOLDER}` "
            "until a person writes the value" + (had if was is not None and was.has_default else "")
        )
    filled = dataclasses.replace(
        drafted, kwargs=kwargs + tuple((n, Arg(PLACEHOLDER, None)) for n in placeholders if n not in retyped)
    )
    left = [p for p in bind(filled, pin).problems if p.kind != "type-mismatch"]  # (types: the check judges)
    if left:
        raise NotMechanical(f"after the rewrite the call still fails: {left[0].message}")
    # New optional parameters among those the call passes: the default may not be what it needs.
    passed = {p.name for p in nb.positional[:keep] if p is not None} | {n for n, _ in kwargs}
    reach = max((j for j, q in enumerate(pin.params) if q.name in passed), default=-1)
    old_names = {q.name for q in written_for.params} | set(pm.values())
    for q in pin.params[:reach]:
        if q.name not in old_names and q.name not in passed and q.name not in placeholders:
            notes.append(f"`{q.name}` is new in `{pin.name}` and not passed (its default applies): check")
    return CallRewrite(
        line=call.line,
        col=call.col,
        display=call.display,
        keep=keep,
        keywords=tuple(keywords),
        dropped=tuple(dropped),
        renamed=tuple(renamed),
        dropped_kw=tuple(dropped_kw),
        placeholders=tuple(placeholders),
        notes=tuple(notes),
        after=tuple(after),
        blank=tuple(retyped),
    )


# -- the source rewrite (libcst) -------------------------------------------------


def rewrite_source(source: str, rewrites: Sequence[CallRewrite]) -> str:
    """`source` with each planned call rewritten; everything else byte for byte as it was.

    Only the statements holding the calls go through libcst (a pure-Python parser, seconds for a
    model file of a thousand lines): each is cut out, dedented, rewritten and put back. A statement
    that cannot be cut out that way (a line of a multi-line string less indented) is rewritten
    within the whole module.
    """
    lines = source.splitlines(keepends=True)
    spans = _statement_spans(source, rewrites)
    if spans is None:
        return _rewrite_module(source, rewrites)
    for lo, hi in sorted(spans, reverse=True):  # from the bottom: the spans above keep their lines
        mine = [r for r in rewrites if lo <= r.line <= hi]
        chunk = lines[lo - 1 : hi]
        indent = chunk[0][: len(chunk[0]) - len(chunk[0].lstrip(" \t"))]
        if not all((line.startswith(indent) and line.strip(" \t") != "\n") or line == "\n" for line in chunk):
            return _rewrite_module(source, rewrites)
        text = "".join(line[len(indent) :] if line != "\n" else line for line in chunk)
        shifted = [dataclasses.replace(r, line=r.line - lo + 1) for r in mine]
        out = _rewrite_module(text, shifted)
        lines[lo - 1 : hi] = [
            indent + line if line != "\n" else line for line in out.splitlines(keepends=True)
        ]
    return "".join(lines)


def _statement_spans(source: str, rewrites: Sequence[CallRewrite]) -> list[tuple[int, int]] | None:
    """(first, last) line of the innermost statement holding each call, overlapping ones merged;
    None when a call's statement is not one (several statements on its line)."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    stmts = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]
    found: list[tuple[int, int]] = []
    for r in rewrites:
        holding = [n for n in stmts if n.lineno <= r.line <= (n.end_lineno or n.lineno)]
        if not holding:
            return None
        span = min(((n.lineno, n.end_lineno or n.lineno) for n in holding), key=lambda s: s[1] - s[0])
        if sum((n.lineno, n.end_lineno or n.lineno) == span for n in holding) > 1:
            return None  # `a; b` on one line: not one statement to cut out
        found.append(span)
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(found):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def _rewrite_module(source: str, rewrites: Sequence[CallRewrite]) -> str:
    import libcst as cst
    from libcst.metadata.position_provider import PositionProvider
    from libcst.metadata.wrapper import MetadataWrapper

    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module)
    todo = {(r.line, r.display): r for r in rewrites}
    done: set[tuple[int, str]] = set()

    class _Rewriter(cst.CSTTransformer):
        METADATA_DEPENDENCIES = (PositionProvider,)

        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
            pos = self.get_metadata(PositionProvider, original).start
            key = (pos.line, module.code_for_node(original.func))
            r = todo.get(key)
            if r is None:
                return updated
            done.add(key)
            return updated.with_changes(args=_new_args(updated.args, r, updated.whitespace_before_args))

    out = wrapper.visit(_Rewriter())
    missing = [f"{line}: `{display}(`" for line, display in todo if (line, display) not in done]
    if missing:
        raise NotMechanical(f"call(s) not found in the source as the check saw them: {', '.join(missing)}")
    return out.code


def _splits(
    call: RawCall,
    old: Signature,
    new: Signature,
    keywords: list[tuple[int, str]],
    renamed: list[tuple[str, str]],
    notes: list[str],
) -> tuple[list[str], list[tuple[str, str]]]:
    """Parameters a renamed one was split into: `kv_cache` renamed in place to `kv_cache_k`, with
    `kv_cache_v` inserted beside it. The value passed for the whole (unless None: nothing to split)
    may need dividing, so each new part is a placeholder beside the renamed one, with a note."""
    old_names = {q.name for q in old.params}
    order = [q.name for q in new.params]
    values = [(call.args[i], o, t) for i, t in keywords for o in [_written_name(call, old, i)] if o]
    values += [(a, k, t) for k, t in renamed for kk, a in call.kwargs if kk == k]
    parts: list[str] = []
    after: list[tuple[str, str]] = []
    for a, was, now in values:
        if was == now or a.etype == "None" or not now.startswith(was + "_") or now not in order:
            continue
        j = order.index(now)
        near = [n for n in order[max(0, j - 2) : j + 3] if n != now and n not in old_names]
        siblings = [n for n in near if n.startswith(was + "_")]
        if not siblings:
            continue
        parts += siblings
        after += [(n, now) for n in siblings]
        notes.append(
            f"`{was}` was split into `{now}`, {', '.join(f'`{n}`' for n in siblings)}: `{a.text}` was the "
            f"whole `{was}`; check what `{now}` takes and write " + ", ".join(f"`{n}`" for n in siblings)
        )
    return parts, after


def _written_name(call: RawCall, old: Signature, i: int) -> str | None:
    from pipeline.compat.bind import bind

    p = bind(call, old).positional[i]
    return p.name if p is not None else None


def _retyped(a: Arg, old: Param, new: Param) -> str | None:
    """Why the value written for `old` cannot simply go to `new` (its type no longer fits), or None."""
    from pipeline.compat.bind import type_ok

    if a.etype is not None and type_ok(a.etype, old) and not type_ok(a.etype, new):
        return f"`{a.text}` ({a.etype}) was written for `{old.show()}`; `{new.show()}` takes another type"
    return None


def _keyword(arg: cst.Arg) -> str | None:
    return arg.keyword.value if arg.keyword is not None else None


def _kw(arg: cst.Arg, name: str) -> cst.Arg:
    import libcst as cst

    return arg.with_changes(
        keyword=cst.Name(name),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        ),
    )


def _new_args(
    args: Sequence[cst.Arg], r: CallRewrite, opening: cst.BaseParenthesizableWhitespace
) -> list[cst.Arg]:
    import libcst as cst

    positional = [a for a in args if a.keyword is None and not a.star]
    explicit = {id(a): i for i, a in enumerate(positional)}
    by_index = dict(r.keywords)
    renamed = dict(r.renamed)
    out: list[tuple[cst.Arg, bool]] = []  # (argument, keeps its own comma)
    for k, a in enumerate(args):
        own = k < len(args) - 1
        i = explicit.get(id(a))
        if i is not None and (i in by_index or i in r.dropped):
            if i in r.dropped:
                continue
            out.append((_kw(a, by_index[i]), own))
        elif a.keyword is not None and a.keyword.value in r.dropped_kw:
            continue
        elif a.keyword is not None and a.keyword.value in renamed:
            out.append((a.with_changes(keyword=cst.Name(renamed[a.keyword.value])), own))
        else:
            out.append((a, own))
    out = [
        (a.with_changes(value=cst.Name(PLACEHOLDER)) if _keyword(a) in r.blank else a, own) for a, own in out
    ]
    names_seen = {a.keyword.value for a, _ in out if a.keyword is not None}
    if set(renamed.values()) - names_seen - {by_index.get(i, "") for i in range(len(positional))}:
        raise NotMechanical("a keyword to rename is not written out in the call (a `**` dict?)")
    anchors = dict(r.after)
    for name in (n for n in r.placeholders if n not in r.blank):
        placeholder = cst.Arg(value=cst.Name(PLACEHOLDER))
        at = next((j for j, (a, _) in enumerate(out) if a.star == "**"), len(out))
        anchor = anchors.get(name)
        if anchor is not None:  # right after the parameter it was split from
            at = next((j + 1 for j, (a, _) in enumerate(out) if a.keyword and a.keyword.value == anchor), at)
            while at < len(out) and _keyword(out[at][0]) in anchors:
                at += 1  # (after the other parts already placed)
        out.insert(at, (_kw(placeholder, name), False))
    sep: cst.Comma | cst.MaybeSentinel = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if isinstance(opening, cst.ParenthesizedWhitespace):  # `f(\n    x,\n)`: one argument per line
        sep = cst.Comma(whitespace_after=opening)
    if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma):
        sep = args[-2].comma  # the call's own separator (a newline and its indent, when one per line)
        ws = sep.whitespace_after
        if isinstance(ws, cst.ParenthesizedWhitespace) and ws.first_line.comment is not None:
            # (without that line's comment: it belongs to its own argument)
            first = ws.first_line.with_changes(comment=None, whitespace=cst.SimpleWhitespace(""))
            sep = sep.with_changes(whitespace_after=ws.with_changes(first_line=first))
    last = args[-1].comma if args else cst.MaybeSentinel.DEFAULT
    fixed: list[cst.Arg] = []
    for j, (a, own) in enumerate(out):
        if j == len(out) - 1:
            fixed.append(a.with_changes(comma=last))
        elif own and isinstance(a.comma, cst.Comma):
            fixed.append(a)
        else:
            fixed.append(a.with_changes(comma=sep))
    return fixed


# -- the patch file --------------------------------------------------------------


def unified_diff(path: str, before: str, after: str) -> str:
    """A git-style diff of one file (what `git apply` and the series parser read)."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}", n=3
    )
    body = "".join(lines)
    return f"diff --git a/{path} b/{path}\n{body}" if body else ""


_SLUG = re.compile(r"[^A-Za-z0-9]+")


def slug(text: str) -> str:
    return _SLUG.sub("-", text).strip("-").lower()[:60] or "draft"


def placeholders_in(patch: Patch) -> list[str]:
    """`path:line` of every line the patch adds that still holds a draft placeholder."""
    found: list[str] = []
    for f in patch.files:
        for h in f.hunks:
            n = h.new_start
            for line in h.lines:
                if line.startswith("+"):
                    if PLACEHOLDER in line:
                        found.append(f"{f.path}:{n} `{line[1:].strip()}`")
                    n += 1
                elif line.startswith(" ") or line == "":
                    n += 1
    return found


def is_draft(patch: Patch) -> bool:
    return (patch.field("Status") or "").strip().lower() == "draft"


def header(fields: Iterable[tuple[str, str]]) -> str:
    return "".join(f"{k}: {v}\n" for k, v in fields)


# -- drafting a series -----------------------------------------------------------


@dataclass(frozen=True)
class Draft:
    """One draft patch: the calls of one aiter function broken by one aiter commit."""

    name: str  # the patch file's name in the series
    text: str  # the patch file
    function: str
    sites: tuple[str, ...]  # "path:line" of each call rewritten
    placeholders: tuple[str, ...]  # "path:line `name=PIPELINE_DRAFT_TODO`" in the drafted tree
    notes: tuple[str, ...]
    cause: str | None  # the aiter commit


@dataclass(frozen=True)
class Skipped:
    path: str
    line: int
    function: str
    kind: str
    reason: str


@dataclass(frozen=True)
class DraftResult:
    drafts: tuple[Draft, ...]
    skipped: tuple[Skipped, ...]
    files: dict[str, str]  # path -> drafted text (every draft applied; placeholders included)

    def to_json(self) -> dict[str, object]:
        return {
            "drafts": [
                {
                    "name": d.name,
                    "function": d.function,
                    "sites": list(d.sites),
                    "cause": d.cause,
                    "placeholders": list(d.placeholders),
                    "notes": list(d.notes),
                }
                for d in self.drafts
            ],
            "not_mechanical": [
                {"path": s.path, "line": s.line, "function": s.function, "kind": s.kind, "reason": s.reason}
                for s in self.skipped
            ],
        }


def draft_fixes(
    atom: GitRepo,
    atom_sha: str,
    aiter: GitRepo,
    aiter_sha: str,
    findings: Sequence[Finding],
    *,
    range_start: str,
    command: str,
    date: datetime,
    first_number: int = 1,
    cache_dir: Path | None = None,
) -> DraftResult:
    """A draft per (aiter function, cause commit) for the error findings whose fix is mechanical.

    `atom_sha` is the tree the findings are about (the pin, or the pin with the series applied);
    `range_start` the ATOM commit the drafts' X-Atom-Range starts at (the pin).
    """
    from pipeline.compat.aiterapi import TORCH_OPS, ApiIndex
    from pipeline.compat.calls import scan_file
    from pipeline.compat.checker import AITER_PREFIX, target_of
    from pipeline.compat.pysource import SummaryCache, Tree

    cache = SummaryCache.open("aiter", cache_dir)
    indexes: dict[str, ApiIndex] = {}

    def sig(sha: str, call: RawCall) -> Signature | None:
        if sha not in indexes:
            indexes[sha] = ApiIndex(Tree.load(aiter, sha, prefix=AITER_PREFIX), cache)
        t = target_of(indexes[sha], call)
        return t.sig if t.kind in ("func", "class") else None

    sources: dict[str, str] = {}
    scanned: dict[str, dict[tuple[int, int], RawCall]] = {}
    groups: dict[tuple[str, str], list[tuple[Finding, CallRewrite]]] = {}
    skipped: list[Skipped] = []
    for f in findings:
        if f.severity != "error":
            continue

        def skip(reason: str, f: Finding = f) -> None:
            skipped.append(Skipped(f.path, f.line, f.function, f.kind, reason))

        if f.kind not in MECHANICAL_KINDS:
            skip(f"{f.kind}: a person chooses what replaces it")
            continue
        if f.written_against is None:
            skip("the signature the call was written for is not known")
            continue
        if f.path not in scanned:
            data = atom.read_blob(atom_sha, f.path)
            if data is None:
                skip("the file is not in the ATOM tree")
                continue
            sources[f.path] = data.decode("utf-8")
            scanned[f.path] = {(c.line, c.col): c for c in scan_file(data, f.path).calls}
        call = scanned[f.path].get((f.line, f.col))
        if call is None:
            skip("the call is not where the check saw it")
            continue
        if call.ref[0] == TORCH_OPS:
            skip("a torch.ops call: its schema is the op's, not a Python signature to map")
            continue
        old, new = sig(f.written_against, call), sig(aiter_sha, call)
        if old is None or new is None:
            skip("the signature it was written for, or the pin's, cannot be read")
            continue
        try:
            rw = plan_call(call, old, new)
        except NotMechanical as e:
            skip(str(e))
            continue
        if not (rw.keywords or rw.dropped or rw.renamed or rw.dropped_kw or rw.placeholders):
            skip("nothing to rewrite: the arguments already land where they were written for")
            continue
        cause = f.cause.commit.sha if f.cause else ""
        groups.setdefault((f.function, cause), []).append((f, rw))
    cache.save()
    drafts: list[Draft] = []
    done: dict[str, list[CallRewrite]] = {}  # rewrites of earlier drafts, per file
    current = dict(sources)
    number = first_number
    for (function, cause), items in groups.items():
        diffs: list[str] = []
        placeholders: list[str] = []
        paths = sorted({f.path for f, _ in items})
        for path in paths:
            mine = [rw for f, rw in items if f.path == path]
            try:
                after = rewrite_source(sources[path], [*done.get(path, []), *mine])
            except NotMechanical as e:
                skipped.extend(Skipped(f.path, f.line, f.function, f.kind, str(e)) for f, _ in items)
                diffs = []
                break
            diffs.append(unified_diff(path, current[path], after))
            placeholders += [
                f"{path}:{n} `{line.strip()}`"
                for n, line in enumerate(after.splitlines(), 1)
                if PLACEHOLDER in line and line not in current[path].splitlines()
            ]
            current[path] = after
            done.setdefault(path, []).extend(mine)
        if not diffs:
            continue
        name = f"{number:04d}-draft-{slug(function.rsplit('.', 1)[-1])}.patch"
        number += 1
        finding0 = items[0][0]
        notes = tuple(f"{f.path}:{f.line}: {n}" for f, rw in items for n in rw.notes)
        text = _patch_text(
            items, function, cause, finding0, notes, placeholders, diffs,
            atom_sha=atom_sha, aiter_sha=aiter_sha, range_start=range_start, command=command, date=date,
        )  # fmt: skip
        drafts.append(
            Draft(
                name=name,
                text=text,
                function=function,
                sites=tuple(f"{f.path}:{f.line}" for f, _ in items),
                placeholders=tuple(placeholders),
                notes=notes,
                cause=cause or None,
            )
        )
    return DraftResult(tuple(drafts), tuple(skipped), {p: t for p, t in current.items() if t != sources[p]})


def _patch_text(
    items: list[tuple[Finding, CallRewrite]],
    function: str,
    cause: str,
    first: Finding,
    notes: tuple[str, ...],
    placeholders: list[str],
    diffs: list[str],
    *,
    atom_sha: str,
    aiter_sha: str,
    range_start: str,
    command: str,
    date: datetime,
) -> str:
    short = function.rsplit(".", 1)[-1]
    fields = [
        ("From", "atom-image-pipeline (patch draft) <atom-image-pipeline@users.noreply.github.com>"),
        ("Date", format_datetime(date)),
        ("Subject", f"DRAFT: {short}: follow aiter {cause[:10] or aiter_sha[:10]} ({len(items)} call(s))"),
        ("Status", "draft"),
        ("Origin", "vendor"),
        ("Forwarded", "no"),
        ("Last-Update", date.strftime("%Y-%m-%d")),
        ("X-Atom-Range", f"{range_start[:12]}.."),
        *([("X-Aiter-After", cause[:12])] if cause else []),
        ("X-Patch-Version", "1"),
    ]
    body = [
        f"Drafted by `{command}` (ATOM {atom_sha[:10]} × aiter {aiter_sha[:10]}), for:",
        "",
    ]
    for f, _ in items:
        body.append(f"  {f.path}:{f.line}: [{f.kind}] {f.message}")
    if first.cause is not None:
        c = first.cause.commit
        body += ["", f'Cause: aiter {c.sha} ("{c.subject}").']
    body += [
        "",
        f"Each argument is mapped to the parameter it was written for (aiter "
        f"{(first.written_against or '?')[:10]}), then to that parameter in aiter {aiter_sha[:10]}.",
    ]
    if notes:
        body += ["", "Review:"] + [f"  - {n}" for n in notes]
    if placeholders:
        body += ["", "Placeholders (`pipeline patch apply` refuses this draft until each is replaced):"]
        body += [f"  - {p}" for p in placeholders]
    stat = "".join(diffs)
    return header(fields) + "\n" + "\n".join(body) + "\n---\n" + stat


def drafted_commit(atom: GitRepo, base: str, files: dict[str, str], date: datetime) -> str:
    """A commit of `base` with `files` replaced (objects in the ATOM store, no ref, no work tree), so
    the check can read the drafted tree as it reads a patched one."""
    import tempfile

    from pipeline.errors import PatchError

    def must(*args: str, env: dict[str, str]) -> str:
        res = atom.run(*args, env=env)
        if not res.ok:
            raise PatchError(f"cannot build the drafted tree: git {args[0]}: {res.stderr.strip()}")
        return res.stdout.strip()

    with tempfile.TemporaryDirectory(prefix="pipeline-draft-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        must("read-tree", base, env=env)
        for k, (path, text) in enumerate(sorted(files.items())):
            src = Path(tmp) / f"f{k}"
            src.write_text(text, encoding="utf-8")
            blob = must("hash-object", "-w", str(src), env=env)
            mode = must("ls-tree", base, "--", path, env=env).split(" ", 1)[0] or "100644"
            must("update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}", env=env)
        tree = must("write-tree", env=env)
        stamp = {
            **env,
            "GIT_AUTHOR_NAME": "atom-image-pipeline",
            "GIT_AUTHOR_EMAIL": "atom-image-pipeline@users.noreply.github.com",
            "GIT_COMMITTER_NAME": "atom-image-pipeline",
            "GIT_COMMITTER_EMAIL": "atom-image-pipeline@users.noreply.github.com",
            "GIT_AUTHOR_DATE": date.isoformat(),
            "GIT_COMMITTER_DATE": date.isoformat(),
        }
        return must("commit-tree", tree, "-p", base, "-m", "pipeline patch draft (not kept)", env=stamp)
