"""`run_check`: every ATOM call of aiter, bound against the pinned aiter's signatures."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.compat.aiterapi import ApiIndex, Signature, Target
from pipeline.compat.bind import bind
from pipeline.compat.calls import FileCalls, RawCall, scan_file
from pipeline.compat.cause import Cause, History, explain, find_cause
from pipeline.compat.pysource import SummaryCache, Tree
from pipeline.compat.report import CauseInfo, CheckReport, Finding, UncheckedCall, Unparseable
from pipeline.errors import SourceError
from pipeline.gitw import GitRepo

ATOM_PREFIX = "atom"
AITER_PREFIX = "aiter"


@dataclass
class Caches:
    """The per-run view of the on-disk summary caches (shared by a search's many checks)."""

    atom: SummaryCache
    aiter: SummaryCache
    cache_dir: Path | None

    @classmethod
    def open(cls, cache_dir: Path | None) -> Caches:
        return cls(SummaryCache.open("atom", cache_dir), SummaryCache.open("aiter", cache_dir), cache_dir)

    def save(self) -> None:
        self.atom.save()
        self.aiter.save()


def _resolve_sha(repo: GitRepo, rev: str, what: str) -> str:
    sha = repo.rev_parse(rev)
    if sha is None:
        raise SourceError(
            f"{what} ref {rev!r} is not a commit in {repo.path}.",
            hint=f"Check the ref, or fetch it into the {what} repository.",
        )
    return sha


def scan_atom(atom: GitRepo, atom_sha: str, caches: Caches) -> list[FileCalls]:
    tree = Tree.load(atom, atom_sha, prefix=ATOM_PREFIX)
    got = caches.atom.get_many(atom, sorted(tree.blobs.items()), scan_file)
    return [got[p] for p in sorted(got)]


def baseline_for(atom: GitRepo, atom_sha: str, aiter: GitRepo, aiter_sha: str) -> str:
    """aiter as of the ATOM commit's date: the newest first-parent ancestor of the pin committed by then."""
    when = atom.commit_info(atom_sha).date
    # aiter's default branch as of that date (the pin may be older than the ATOM commit).
    tip = aiter.rev_parse("HEAD") or aiter_sha
    out = aiter.git("rev-list", "-1", "--first-parent", f"--before={int(when.timestamp())}", tip).strip()
    return out or aiter_sha


def target_of(index: ApiIndex, call: RawCall) -> Target:
    mod, attrs = call.ref
    t = index.resolve_module_path(mod)
    for a in attrs:
        if t.kind in ("missing", "unknown"):
            break
        t = index.attr_of(t, a)
    return t


class Checker:
    """One ATOM commit's calls against one aiter commit (and its baseline)."""

    def __init__(
        self,
        atom: GitRepo,
        atom_sha: str,
        aiter: GitRepo,
        caches: Caches,
        files: list[FileCalls] | None = None,
    ) -> None:
        self.atom = atom
        self.atom_sha = atom_sha
        self.aiter = aiter
        self.caches = caches
        self.files = files if files is not None else scan_atom(atom, atom_sha, caches)
        self.hist = History(aiter, caches.aiter)
        self._index: dict[str, ApiIndex] = {}

    def index(self, aiter_sha: str) -> ApiIndex:
        got = self._index.get(aiter_sha)
        if got is None:
            got = ApiIndex(Tree.load(self.aiter, aiter_sha, prefix=AITER_PREFIX), self.caches.aiter)
            self._index[aiter_sha] = got
        return got

    def check(self, aiter_sha: str, baseline_sha: str | None, *, with_causes: bool = True) -> CheckReport:
        t0 = time.perf_counter()
        idx = self.index(aiter_sha)
        base_idx = self.index(baseline_sha) if baseline_sha and baseline_sha != aiter_sha else None
        findings: list[Finding] = []
        unchecked: list[UncheckedCall] = []
        checked = 0
        unparseable = [Unparseable("atom", f.path, f.error) for f in self.files if f.error]
        for fc in self.files:
            for u in fc.unchecked:
                unchecked.append(UncheckedCall(u.path, u.line, u.display, u.reason))
            for call in fc.calls:
                t = target_of(idx, call)
                if t.kind in ("func", "class") and t.sig is not None:
                    if call.star_args or call.star_kwargs:
                        unchecked.append(
                            UncheckedCall(call.path, call.line, call.qualname, "*args/**kwargs at the call")
                        )
                        continue
                    checked += 1
                    f = self._check_call(call, t.sig, aiter_sha, baseline_sha, base_idx, with_causes)
                    if f is not None:
                        findings.append(f)
                elif t.kind == "missing":
                    checked += 1
                    findings.append(self._missing(call, t, aiter_sha, baseline_sha, base_idx, with_causes))
                elif t.kind == "module":
                    continue  # calling a module attribute chain that ends on a module is not a call of aiter
                else:
                    reason = {
                        "class": "class whose __init__ is inherited",
                        "value": "callable object, not a function aiter defines",
                        "unknown": "resolved through dynamic attribute access or an unparseable module",
                    }[t.kind]
                    unchecked.append(UncheckedCall(call.path, call.line, call.qualname, reason))
        unparseable += [Unparseable("aiter", p, e) for p, e in idx.unparseable()]
        findings.sort(key=lambda f: (f.path, f.line, f.col))
        return CheckReport(
            findings=findings,
            calls_checked=checked,
            calls_unchecked=len(unchecked),
            unparseable=unparseable,
            atom_sha=self.atom_sha,
            aiter_sha=aiter_sha,
            baseline_aiter_sha=baseline_sha,
            unchecked=unchecked,
            seconds=time.perf_counter() - t0,
        )

    # -- one call ----------------------------------------------------------
    def _check_call(
        self,
        call: RawCall,
        sig: Signature,
        aiter_sha: str,
        baseline_sha: str | None,
        base_idx: ApiIndex | None,
        with_causes: bool,
    ) -> Finding | None:
        b = bind(call, sig)
        defined_at = f"{sig.path}:{sig.line}"
        if not b.ok:
            kind = b.problems[0].kind
            # A type error caused by a shift is reported as what it is.
            cause = self._cause(call, sig, aiter_sha, lambda s: bind(call, s).ok) if with_causes else None
            if cause is not None and "slot" in cause.effect:
                kind = "positional-shift"
            msg = f"`{call.qualname}` call does not match aiter {aiter_sha[:10]}: "
            if cause is not None:
                msg += cause.sentence()
            else:
                msg += "; ".join(p.message for p in b.problems)
                if with_causes:
                    msg += f" (no earlier version of `{sig.name}` in {sig.path} accepts this call either)"
            return Finding(
                call.path, call.line, call.col, call.qualname, "error", kind, msg,
                tuple(p.message for p in b.problems), _cause_info(cause), defined_at,
            )  # fmt: skip
        if base_idx is None:
            return None
        bt = target_of(base_idx, call)
        if bt.kind not in ("func", "class") or bt.sig is None:
            return None
        bb = bind(call, bt.sig)
        if not bb.ok:
            return None  # the call does not match the baseline either: it was not written against it
        if bb.landing() == b.landing():
            return None
        want = bb.landing()
        cause = (
            self._cause(call, sig, aiter_sha, lambda s: bind(call, s).ok and bind(call, s).landing() == want)
            if with_causes
            else None
        )
        if cause is not None:
            change, effect = cause.change, cause.effect
        else:
            change, effect = explain(bt.sig, sig, call, sig.name)
        details = []
        for i, (a, op, np_) in enumerate(zip(call.args, bb.positional, b.positional, strict=True), 1):
            if (op.name if op else None) != (np_.name if np_ else None):
                details.append(
                    f"argument {i} `{a.text}` was written for `{op.name if op else '?'}`, "
                    f"now lands on `{np_.name if np_ else '*args'}`"
                )
        msg = (
            f"`{call.qualname}` call binds without error but its positional arguments land on other "
            f"parameters than under aiter {baseline_sha[:10] if baseline_sha else '?'} (the aiter this ATOM "
            f"commit was written against): "
        )
        msg += cause.sentence() if cause is not None else f"{change}: {effect}"
        return Finding(
            call.path, call.line, call.col, call.qualname, "error", "positional-shift", msg,
            tuple(details), _cause_info(cause), defined_at,
        )  # fmt: skip

    def _cause(self, call: RawCall, sig: Signature, aiter_sha: str, clean: object) -> Cause | None:
        assert callable(clean)
        return find_cause(self.hist, aiter_sha, sig, sig.path, sig.name, call, clean)

    def _missing(
        self,
        call: RawCall,
        t: Target,
        aiter_sha: str,
        baseline_sha: str | None,
        base_idx: ApiIndex | None,
        with_causes: bool,
    ) -> Finding:
        what = t.missing_what or "function"
        kind = "missing-module" if what == "module" else "missing-function"
        sev = "warning" if call.guarded else "error"
        where = f"module `{t.module}`" if what == "module" else f"`{call.qualname}`"
        msg = f"{where} does not exist in aiter {aiter_sha[:10]}"
        if call.guarded:
            msg += (
                " (the call is guarded by hasattr/getattr or an ImportError handler, "
                "so it is skipped at run time)"
            )
        cause_info: CauseInfo | None = None
        if with_causes and what == "function" and t.module:
            idx = self.index(aiter_sha)
            path = idx.mods.get(t.module)
            name = call.ref[1][-1] if call.ref[1] else ""
            if path is not None and name:
                newer = None
                for v in self.hist.file_log(aiter_sha, path):
                    if self.hist.sig_at(path, v.blob, name) is not None:
                        break
                    newer = v
                else:
                    newer = None  # never defined in this file: nothing to blame
                if newer is not None:
                    parent = self.aiter.rev_parse(f"{newer.commit.sha}^1")
                    c = newer.commit
                    cause_info = CauseInfo(c, parent, f"`{name}` removed from {path}", "")
                    msg += (
                        f". Cause: `{name}` removed from {path} by aiter {c.short} "
                        f'({c.date.strftime("%Y-%m-%d")}, "{c.subject}")'
                    )
        return Finding(call.path, call.line, call.col, call.qualname, sev, kind, msg, (), cause_info, None)


def _cause_info(c: Cause | None) -> CauseInfo | None:
    if c is None:
        return None
    return CauseInfo(c.commit, c.last_good, c.change, c.effect)


def run_check(
    atom: GitRepo,
    atom_rev: str,
    aiter: GitRepo,
    aiter_rev: str,
    *,
    baseline_aiter_rev: str | None = None,
    cache_dir: Path | None = None,
) -> CheckReport:
    """Check every ATOM call of aiter at (atom, atom_rev) against aiter at aiter_rev.

    `baseline_aiter_rev` is the aiter the ATOM code was written against (the
    previous lock); by default aiter as of the ATOM commit's date. Calls that
    bind without error but whose positional arguments land on other parameters
    than under the baseline are reported as positional shifts.
    """
    atom_sha = _resolve_sha(atom, atom_rev, "ATOM")
    aiter_sha = _resolve_sha(aiter, aiter_rev, "aiter")
    if baseline_aiter_rev is not None:
        baseline = _resolve_sha(aiter, baseline_aiter_rev, "aiter baseline")
    else:
        baseline = baseline_for(atom, atom_sha, aiter, aiter_sha)
    caches = Caches.open(cache_dir)
    try:
        checker = Checker(atom, atom_sha, aiter, caches)
        return checker.check(aiter_sha, baseline)
    finally:
        caches.save()
