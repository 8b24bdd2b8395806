"""`run_check`: every ATOM call of aiter, bound against the pinned aiter's signatures.

Baselines ("the signature the ATOM code was written against"): an explicit
`baseline_aiter_rev` (the previous lock) applies to every call. Without it,
each call gets the aiter of the date its lines were last changed in ATOM
(`git blame`, only for calls that need it) and the aiter of the ATOM commit's
date screens the calls that bind cleanly for positional shifts.

A call that is already broken with the aiter it was written against is an ATOM
bug no aiter pin fixes: it is reported as a pre-existing warning, not as an
incompatibility of the pin.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline.compat.aiterapi import TORCH_OPS, ApiIndex, Signature, Target
from pipeline.compat.bind import Binding, bind
from pipeline.compat.calls import (
    STAR_ONLY,
    FileCalls,
    RawCall,
    atom_ops,
    scan_file,
    unchecked_reason,
    worth_scanning,
)
from pipeline.compat.cause import Cause, History, explain, find_cause, shifted_args
from pipeline.compat.pysource import ReportStore, SummaryCache, Tree
from pipeline.compat.report import CauseInfo, CheckReport, Finding, UncheckedCall, Unparseable
from pipeline.errors import SourceError
from pipeline.gitw import CommitInfo, GitRepo

ATOM_PREFIX = "atom"
AITER_PREFIX = "aiter"


@dataclass
class Caches:
    """The per-run view of the on-disk summary caches (shared by a search's many checks)."""

    atom: SummaryCache
    aiter: SummaryCache
    facts: SummaryCache  # git facts that never change for given SHAs (blame, first-parent dates, logs)
    reports: ReportStore  # whole reports, keyed by every SHA they depend on
    cache_dir: Path | None

    @classmethod
    def open(cls, cache_dir: Path | None) -> Caches:
        return cls(
            SummaryCache.open("atom", cache_dir),
            SummaryCache.open("aiter", cache_dir),
            SummaryCache.open("facts", cache_dir),
            ReportStore("reports", cache_dir),
            cache_dir,
        )

    def save(self) -> None:
        for c in (self.atom, self.aiter, self.facts):
            c.save()


def resolve_sha(repo: GitRepo, rev: str, what: str) -> str:
    sha = repo.rev_parse(rev)
    if sha is None:
        raise SourceError(
            f"{what} ref {rev!r} is not a commit in {repo.path}.",
            hint=f"Check the ref, or fetch it into the {what} repository.",
        )
    return sha


def scan_atom(atom: GitRepo, atom_sha: str, caches: Caches) -> list[FileCalls]:
    tree = Tree.load(atom, atom_sha, prefix=ATOM_PREFIX)
    pairs = sorted(tree.blobs.items())
    missing = [(p, s) for p, s in pairs if f"{s}:{p}" not in caches.atom.data]
    if len(missing) >= PARALLEL_MIN_FILES and (os.cpu_count() or 1) > 1:
        blobs = dict(atom.read_blobs(sorted({s for _, s in missing})))
        for (path, sha), calls in zip(
            missing, _parallel_scan([(p, blobs[s]) for p, s in missing]), strict=True
        ):
            caches.atom.data[f"{sha}:{path}"] = calls
        caches.atom.dirty = True
    got = caches.atom.get_many(atom, pairs, scan_file)
    return [got[p] for p in sorted(got)]


# A cold check parses a hundred ATOM files: split them over the CPUs (fork: no re-import,
# the sources are inherited, only the small per-file results travel back).
PARALLEL_MIN_FILES = 40
_WORK: list[tuple[str, bytes]] = []


def _scan_one(i: int) -> FileCalls:
    path, data = _WORK[i]
    return scan_file(data, path)


def _parallel_scan(work: list[tuple[str, bytes]]) -> list[FileCalls]:
    global _WORK
    todo = [i for i, (_, d) in enumerate(work) if worth_scanning(d)]
    out = [FileCalls(p) for p, _ in work]
    if not todo:
        return out
    try:
        ctx = multiprocessing.get_context("fork")
    except ValueError:  # no fork on this platform
        return [scan_file(d, p) for p, d in work]
    _WORK = work
    todo.sort(key=lambda i: -len(work[i][1]))  # big files first: better balance
    pool = ctx.Pool(min(os.cpu_count() or 2, 4), initializer=_worker_init)
    try:
        for i, fc in zip(todo, pool.imap(_scan_one, todo, chunksize=4), strict=True):
            out[i] = fc
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        _WORK = []
    return out


def _worker_init() -> None:
    # Workers inherit the CLI's handlers (SIGTERM -> KeyboardInterrupt); the parent handles signals.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def aiter_tip(aiter: GitRepo, fallback: str) -> str:
    """aiter's default branch (the pin may be older than the ATOM commit)."""
    return aiter.rev_parse("HEAD") or fallback


class FirstParent:
    """aiter's first-parent history of one tip, (commit time, sha) newest first: "aiter as of a date"."""

    def __init__(self, aiter: GitRepo, tip: str, facts: SummaryCache | None = None) -> None:
        key = f"first-parent:{tip}"
        got = facts.data.get(key) if facts is not None else None
        if got is None:
            out = aiter.git("log", "--first-parent", "--format=%ct %H", tip)
            got = [(int(ts), sha) for ts, sha in (line.split() for line in out.splitlines() if line)]
            if facts is not None:
                facts.data[key] = got
                facts.dirty = True
        self.commits: list[tuple[int, str]] = got

    def as_of(self, when: int) -> str | None:
        # git rev-list --before=T: the newest commit with commit time <= T (first-parent order).
        for ts, sha in self.commits:
            if ts <= when:
                return sha
        return None


def aiter_as_of(aiter: GitRepo, tip: str, when: datetime) -> str | None:
    return FirstParent(aiter, tip).as_of(int(when.timestamp()))


def baseline_for(atom: GitRepo, atom_sha: str, aiter: GitRepo, aiter_sha: str) -> str:
    """aiter as of the ATOM commit's date (newest first-parent commit of aiter's default branch by then)."""
    when = atom.commit_info(atom_sha).date
    return aiter_as_of(aiter, aiter_tip(aiter, aiter_sha), when) or aiter_sha


def target_of(index: ApiIndex, call: RawCall) -> Target:
    return index.resolve_ref(call.ref)


def _day(c: CommitInfo) -> str:
    return c.date.strftime("%Y-%m-%d")


class Checker:
    """One ATOM commit's calls against aiter commits (one check per pin; a search runs many)."""

    def __init__(
        self,
        atom: GitRepo,
        atom_sha: str,
        aiter: GitRepo,
        caches: Caches,
        *,
        tip: str,
        explicit_baseline: str | None = None,
        dated_by: str | None = None,
    ) -> None:
        self.atom = atom
        self.atom_sha = atom_sha
        self.aiter = aiter
        self.caches = caches
        self.tip = tip
        self.explicit_baseline = explicit_baseline
        self.files = scan_atom(atom, atom_sha, caches)
        self.atom_ops = atom_ops(self.files)
        self.op_names = frozenset(c.ref[1][0] for fc in self.files for c in fc.calls if c.ref[0] == TORCH_OPS)
        self.hist = History(aiter, caches.aiter, caches.facts)
        self.first_parent = FirstParent(aiter, tip, caches.facts)
        self._index: dict[str, ApiIndex] = {}
        self._blame: dict[tuple[str, int, int], str | None] = {}
        self._as_of: dict[int, str | None] = {}
        self._fit: dict[tuple[str, int, int], tuple[str, Signature, Binding] | None] = {}
        self.date_baseline = explicit_baseline or self.first_parent.as_of(
            int(atom.commit_info(dated_by or atom_sha).date.timestamp())
        )

    def index(self, aiter_sha: str) -> ApiIndex:
        got = self._index.get(aiter_sha)
        if got is None:
            got = ApiIndex(Tree.load(self.aiter, aiter_sha, prefix=AITER_PREFIX), self.caches.aiter)
            got.op_names = self.op_names
            self._index[aiter_sha] = got
        return got

    def drop_index(self, aiter_sha: str) -> None:
        """Forget an index no baseline needs (a search examines hundreds of commits)."""
        keep = {self.date_baseline, self.explicit_baseline, self.tip, *self._as_of.values()}
        if aiter_sha not in keep:
            self._index.pop(aiter_sha, None)

    # -- baselines -----------------------------------------------------------
    def call_baseline(self, call: RawCall) -> str | None:
        """The aiter the call was written against: explicit, or aiter as of the call's blame date."""
        if self.explicit_baseline:
            return self.explicit_baseline
        key = (call.path, call.line, call.end_line or call.line)
        if key in self._blame:
            return self._blame[key]
        times = self._blame_file(call.path)
        lo, hi = call.line, call.end_line or call.line
        stamps = [times[i] for i in range(lo, hi + 1) if i in times]
        sha: str | None = None
        if stamps:
            ts = max(stamps)
            if ts not in self._as_of:
                self._as_of[ts] = self.first_parent.as_of(ts)
            sha = self._as_of[ts]
        self._blame[key] = sha
        return sha

    def _blame_file(self, path: str) -> dict[int, int]:
        """{line: committer time} for the lines of every aiter call in `path` (one `git blame`)."""
        key = f"blame:{self.atom_sha}:{path}"
        got: dict[int, int] | None = self.caches.facts.data.get(key)
        if got is not None:
            return got
        ranges = sorted(
            {(c.line, c.end_line or c.line) for fc in self.files if fc.path == path for c in fc.calls}
        )
        args = ["blame", "--porcelain"]
        for lo, hi in ranges:
            args += ["-L", f"{lo},{hi}"]
        got = {}
        try:
            out = self.atom.git(*args, self.atom_sha, "--", path)
        except SourceError:
            out = ""
        commit_time: dict[str, int] = {}
        current: tuple[str, int] | None = None
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 3 and len(parts[0]) == 40 and all(ch in "0123456789abcdef" for ch in parts[0]):
                current = (parts[0], int(parts[2]))
            elif line.startswith("committer-time ") and current is not None:
                commit_time[current[0]] = int(parts[1])
            if line.startswith("\t") and current is not None and current[0] in commit_time:
                got[current[1]] = commit_time[current[0]]
        self.caches.facts.data[key] = got
        self.caches.facts.dirty = True
        return got

    # -- the check -----------------------------------------------------------
    def check(self, aiter_sha: str, *, with_causes: bool = True) -> CheckReport:
        t0 = time.perf_counter()
        idx = self.index(aiter_sha)
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
                    if (call.star_args or call.star_kwargs) and not (call.args or call.kwargs):
                        unchecked.append(UncheckedCall(call.path, call.line, call.qualname, STAR_ONLY))
                        continue
                    checked += 1
                    f = self._check_call(call, t.sig, aiter_sha, with_causes)
                    if f is not None:
                        findings.append(f)
                elif t.kind == "missing":
                    checked += 1
                    findings.append(self._missing(call, t, aiter_sha, with_causes))
                elif t.kind in ("module", "foreign"):
                    continue  # a module, or a value of a type that is not aiter's: not a call of aiter
                else:
                    reason = unchecked_reason(call, t, self.atom_ops)
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
            baseline_aiter_sha=self.explicit_baseline or self.date_baseline,
            unchecked=unchecked,
            seconds=time.perf_counter() - t0,
        )

    # -- one call ------------------------------------------------------------
    def _sig_at(self, aiter_sha: str | None, call: RawCall) -> Signature | None:
        if aiter_sha is None:
            return None
        t = target_of(self.index(aiter_sha), call)
        return t.sig if t.kind in ("func", "class") else None

    def fitting_baseline(self, call: RawCall) -> tuple[str, Signature, Binding] | None:
        """The aiter this call was written against: the first baseline under which it binds cleanly.

        In order: the explicit baseline (previous lock) or aiter as of the ATOM
        commit's date; then aiter as of the date the call's lines were last
        changed (`git blame`), for an ATOM that lagged behind aiter.
        """
        key = (call.path, call.line, call.col)
        if key in self._fit:
            return self._fit[key]
        found: tuple[str, Signature, Binding] | None = None
        tried: set[str] = set()
        for which in ("date", "blame"):
            if which == "date":
                sha = self.date_baseline
            else:
                sha = None if self.explicit_baseline else self.call_baseline(call)
            if sha is None or sha in tried:
                continue
            tried.add(sha)
            s = self._sig_at(sha, call)
            if s is None:
                continue
            bb = bind(call, s)
            if bb.ok:
                found = (sha, s, bb)
                break
        self._fit[key] = found
        return found

    def _check_call(
        self,
        call: RawCall,
        sig: Signature,
        aiter_sha: str,
        with_causes: bool,
    ) -> Finding | None:
        b = bind(call, sig)
        defined_at = f"{sig.path}:{sig.line}"
        head = f"`{call.qualname}` call does not match aiter {aiter_sha[:10]}: "
        if not b.ok:
            kind = b.problems[0].kind
            details = tuple(p.message for p in b.problems)
            fit = self.fitting_baseline(call)
            if fit is None:
                against = self.explicit_baseline or self.call_baseline(call) or self.date_baseline
                if against is not None and self._sig_at(against, call) is not None:
                    return Finding(
                        call.path, call.line, call.col, call.qualname, "warning", kind,
                        head + "; ".join(details) + f". Pre-existing: the call fails the same way with aiter "
                        f"{against[:10]}, the aiter it was written against, so no aiter pin fixes it "
                        "(an ATOM bug, probably on a path not run).",
                        details, None, defined_at, preexisting=True, written_against=against,
                    )  # fmt: skip
            base = fit[0] if fit else None
            cause = None
            if with_causes:
                cause = self._cause_back(call, sig, aiter_sha, lambda s: bind(call, s).ok)
                if cause is None and fit is not None:
                    cause = self._cause_forward(call, aiter_sha, fit[0], fit[1], lambda s: bind(call, s).ok)
            if cause is not None and cause.shifted:
                kind = "positional-shift"
            msg = head + (cause.sentence() if cause is not None else "; ".join(details))
            return Finding(
                call.path, call.line, call.col, call.qualname, "error", kind, msg,
                details, _cause_info(cause), defined_at, written_against=base,
            )  # fmt: skip
        # Binds without error: do the arguments land where the author meant them to?
        if self.date_baseline is None or self.date_baseline == aiter_sha:
            if self.explicit_baseline is not None:
                return None
            # Pinned at the ATOM date: only a lagging ATOM (blame baseline) can show a shift.
            st = None
        else:
            st = self._sig_at(self.date_baseline, call)
            if st is not None and bind(call, st).ok and not shifted_args(st, sig, call):
                return None  # lands as under the ATOM-date (or explicit) baseline
        fit = self.fitting_baseline(call)
        if fit is None:
            return None
        base, base_sig, bb = fit
        if not shifted_args(base_sig, sig, call):
            return None  # the same slots (a parameter renamed in place keeps its slot)

        def clean(s: Signature) -> bool:
            return bind(call, s).ok and not shifted_args(base_sig, s, call)

        cause = None
        if with_causes:
            cause = self._cause_back(call, sig, aiter_sha, clean) or self._cause_forward(
                call, aiter_sha, base, base_sig, clean
            )
        shifted: list[str] = []
        for i in shifted_args(base_sig, sig, call):
            a, op, np_ = call.args[i - 1], bb.positional[i - 1], b.positional[i - 1]
            shifted.append(
                f"argument {i} `{a.text}` was written for `{op.name if op else '?'}`, "
                f"now lands on `{np_.name if np_ else '*args'}`"
            )
        msg = (
            f"`{call.qualname}` call binds without error but its positional arguments land on other "
            f"parameters than under aiter {base[:10]} (the aiter it was written against): "
        )
        if cause is not None:
            msg += cause.sentence()
        else:
            change, effect = explain(base_sig, sig, call, sig.name)
            msg += f"{change}: {effect}"
        return Finding(
            call.path, call.line, call.col, call.qualname, "error", "positional-shift", msg,
            tuple(shifted), _cause_info(cause), defined_at, written_against=base,
        )  # fmt: skip

    def _cause_back(
        self, call: RawCall, sig: Signature, aiter_sha: str, clean: Callable[[Signature], bool]
    ) -> Cause | None:
        return find_cause(self.hist, aiter_sha, sig, sig.path, sig.name, call, clean)

    def _cause_forward(
        self,
        call: RawCall,
        aiter_sha: str,
        base: str,
        base_sig: Signature,
        clean: Callable[[Signature], bool],
    ) -> Cause | None:
        """The pin predates the change the call was written for: the oldest later version that fits."""
        if base == aiter_sha or not self.aiter.is_ancestor(aiter_sha, base):
            return None
        after = set(self.aiter.git("rev-list", f"{aiter_sha}..{base}", "--", base_sig.path).split())
        versions = [v for v in self.hist.file_log(base, base_sig.path) if v.commit.sha in after]
        prev_sig = self._sig_at(aiter_sha, call)
        for v in reversed(versions):  # oldest first
            s = self.hist.sig_at(base_sig.path, v.blob, base_sig.name)
            if s is not None and clean(s):
                parent = self.hist.parent(v.commit.sha)
                if prev_sig is None:
                    change, effect = f"`{base_sig.name}` added", ""
                else:
                    change, effect = explain(prev_sig, s, call, base_sig.name)
                return Cause(
                    v.commit, parent, change,
                    "this call was written for that version, which the pinned aiter predates"
                    + (f" ({effect})" if effect else ""),
                    prev_sig, s,
                )  # fmt: skip
        return None

    def _missing(self, call: RawCall, t: Target, aiter_sha: str, with_causes: bool) -> Finding:
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
        name = call.ref[1][-1] if call.ref[1] else ""
        if with_causes and what == "function" and t.module and name:
            idx = self.index(aiter_sha)
            # Where it used to live: the module looked up, or its file under a baseline.
            paths: list[tuple[str, str]] = []
            if t.module in idx.mods:
                paths.append((idx.mods[t.module], name))
            for base in (self.date_baseline, self.call_baseline(call)):
                old = self._sig_at(base, call)
                if old is not None and (old.path, old.name) not in paths:
                    paths.append((old.path, old.name))
            for path, def_name in paths:
                newer = None
                found = False
                for v in self.hist.file_log(aiter_sha, path):
                    if self.hist.sig_at(path, v.blob, def_name) is not None:
                        found = True
                        break
                    newer = v
                if found and newer is not None:
                    c = newer.commit
                    cause_info = CauseInfo(c, self.hist.parent(c.sha), f"`{name}` removed", "")
                    msg += (
                        f". Cause: `{def_name}` removed from {path} by aiter {c.short} "
                        f'({_day(c)}, "{c.subject}")'
                    )
                    break
            if cause_info is None and not call.guarded:
                cause_info, extra = self._added_later(call, aiter_sha, name)
                msg += extra
        if with_causes and what == "module" and t.module:
            base = t.module.replace(".", "/")
            deleted = self._deleted_by(aiter_sha, [f"{base}.py", f"{base}/__init__.py"])
            if deleted is not None:
                c = deleted
                cause_info = CauseInfo(
                    c, self.hist.parent(c.sha), f"module `{t.module}` removed or moved", ""
                )
                msg += f'. Cause: {base}.py removed or moved by aiter {c.short} ({_day(c)}, "{c.subject}")'
        return Finding(call.path, call.line, call.col, call.qualname, sev, kind, msg, (), cause_info, None)

    def _deleted_by(self, aiter_sha: str, paths: list[str]) -> CommitInfo | None:
        key = f"deleted:{aiter_sha}:{','.join(paths)}"
        got = self.caches.facts.data.get(key)
        if got is None:
            out = self.aiter.git(
                "log", "-1", "--first-parent", "-m", "--diff-filter=D",
                "--format=%H%x00%ct%x00%an%x00%s", aiter_sha, "--", *paths,
            ).strip()  # fmt: skip
            got = out or ""
            self.caches.facts.data[key] = got
            self.caches.facts.dirty = True
        if not got:
            return None
        sha, ts, author, subject = got.split("\x00", 3)
        return CommitInfo(sha, datetime.fromtimestamp(int(ts), tz=UTC), subject, author)

    def _added_later(self, call: RawCall, aiter_sha: str, name: str) -> tuple[CauseInfo | None, str]:
        """The function exists in the aiter the call was written against: say which commit added it."""
        base = self.call_baseline(call)
        base_sig = self._sig_at(base, call)
        if base is None or base_sig is None or not self.aiter.is_ancestor(aiter_sha, base):
            return None, ""
        versions = self.hist.file_log(base, base_sig.path)
        added = None
        for v in versions:  # newest first: the oldest version that defines it
            if self.hist.sig_at(base_sig.path, v.blob, base_sig.name) is None:
                break
            added = v
        if added is None:
            return None, ""
        c = added.commit
        parent = self.hist.parent(c.sha)
        info = CauseInfo(c, parent, f"`{name}` added", "the pinned aiter predates it")
        return info, (
            f". The call was written for a newer aiter: `{name}` was added to {base_sig.path} by aiter "
            f'{c.short} ({_day(c)}, "{c.subject}"), which the pinned aiter predates'
        )


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
    dated_by: str | None = None,
) -> CheckReport:
    """Check every ATOM call of aiter at (atom, atom_rev) against aiter at aiter_rev.

    `baseline_aiter_rev` is the aiter the ATOM code was written against (the
    previous lock); by default each call's own (aiter as of when its lines
    were written), screened with aiter as of the ATOM commit's date.
    `dated_by` names the ATOM commit whose date sets that screen when
    `atom_rev` is a patched commit (dated by its patch): the unpatched one.
    """
    atom_sha = resolve_sha(atom, atom_rev, "ATOM")
    aiter_sha = resolve_sha(aiter, aiter_rev, "aiter")
    explicit = resolve_sha(aiter, baseline_aiter_rev, "aiter baseline") if baseline_aiter_rev else None
    tip = aiter_tip(aiter, aiter_sha)
    caches = Caches.open(cache_dir)
    # Everything a report depends on is named by these SHAs (trees and histories are immutable).
    dated = resolve_sha(atom, dated_by, "ATOM") if dated_by else None
    key = f"{atom_sha}:{aiter_sha}:{explicit or ''}:{tip}:{dated or ''}"
    got = caches.reports.get(key)  # a warm run reads this one small file and nothing else
    if isinstance(got, CheckReport):
        return got
    try:
        checker = Checker(atom, atom_sha, aiter, caches, tip=tip, explicit_baseline=explicit, dated_by=dated)
        report = checker.check(aiter_sha)
        caches.reports.put(key, report)
        return report
    finally:
        caches.save()
