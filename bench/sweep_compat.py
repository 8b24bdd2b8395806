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
  (`git blame`): the reference a release engineer would use by hand.

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

ATOM = os.environ.get("ATOM_MIRROR", "/work/.mirror/ROCm+ATOM/repo")
AITER = os.environ.get("AITER_MIRROR", "/work/.mirror/ROCm+aiter/repo")
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


def bind_call(sig: inspect.Signature, node: ast.Call) -> tuple[inspect.BoundArguments | None, str]:
    pos: list[Arg] = []
    for i, a in enumerate(node.args, 1):
        if isinstance(a, ast.Starred):
            return None, "n/a: *args"
        lit = isinstance(a, ast.Constant) or (
            isinstance(a, ast.UnaryOp) and isinstance(a.operand, ast.Constant)
        )
        pos.append(Arg(i, ast.literal_eval(a) if lit else None, lit))
    kw: dict[str, Arg] = {}
    for k in node.keywords:
        if k.arg is None:
            return None, "n/a: **kwargs"
        lit = isinstance(k.value, ast.Constant)
        kw[k.arg] = Arg(-1, k.value.value if lit else None, lit)  # type: ignore[attr-defined]
    try:
        return sig.bind(*pos, **kw), ""
    except TypeError as e:
        return None, f"TypeError: {e}"


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
    b, err = bind_call(sig, node)
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
    rb, rerr = bind_call(rgot[0], node)
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
        i = moved[0]
        return Replay("broken", f"argument {i} written for `{then[i]}` now lands on `{now.get(i)}`"), ref_sha
    return Replay("clean", "binds, same slots as at the blame date"), ref_sha


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
            flagged = {(f.path, f.line, f.col): f for f in report.findings}
            calls = [c for fc in checker.files for c in fc.calls if not c.star_args and not c.star_kwargs]
            clean = [c for c in calls if (c.path, c.line, c.col) not in flagged]
            todo = [
                (c, flagged.get((c.path, c.line, c.col))) for c in calls if (c.path, c.line, c.col) in flagged
            ]
            todo += [(c, None) for c in rng.sample(clean, min(args.sample, len(clean)))]
            for call, f in todo:
                if f is not None and f.severity == "note":
                    apart["guarded"] += 1  # not reached at this pin: the replay cannot see the guard
                    continue
                if f is not None and f.kind not in BINDING_KINDS:
                    rep = replay_missing(aiter, pin, f.function, f.kind)
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
