"""Validation sweep of `pipeline check` on real history, by hand (never in CI: it needs the mirrors).

Picks ATOM first-parent commits evenly across its history and pairs each with
aiter as of its date, +7, +30, +60, +90 and +180 days (aiter's first-parent
history of its default branch); with `--changes N`, every Nth ATOM commit is also
paired with every later aiter first-parent commit that changed the layout of a
function it calls (up to `--max-changes` of them, oldest first). Every finding,
and a sample of the calls found clean, is compared with a replay that does not
use the checker's binder: the real argument list (re-read from the ATOM source) is bound with
`inspect.Signature.bind` to a stub `def` built from the real aiter source of the
resolved function, with placeholder values. The replay calls a call broken when

- Python's binding raises (TypeError), or
- a literal argument (`None`, an int, a str...) does not fit the annotation it
  lands on (annotations evaluated with a stand-in `Tensor`), or
- it binds, but a positional argument lands on another parameter than under the
  signature of the aiter as of the date the call's lines were last changed
  (`git blame`): the reference a release engineer would use by hand; unless the argument
  names agree better with the pin's slots and an aiter commit within a day after the call's
  lines gave it those slots (aiter changed to fit the call: a paired change).

A `**mapping` whose keys are not written is bound partially (what is written); a missing
method of an aiter object is replayed by reading the class (and its bases in the same file)
again from the source at the pin.

Agreement is printed as TP/FP/TN/FN (positive: the check reports the call,
error or warning; missing functions/modules are counted apart, the replay
needs a signature; so are notes, calls an `inspect.signature` guard keeps from
running at the pin, which the replay cannot see), with every disagreement listed
for explanation, and the agreement per finding kind.

    python bench/sweep_compat.py [--commits 60] [--sample 4] [--changes 10] [--out sweep.json]
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import random
import sys
import tempfile
import time
import typing
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.compat.calls import RawCall  # noqa: E402
from pipeline.compat.checker import Caches, Checker, FirstParent, target_of  # noqa: E402
from pipeline.gitw import GitRepo  # noqa: E402

ATOM = os.environ.get("ATOM_MIRROR", "")  # bare mirrors, named by the environment
AITER = os.environ.get("AITER_MIRROR", "")
DAY = 86400
BINDING_KINDS = {
    "positional-shift", "too-many-positional", "missing-argument", "unexpected-keyword",
    "duplicate-argument", "positional-only-as-keyword", "type-mismatch",
}  # fmt: skip


class FakeTensor:
    pass


_NS: dict[str, object] = {
    "Tensor": FakeTensor,
    "torch": type("torch", (), {"Tensor": FakeTensor, "dtype": object, "device": object}),
    **{n: getattr(typing, n) for n in ("Optional", "Union", "List", "Tuple", "Dict", "Any", "Sequence")},
    "list": list, "tuple": tuple, "dict": dict, "int": int, "float": float, "str": str, "bool": bool,
}  # fmt: skip


def fits(value: object, tp: object) -> bool | None:
    """Does a literal fit an evaluated annotation? None: cannot tell."""
    if tp is typing.Any:
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        got = [fits(value, a) for a in typing.get_args(tp)]
        return True if any(g is True for g in got) else (None if any(g is None for g in got) else False)
    if tp is type(None):
        return value is None
    if isinstance(tp, type):
        if tp is float and isinstance(value, int):
            return True
        return isinstance(value, tp)
    if origin in (list, tuple, dict):
        return isinstance(value, origin)
    return None


@dataclass
class Replay:
    verdict: str  # "broken" / "clean" / "n/a"
    why: str


def stub_signature(source: bytes, line: int, name: str) -> tuple[inspect.Signature, dict[str, str]] | None:
    """inspect.Signature of the def (or class __init__) at `line`, built by exec of a stub def."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    node: ast.AST | None = None
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.lineno == line:
            node = n
            break
    drop_self = False
    if isinstance(node, ast.ClassDef):
        init = next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)
        if init is None:
            return None
        node, drop_self = init, True
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    args = node.args
    anns: dict[str, str] = {}
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
        if a.annotation is not None:
            anns[a.arg] = ast.unparse(a.annotation)
            if isinstance(a.annotation, ast.Constant) and isinstance(a.annotation.value, str):
                anns[a.arg] = a.annotation.value
        a.annotation = None
    for extra in (args.vararg, args.kwarg):
        if extra is not None:
            extra.annotation = None
    none = ast.Constant(value=None)
    args.defaults = [none for _ in args.defaults]
    args.kw_defaults = [None if d is None else none for d in args.kw_defaults]
    fn = ast.FunctionDef(name="stub", args=args, body=[ast.Pass()], decorator_list=[], returns=None)
    mod = ast.Module(body=[fn], type_ignores=[])
    ast.fix_missing_locations(mod)
    env: dict[str, object] = {}
    exec(compile(mod, "<stub>", "exec"), env)  # a def with no body, defaults and annotations: inert
    sig = inspect.signature(env["stub"])  # type: ignore[arg-type]
    if drop_self or (name and args.args and args.args[0].arg in ("self", "cls") and not args.posonlyargs):
        params = list(sig.parameters.values())[1:]
        sig = sig.replace(parameters=params)
    return sig, anns


def call_node(source: bytes, line: int, col: int, name: str) -> ast.Call | None:
    """The call of `name` starting at (line, col).

    Several calls start there: `f(x).to(y)` (the callee `f` is the inner one) and
    `get_tp_group().all_reduce(x)` (the callee `all_reduce` is the outer one); the
    name the callee is spelled with tells them apart, innermost first.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    hits = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and (n.lineno, n.col_offset + 1) == (line, col)
    ]
    hits.sort(key=lambda n: (n.end_lineno or 0, n.end_col_offset or 0))

    def spelled(n: ast.Call) -> str | None:
        f = n.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None

    return next((n for n in hits if spelled(n) == name), hits[0] if hits else None)


class Arg:
    """A placeholder value that remembers which argument it is."""

    def __init__(self, i: int, value: object = None, literal: bool = False) -> None:
        self.i, self.value, self.literal = i, value, literal


def _converted(node: ast.expr) -> object | None:
    """A value of the type a builtin conversion gives (`int(x)` is an int whatever x is), or None."""
    samples: dict[str, object] = {"int": 0, "float": 0.0, "str": "", "bool": False}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in samples:
        return samples[node.func.id]
    return None


def local_dicts(source: bytes, node: ast.Call) -> dict[str, ast.Dict]:
    """Names the function around `node` assigns a dict literal with constant keys once and never changes
    (`split_params = {"fast_mode": 1}` ... `f(**split_params)`): what their `**` passes."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    fns = [
        n for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and n.lineno <= node.lineno <= (n.end_lineno or 0)
    ]  # fmt: skip
    if not fns:
        return {}
    fn = max(fns, key=lambda n: n.lineno)
    found: dict[str, ast.Dict] = {}
    stores: dict[str, int] = {}
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            stores[n.id] = stores.get(n.id, 0) + 1
        elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name):
            stores[n.value.id] = stores.get(n.value.id, 0) + 2  # changed after it was written
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.attr in ("update", "pop"):
            stores[n.value.id] = stores.get(n.value.id, 0) + 2
        if (
            isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)
            and isinstance(n.value, ast.Dict)
            and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in n.value.keys)
        ):
            found[n.targets[0].id] = n.value
    return {k: v for k, v in found.items() if stores.get(k) == 1}


def bind_call(
    sig: inspect.Signature, node: ast.Call, dicts: dict[str, ast.Dict] | None = None
) -> tuple[inspect.BoundArguments | None, str]:
    pos: list[Arg] = []
    for i, a in enumerate(node.args, 1):
        if isinstance(a, ast.Starred):
            return None, "n/a: *args"
        lit = isinstance(a, ast.Constant) or (
            isinstance(a, ast.UnaryOp) and isinstance(a.operand, ast.Constant)
        )
        conv = _converted(a)
        pos.append(Arg(i, ast.literal_eval(a) if lit else conv, lit or conv is not None))
    kw: dict[str, Arg] = {}
    partial = False  # a `**mapping` whose keys are not written: bind what is (no missing-argument then)
    for k in node.keywords:
        items: list[tuple[str, ast.expr]] = []
        if k.arg is not None:
            items = [(k.arg, k.value)]
        elif isinstance(k.value, ast.Name) and k.value.id in (dicts or {}):
            d = (dicts or {})[k.value.id]
            items = [(x.value, v) for x, v in zip(d.keys, d.values, strict=True)]  # type: ignore[union-attr]
        elif isinstance(k.value, ast.Dict) and all(
            isinstance(x, ast.Constant) and isinstance(x.value, str) for x in k.value.keys
        ):
            items = [(x.value, v) for x, v in zip(k.value.keys, k.value.values, strict=True)]  # type: ignore[union-attr]
        else:
            partial = True
        for name, v in items:
            if name in kw:
                return None, f"TypeError: got multiple values for keyword argument {name!r}"
            lit = isinstance(v, ast.Constant)
            conv = _converted(v)
            kw[name] = Arg(-1, v.value if lit else conv, lit or conv is not None)  # type: ignore[attr-defined]
    try:
        return (sig.bind_partial if partial else sig.bind)(*pos, **kw), ""
    except TypeError as e:
        return None, f"TypeError: {e}"


def named_agree(node: ast.Call, slots: dict[int, str]) -> int:
    """How many positional arguments are spelled like the parameter they land on (`self.final_lse` on
    `final_lse`): what a reader of the call sees it was written for."""
    n = 0
    for i, a in enumerate(node.args, 1):
        spelled = a.attr if isinstance(a, ast.Attribute) else a.id if isinstance(a, ast.Name) else None
        if spelled is not None and i in slots and spelled.lstrip("_") == slots[i].lstrip("_"):
            n += 1
    return n


def landing(b: inspect.BoundArguments) -> dict[int, str]:
    out: dict[int, str] = {}
    for name, v in b.arguments.items():
        vals = v if isinstance(v, tuple) else (v,)
        for x in vals:
            if isinstance(x, Arg) and x.i > 0:
                out[x.i] = name
    return out


def replay(
    checker: Checker, call: RawCall, pin: str, atom_src: bytes, ref_sha: str | None
) -> tuple[Replay, str | None]:
    """The replay's verdict on one call, and the reference aiter used for shifts."""
    t = target_of(checker.index(pin), call)
    if t.sig is None:
        return Replay("n/a", "no signature at the pin"), None
    node = call_node(atom_src, call.line, call.col, call.qualname.rsplit(".", 1)[-1].removesuffix("()"))
    if node is None:
        return Replay("n/a", "call not found in the source"), None
    src = checker.aiter.read_blob(pin, t.sig.path)
    got = stub_signature(src or b"", t.sig.line, t.sig.name)
    if got is None:
        return Replay("n/a", "no def at the signature's line"), None
    sig, anns = got
    dicts = local_dicts(atom_src, node)
    b, err = bind_call(sig, node, dicts)
    if err:
        return Replay("broken" if err.startswith("TypeError") else "n/a", err), None
    assert b is not None
    for name, v in b.arguments.items():
        if isinstance(v, Arg) and v.literal and name in anns:
            try:
                tp = eval(anns[name], dict(_NS))  # an annotation from aiter's source
            except Exception:
                continue
            p = sig.parameters[name]
            if v.value is None and p.default is None and p.default is not inspect.Parameter.empty:
                continue  # `x: Tensor = None` accepts None
            if fits(v.value, tp) is False:
                return Replay("broken", f"literal {v.value!r} lands on `{name}: {anns[name]}`"), None
    if ref_sha is None:
        return Replay("clean", "binds; no blame reference"), None
    rt = target_of(checker.index(ref_sha), call)
    if rt.sig is None:
        return Replay("clean", "binds; no signature at the blame-date aiter"), ref_sha
    rsrc = checker.aiter.read_blob(ref_sha, rt.sig.path)
    rgot = stub_signature(rsrc or b"", rt.sig.line, rt.sig.name)
    if rgot is None:
        return Replay("clean", "binds; reference not rebuilt"), ref_sha
    rb, rerr = bind_call(rgot[0], node, dicts)
    if rb is None:
        return Replay("clean", f"binds; did not bind at the blame-date aiter either ({rerr})"), ref_sha
    now, then = landing(b), landing(rb)
    new_names, ref_names = list(sig.parameters), list(rgot[0].parameters)

    def renamed(old: str, new: str | None) -> bool:  # the same slot under a new name
        return (
            new is not None and old not in new_names and new not in ref_names
            and ref_names.index(old) == new_names.index(new)
        )  # fmt: skip

    moved = [i for i, n in then.items() if now.get(i) != n and not renamed(n, now.get(i))]
    if moved:
        # the argument names say the pin's slots are the intended ones: did aiter change to fit the call?
        paired = (
            paired_change(checker, call, node, pin, now, dicts)
            if named_agree(node, now) > named_agree(node, then)
            else None
        )
        if paired is not None:
            why = f"binds; aiter {paired[:10]} changed to fit the call within a day of it (a paired change)"
            return Replay("clean", why), ref_sha
        i = moved[0]
        return Replay("broken", f"argument {i} written for `{then[i]}` now lands on `{now.get(i)}`"), ref_sha
    return Replay("clean", "binds, same slots as at the blame date"), ref_sha


PAIRED = DAY  # an aiter change this soon after the call's lines, giving it the pin's slots, was made for it


def paired_change(
    checker: Checker, call: RawCall, node: ast.Call, pin: str, now: dict[int, str], dicts: dict[str, ast.Dict]
) -> str | None:
    """An aiter first-parent commit (up to the pin) within `PAIRED` after the call's lines were written that
    changed the callee's file so that the call binds with the slots it has at the pin: aiter changed to fit
    the call (its commit says so: "num_kv_splits is trailing+optional so the ATOM call site ... stays
    aligned"). Read from the file's source at each such commit, not from the check's signatures."""
    written = checker.written_time(call)
    t = target_of(checker.index(pin), call)
    if written is None or t.sig is None:
        return None
    pin_time = next((ts for ts, sha in checker.first_parent.commits if sha == pin), None)
    window = sorted(
        (ts, sha)
        for ts, sha in checker.first_parent.commits
        if written < ts <= written + PAIRED and (pin_time is None or ts <= pin_time)
    )
    for _, sha in window:
        src = checker.aiter.read_blob(sha, t.sig.path)
        try:
            tree = ast.parse(src or b"")
        except SyntaxError:
            continue
        d = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == t.sig.name), None)
        got = stub_signature(src or b"", d.lineno, d.name) if d is not None else None
        b = bind_call(got[0], node, dicts)[0] if got is not None else None
        if b is not None and landing(b) == now:
            return sha
    return None


def replay_missing(aiter: GitRepo, pin: str, qualname: str, kind: str) -> Replay:
    """Is the missing function/module really absent from aiter's tree at the pin (by `git grep`)?"""
    parts = qualname.split(".")
    if kind == "missing-module":
        for i in range(len(parts), 1, -1):
            base = "/".join(parts[:i])
            for path in (f"{base}.py", f"{base}/__init__.py", base):
                if aiter.run("cat-file", "-e", f"{pin}:{path}").ok:
                    if i == len(parts):
                        return Replay("n/a", f"{path} exists at the pin")
                    return Replay("broken", f"no module {'.'.join(parts[: i + 1])} under {base}")
        return Replay("broken", "no such module")
    name = parts[-1]
    got = aiter.run("grep", "-l", "-E", rf"^(async def|def|class) {name}\b|^{name} *=", pin, "--", "aiter/")
    if not got.stdout.strip():
        return Replay("broken", f"no top-level def/class/assignment of `{name}` anywhere in aiter")
    where = ", ".join(p.split(":", 1)[-1] for p in got.stdout.split())
    return Replay("n/a", f"`{name}` is defined in {where}: absent from the module looked up?")


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def replay_missing_member(checker: Checker, call: RawCall, pin: str) -> Replay | None:
    """`obj.m(...)` on an aiter object: does the class (read again from its source at the pin, its bases
    in the same file followed) define `m` as a method, a class attribute or `self.m = ...`? None: not
    a member of an aiter object."""
    t = target_of(checker.index(pin), call)
    if t.kind != "missing" or t.missing_what != "method" or t.cls is None:
        return None
    name, cls = call.ref[1][-1], t.cls  # the class the check looked the method up in
    try:
        tree = ast.parse(checker.aiter.read_blob(pin, cls.path) or b"")
    except SyntaxError:
        return Replay("n/a", f"{cls.path} does not parse")
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def members(c: ast.ClassDef) -> set[str]:
        out: set[str] = set()
        for n in c.body:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                out.add(n.name)
            elif isinstance(n, ast.Assign):
                out |= {t.id for t in n.targets if isinstance(t, ast.Name)}
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                out.add(n.target.id)
        for n in ast.walk(c):
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and _is_self(n.value):
                out.add(n.attr)
        return out

    todo, seen = [cls.name], set()
    while todo:
        c = classes.get(todo.pop())
        if c is None or c.name in seen:
            continue
        seen.add(c.name)
        got = members(c)
        if name in got:
            return Replay("clean", f"`{c.name}` defines `{name}` at the pin ({cls.path})")
        if "__getattr__" in got or "__getattribute__" in got:
            return Replay("n/a", f"`{c.name}` has a __getattr__ hook")
        for base in c.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                todo.append(base.id)
            elif not (isinstance(base, ast.Name) and base.id in ("object", "ABC", "Generic")):
                return Replay("n/a", f"base `{ast.unparse(base)}` of `{c.name}` not in {cls.path}")
    return Replay("broken", f"`{cls.name}` (and its bases in {cls.path}) defines no `{name}` at the pin")


def pick_commits(atom: GitRepo, n: int) -> list[str]:
    # commits that change the package (the oldest first-parent ones predate it)
    shas = atom.git("rev-list", "--first-parent", "--reverse", "HEAD", "--", "atom/").split()
    if len(shas) <= n:
        return shas
    step = (len(shas) - 1) / (n - 1)
    return [shas[round(i * step)] for i in range(n)]


def layout_changes(checker: Checker, baseline: str, when: int) -> list[str]:
    """aiter first-parent commits after `when` (oldest first) that changed the layout of a function the
    ATOM commit calls (resolved at `baseline`, the aiter as of its date)."""
    from pipeline.compat.evidence import layout

    idx = checker.index(baseline)
    callees = {
        (t.sig.path, t.sig.name)
        for fc in checker.files
        for c in fc.calls
        if (t := target_of(idx, c)).kind == "func" and t.sig is not None
    }
    checker.hist.use_first_parent(checker.tip, checker.first_parent.commits, "aiter/")
    found: dict[str, int] = {}
    for path, name in sorted(callees):
        versions = [v for v in checker.hist.file_log(checker.tip, path) if v.commit.date.timestamp() > when]
        prev = checker._sig_in_file(baseline, path, name)
        for v in reversed(versions):  # oldest first
            s = checker.hist.sig_at(path, v.blob, name)
            if s is not None and prev is not None and layout(s) != layout(prev):
                found[v.commit.sha] = int(v.commit.date.timestamp())
            prev = s if s is not None else prev
    return sorted(found, key=lambda sha: found[sha])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=60)
    ap.add_argument("--sample", type=int, default=4, help="clean calls replayed per pair")
    ap.add_argument("--offsets", default="0,7,30,60,90,180", help="days after the ATOM commit")
    ap.add_argument("--changes", type=int, default=0, help="every Nth ATOM commit: also each layout change")
    ap.add_argument("--max-changes", type=int, default=40, help="layout-change pins per ATOM commit")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("sweep.json"))
    args = ap.parse_args(argv)
    if not (ATOM and AITER and Path(ATOM).is_dir() and Path(AITER).is_dir()):
        raise SystemExit(
            "sweep_compat: set ATOM_MIRROR and AITER_MIRROR to bare mirrors of ROCm/ATOM and ROCm/aiter"
        )
    atom, aiter = GitRepo(ATOM), GitRepo(AITER)
    tip = aiter.rev_parse("HEAD")
    assert tip is not None
    cache_dir = args.cache_dir or Path(tempfile.mkdtemp(prefix="sweep-cache-"))
    rng = random.Random(12)
    fp = FirstParent(aiter, tip)
    offsets = [int(x) for x in args.offsets.split(",")]
    rows: list[dict[str, object]] = []
    counts = {"TP": 0, "FP": 0, "TN": 0, "FN": 0}
    by_kind: dict[str, dict[str, int]] = {}  # finding kind ("clean": none) -> cell -> count
    apart = {"missing": 0, "n/a": 0, "guarded": 0}
    t0 = time.perf_counter()
    caches = Caches.open(cache_dir)
    for k, atom_sha in enumerate(pick_commits(atom, args.commits)):
        info = atom.commit_info(atom_sha)
        when = int(info.date.timestamp())
        checker = Checker(atom, atom_sha, aiter, caches, tip=tip)
        srcs: dict[str, bytes] = {}
        pins = []
        for d in offsets:
            p = fp.as_of(when + d * DAY)
            if p is not None and p not in pins:
                pins.append(p)
        if args.changes and k % args.changes == 0 and pins:
            for p in layout_changes(checker, pins[0], when)[: args.max_changes]:
                if p not in pins:
                    pins.append(p)
        for pin in pins:
            t1 = time.perf_counter()
            report = checker.check(pin)
            # `f(x).to(y)`: two calls start at one place, told apart by the callee
            flagged = {(f.path, f.line, f.col, f.function): f for f in report.findings}
            calls = [c for fc in checker.files for c in fc.calls if not c.star_args]
            todo = [(c, f) for c in calls if (f := flagged.get((c.path, c.line, c.col, c.qualname)))]
            idx = checker.index(pin)
            clean = [  # calls the check bound and found clean (unchecked ones have no signature to replay)
                c for c in calls
                if (c.path, c.line, c.col, c.qualname) not in flagged and target_of(idx, c).sig is not None
            ]  # fmt: skip
            todo += [(c, None) for c in rng.sample(clean, min(args.sample, len(clean)))]
            for call, f in todo:
                if f is not None and f.severity == "note":
                    apart["guarded"] += 1  # not reached at this pin: the replay cannot see the guard
                    rows.append({"cell": "note", "atom": atom_sha[:10], "aiter": pin[:10], "path": call.path,
                                 "line": call.line, "function": call.qualname,
                                 "check": f.message})  # fmt: skip
                    print(f"  note {atom_sha[:10]} × {pin[:10]} {call.path}:{call.line}: {f.message[:200]}")
                    continue
                if f is not None and f.kind not in BINDING_KINDS:
                    rep = (
                        replay_missing_member(checker, call, pin) if f.kind == "missing-function" else None
                    ) or replay_missing(aiter, pin, f.function, f.kind)
                    if rep.verdict == "clean":
                        counts["FP"] += 1
                        by_kind.setdefault(f.kind, {}).setdefault("FP", 0)
                        by_kind[f.kind]["FP"] += 1
                        rows.append({"cell": "FP", "atom": atom_sha[:10], "aiter": pin[:10],
                                     "path": call.path, "line": call.line, "function": call.qualname,
                                     "replay": rep.why,
                                     "check": f"{f.severity} {f.kind}: {f.message}"})  # fmt: skip
                        print(f"  FP {atom_sha[:10]} × {pin[:10]} {call.path}:{call.line} {call.qualname}")
                        print(f"     replay: {rep.why}")
                        continue
                    if rep.verdict != "broken":
                        apart["missing"] += 1
                        print(
                            f"  ?  {atom_sha[:10]} × {pin[:10]} {call.path}:{call.line} {f.kind}: {rep.why}"
                        )
                        continue
                    counts["TP"] += 1
                    rows.append({"cell": "TP", "atom": atom_sha[:10], "aiter": pin[:10], "path": call.path,
                                 "line": call.line, "function": call.qualname, "replay": rep.why,
                                 "check": f"{f.severity} {f.kind}: {f.message}"})  # fmt: skip
                    continue
                if call.path not in srcs:
                    srcs[call.path] = atom.read_blob(atom_sha, call.path) or b""
                written = checker.written_time(call)
                ref = checker.first_parent.as_of(written) if written is not None else None
                rep, _ = replay(checker, call, pin, srcs[call.path], ref)
                if rep.verdict == "n/a":
                    apart["n/a"] += 1
                    rows.append({"cell": "n/a", "atom": atom_sha[:10], "aiter": pin[:10], "path": call.path,
                                 "line": call.line, "function": call.qualname, "replay": rep.why,
                                 "check": f"{f.severity} {f.kind}" if f else "clean"})  # fmt: skip
                    continue
                said = f is not None
                truth = rep.verdict == "broken"
                cell = {(True, True): "TP", (True, False): "FP", (False, False): "TN", (False, True): "FN"}[
                    (said, truth)
                ]
                counts[cell] += 1
                by_kind.setdefault(f.kind if f else "clean", {}).setdefault(cell, 0)
                by_kind[f.kind if f else "clean"][cell] += 1
                said_text = f"{f.severity} {f.kind}: {f.message}" if f else "clean"
                row = {
                    "cell": cell, "atom": atom_sha[:10], "aiter": pin[:10], "path": call.path,
                    "line": call.line, "function": call.qualname, "replay": rep.why,
                    "check": said_text,
                    "blame_ref": ref[:10] if ref else None,
                    "written_against": f.written_against[:10] if f and f.written_against else None,
                }  # fmt: skip
                rows.append(row)
                if cell in ("FP", "FN"):
                    print(f"  {cell} {atom_sha[:10]} × {pin[:10]} {call.path}:{call.line} {call.qualname}")
                    print(f"     replay: {rep.why}")
                    print(f"     check:  {said_text[:300]}")
            print(
                f"[{k + 1}/{args.commits}] ATOM {atom_sha[:10]} ({info.iso_date[:10]}) × aiter {pin[:10]}: "
                f"{len(report.errors)} error(s), {len(report.warnings)} warning(s), "
                f"{report.calls_checked} checked; {time.perf_counter() - t1:.1f} s",
                flush=True,
            )
    caches.close()
    caches.save()
    total = sum(counts.values())
    print(
        f"\nagreement over {total} replayed calls: TP {counts['TP']}, FP {counts['FP']}, TN {counts['TN']}, "
        f"FN {counts['FN']}; not replayed: {apart['missing']} missing-function/module "
        f"findings whose name exists elsewhere, "
        f"{apart['n/a']} without a replayable signature, {apart['guarded']} notes (guarded, not reached); "
        f"{time.perf_counter() - t0:.0f} s"
    )
    for kind, cells in sorted(by_kind.items()):
        print(f"  {kind}: " + ", ".join(f"{c} {n}" for c, n in sorted(cells.items())))
    args.out.write_text(
        json.dumps({"counts": counts, "apart": apart, "by_kind": by_kind, "rows": rows}, indent=1)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
