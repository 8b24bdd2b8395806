"""`run_check`: every ATOM call of aiter, bound against the pinned aiter's signatures.

"Written against": per call, the signature of the callee the call was written
for, decided from the call's own evidence (`pipeline.compat.evidence`) among the
distinct signatures the function has had, not from the ATOM commit's date. Only
calls with a reason for doubt are examined that way (see `Checker._doubtful`),
so a check stays cheap: one `git blame` of a call's lines and one whole-history
`git log --raw` of aiter, cached per SHA.

A call that is already broken the same way under the signature it was written
for is an ATOM bug no aiter pin fixes: a pre-existing warning. A new, different
problem at the pin is an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from pipeline.compat import incremental
from pipeline.compat.aiterapi import (
    TORCH_OPS,
    ApiIndex,
    Signature,
    Target,
)
from pipeline.compat.bind import Binding, bind
from pipeline.compat.calls import (
    STAR_ONLY,
    FileCalls,
    RawCall,
    SigGuard,
    atom_ops,
    scan_file,
    scan_file_since,
    unchecked_reason,
    worth_scanning,
)
from pipeline.compat.carry import CLEAN, NOT_AITERS, UNCHECKED, Carried, Night, Verdict
from pipeline.compat.cause import Cause, FileVersion, History, explain, find_cause, shifted_args
from pipeline.compat.evidence import Candidate, Fit, agreement, best_fit, layout, problem_keys, tied
from pipeline.compat.guards import guard_holds, params_phrase
from pipeline.compat.pysource import ReportStore, SummaryCache, Tree
from pipeline.compat.report import CauseInfo, CheckReport, Finding, UncheckedCall, Unparseable
from pipeline.compat.workers import PARALLEL_MIN_BYTES, PARALLEL_MIN_FILES, Workers
from pipeline.errors import SourceError, sentence
from pipeline.gitw import CommitInfo, GitRepo, GitSoon

ATOM_PREFIX = "atom"
AITER_PREFIX = "aiter"
ROOT_INIT = "aiter/__init__.py"
# A call with one of these problems raises TypeError whenever it runs, whatever the annotations.
BINDING_ERRORS = frozenset(
    {"too-many-positional", "missing-argument", "unexpected-keyword", "duplicate-argument",
     "positional-only-as-keyword"}
)  # fmt: skip
MAX_VERSIONS = 400  # of one file's history read for the signatures a call may have been written for


@dataclass
class Caches:
    """The per-run view of the on-disk summary caches (shared by a search's many checks)."""

    atom: SummaryCache
    aiter: SummaryCache
    facts: SummaryCache  # git facts that never change for given SHAs (blame, first-parent dates, logs)
    reports: ReportStore  # whole reports, keyed by every SHA they depend on
    cache_dir: Path | None
    nights: ReportStore | None = None  # the last check's verdicts, per pair of repositories
    workers: Workers = dataclasses.field(default_factory=lambda: Workers())

    @classmethod
    def open(cls, cache_dir: Path | None) -> Caches:
        return cls(
            SummaryCache.open("atom", cache_dir),
            SummaryCache.open("aiter", cache_dir),
            SummaryCache.open("facts", cache_dir),
            ReportStore("reports", cache_dir),
            cache_dir,
            ReportStore("nights", cache_dir, keep=8),
        )

    _logs: SummaryCache | None = None  # aiter's whole first-parent history per tip (big: opened lazily)

    def logs(self) -> SummaryCache:
        if self._logs is None:
            self._logs = SummaryCache.open("logs", self.cache_dir)
        return self._logs

    soon: dict[str, GitSoon] = dataclasses.field(default_factory=dict)  # git begun early, not yet read

    def close(self) -> None:
        """Stop the run's workers and early git commands (a search or a check ends, or fails);
        forget what they still owe."""
        self.workers.close()
        self.aiter.pending.clear()
        for started in self.soon.values():
            started.cancel()
        self.soon.clear()

    def save(self) -> None:
        for c in (self.atom, self.aiter, self.facts, self._logs):
            if c is not None:
                c.save()


def begin_tree(caches: Caches, aiter: GitRepo, sha: str) -> None:
    """Begin listing aiter's tree at `sha` for `Checker.index` (cancelled if never read)."""
    key = f"tree:{sha}"
    if key not in caches.soon:
        caches.soon[key] = aiter.soon(*GitRepo.blob_shas_args(sha, AITER_PREFIX))


def resolve_sha(repo: GitRepo, rev: str, what: str) -> str:
    sha = repo.rev_parse(rev)
    if sha is None:
        raise SourceError(
            f"{what} ref {rev!r} is not a commit in {repo.path}.",
            hint=f"Check the ref, or fetch it into the {what} repository.",
        )
    return sha


def scan_atom_stream(
    atom: GitRepo, atom_sha: str, caches: Caches, tree: Tree | None = None
) -> Iterator[tuple[int, FileCalls]]:
    """(position in path order, calls) per ATOM file, as they are ready: cached ones first.

    Begun when called (not when first read): the files to parse are handed to other processes
    at once, and parsed while the checker reads aiter. A cold check parses a hundred files in
    the run's worker processes; the checker binds each file's calls while the workers parse the
    next ones (two cores: neither waits). A night's few changed files are parsed in one forked
    child (`Workers.rescan`), each from its previous version's scan when the cache holds one:
    only the functions that changed are parsed (`scan_file_since`).
    """
    tree = tree or Tree.load(atom, atom_sha, prefix=ATOM_PREFIX)
    pairs = sorted(tree.blobs.items())
    # (keys only: the cached scans are unpickled as they are read, after the child is forked)
    missing = [i for i, (p, s) in enumerate(pairs) if not caches.atom.data.has(f"{s}:{p}")]
    later: Iterable[tuple[int, FileCalls]] = ()  # a night's scans, when a child does them
    elsewhere: set[int] = set()  # the files the child scans
    results = None
    work: list[tuple[str, bytes]] = []
    todo: list[int] = []
    if missing:
        blobs = dict(atom.read_blobs(sorted({pairs[i][1] for i in missing})))
        if len(missing) < PARALLEL_MIN_FILES:
            earlier = _earlier_scans(caches, {pairs[i][0] for i in missing})
            jobs = [(i, pairs[i][0], blobs[pairs[i][1]], earlier.get(pairs[i][0])) for i in missing]
            child = caches.workers.rescan(jobs)
            if child is not None:
                later, missing, elsewhere = child, [], set(missing)
            else:
                for i, path, data, before in jobs:
                    if before is not None:
                        _remember(caches, pairs[i], scan_file_since(data, path, before))
                missing = [i for i in missing if pairs[i][0] not in earlier]
    if missing:
        work = [(pairs[i][0], blobs[pairs[i][1]]) for i in missing]
        todo = [k for k, (_, d) in enumerate(work) if worth_scanning(d)]
        # A cold tree, or a night's few changed files when they are big (ATOM's model files are
        # 200 KB): parsed in the workers while this process binds the calls of the others.
        if len(missing) >= PARALLEL_MIN_FILES or (
            len(todo) >= 2 and sum(len(work[k][1]) for k in todo) >= PARALLEL_MIN_BYTES
        ):
            todo.sort(key=lambda k: -len(work[k][1]))  # big files first: better balance
            results = caches.workers.scan([(k, *work[k]) for k in todo])
        if results is None:  # few or small files, one core or no fork: here
            for i, (path, data) in zip(missing, work, strict=True):
                _remember(caches, pairs[i], scan_file(data, path))
            missing = []
    return _scans(atom, caches, pairs, later, elsewhere | set(missing), missing, work, todo, results)


def _scans(
    atom: GitRepo,
    caches: Caches,
    pairs: list[tuple[str, str]],
    later: Iterable[tuple[int, FileCalls]],
    elsewhere: set[int],
    missing: list[int],
    work: list[tuple[str, bytes]],
    todo: list[int],
    results: Iterable[tuple[int, FileCalls]] | None,
) -> Iterator[tuple[int, FileCalls]]:
    """`scan_atom_stream`'s results: the cached, then the child's, then the workers' as they come."""
    for i, (path, sha) in enumerate(pairs):
        if f"{sha}:{path}" in caches.atom.data:
            yield i, caches.atom.data[f"{sha}:{path}"]
            caches.atom.data.touch(f"{sha}:{path}")  # (used recently: pruning keeps it)
        elif i not in elsewhere:  # kept, but not readable by this code (found when unpickled)
            yield i, _remember(caches, pairs[i], scan_file(next(iter(atom.read_blobs([sha])))[1], path))
    for i, calls in later:
        yield i, _remember(caches, pairs[i], calls)
    if results is None:
        return
    todo_set = set(todo)
    for k, (path, _) in enumerate(work):
        if k not in todo_set:  # cannot call aiter: not parsed
            yield missing[k], _remember(caches, pairs[missing[k]], FileCalls(path))
    for k, calls in results:
        yield missing[k], _remember(caches, pairs[missing[k]], calls)


def _remember(caches: Caches, pair: tuple[str, str], calls: FileCalls) -> FileCalls:
    caches.atom.data[f"{pair[1]}:{pair[0]}"] = calls
    caches.atom.dirty = True
    return calls


def _earlier_scans(caches: Caches, paths: set[str]) -> dict[str, FileCalls]:
    """{path: the newest cached scan of another version of it} (the previous night's, usually)."""
    newest: dict[str, str] = {}
    for key in caches.atom.data:  # (keys only: nothing is unpickled but the scans returned)
        path = key.partition(":")[2]
        if path in paths:
            newest[path] = key  # (insertion order: a later key was stored or used later)
    out: dict[str, FileCalls] = {}
    for path, key in newest.items():
        got = caches.atom.data.get(key)
        if isinstance(got, FileCalls) and got.units:
            out[path] = got
    return out


def _add_times(got: dict[str, int], out: str, prefix: str) -> None:
    """Fold `git log --diff-filter=A --format=%x01%at --name-only` into {path: first time added}."""
    for chunk in out.split("\x01"):
        head, _, names = chunk.partition("\n")
        if not head.strip():
            continue
        for p in names.split():
            if p.startswith(prefix):
                got[p] = min(got.get(p, 1 << 62), int(head))


def aiter_tip(aiter: GitRepo, fallback: str) -> str:
    """aiter's default branch (the pin may be older than the ATOM commit)."""
    return aiter.rev_parse("HEAD") or fallback


class FirstParent:
    """aiter's first-parent history of one tip, (commit time, sha) newest first: "aiter as of a date"."""

    def __init__(self, aiter: GitRepo, tip: str, facts: SummaryCache | None = None) -> None:
        key = f"first-parent:{tip}"
        got = facts.data.get(key) if facts is not None else None
        if got is None and facts is not None:  # the last run's tip is on these first parents: extend it
            for old in incremental.newest(facts.data, "first-parent:")[:1]:
                since = incremental.first_parents_since(aiter, tip, old.split(":", 1)[1])
                if since is not None:
                    got = since + facts.data[old]
        if got is None:
            out = aiter.git("log", "--first-parent", "--format=%ct %H", tip)
            got = [(int(ts), sha) for ts, sha in (line.split() for line in out.splitlines() if line)]
        if facts is not None and key not in facts.data:
            for old in incremental.newest(facts.data, "first-parent:")[incremental.KEEP_TIPS - 1 :]:
                del facts.data[old]  # (the whole history per tip: every run reads them)
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
        self.atom_tree = Tree.load(atom, atom_sha, prefix=ATOM_PREFIX)
        self._scan: Iterator[tuple[int, FileCalls]] | None = scan_atom_stream(
            atom, atom_sha, caches, self.atom_tree
        )
        self._scanned: dict[int, FileCalls] = {}
        self.atom_ops: dict[str, str] = {}
        self.op_names: frozenset[str] = frozenset()
        self.hist = History(aiter, caches.aiter, caches.facts, caches.logs, caches.soon)
        # Read by nearly every check, and git's slowest reads: begun now, on the other core.
        self.hist.start_first_parent_log(tip, AITER_PREFIX + "/")
        self._start_file_added()
        self.first_parent = FirstParent(aiter, tip, caches.facts)
        self._index: dict[str, ApiIndex] = {}
        self._sig_built: set[str] = set()  # commits whose index `_sig_at` built: its answers are kept
        self._as_of: dict[int, str | None] = {}
        self._fit: dict[tuple[str, int, int, str], Fit | None] = {}
        self._runs: dict[tuple[str, str, str, int, int], list[Candidate]] = {}
        self._blob_at: dict[tuple[str, str], str | None] = {}
        self._versions_at: dict[tuple[str, str], tuple[str, list[FileVersion], int]] = {}  # (pin, path)
        self._on_tip: dict[str, bool] = {}
        self._first_parents: set[str] = set()
        self._doubt: dict[tuple[int, int], tuple[RawCall, Signature, bool]] = {}
        self._oldest: dict[tuple[str, str, str, int, int], Signature | None] = {}
        self.date_baseline = explicit_baseline or self.first_parent.as_of(
            int(atom.commit_info(dated_by or atom_sha).date.timestamp())
        )
        if self.date_baseline is not None:  # (its tree is read next: the screen, last night's carry)
            begin_tree(caches, aiter, self.date_baseline)

    def index(self, aiter_sha: str) -> ApiIndex:
        got = self._index.get(aiter_sha)
        if got is None:
            ahead = self.caches.soon.pop(f"tree:{aiter_sha}", None)
            tree = Tree.load(self.aiter, aiter_sha, prefix=AITER_PREFIX, ahead=ahead)
            got = ApiIndex(tree, self.caches.aiter)
            got.op_names = self.op_names
            self._index[aiter_sha] = got
        return got

    def drop_index(self, aiter_sha: str) -> None:
        """Forget an index no baseline needs (a search examines hundreds of commits)."""
        keep = {self.date_baseline, self.explicit_baseline, self.tip, *self._as_of.values()}
        if aiter_sha not in keep:
            self._index.pop(aiter_sha, None)

    # -- when the call was written -------------------------------------------
    def written_time(self, call: RawCall) -> int | None:
        """Committer time of the last change to the call's lines (`git blame` of just those lines)."""
        got = self.written_by(call)
        return got[0] if got is not None else None

    def written_by(self, call: RawCall) -> tuple[int, str] | None:
        """(committer time, ATOM commit) of the last change to the call's lines (`git blame`)."""
        lo, hi = call.line, call.end_line or call.line
        # Keyed by the file's content, not the ATOM commit: a file the next night's commits did not
        # touch blames the same (a nightly check then runs no blame for it).
        blob = self.atom_tree.blobs.get(call.path)
        key = f"blame-by:{call.path}:{blob or self.atom_sha}:{lo}-{hi}"
        if key in self.caches.facts.data:
            cached: tuple[int, str] | None = self.caches.facts.data[key]
            return cached
        try:
            out = self.atom.git("blame", "--porcelain", "-L", f"{lo},{hi}", self.atom_sha, "--", call.path)
        except SourceError:
            out = ""
        got: tuple[int, str] | None = None
        sha = ""
        for line in out.splitlines():
            word = line.split(" ", 1)[0]
            if len(word) == 40 and all(c in "0123456789abcdef" for c in word):
                sha = word
            elif line.startswith("committer-time ") and (got is None or int(line.split()[1]) > got[0]):
                got = (int(line.split()[1]), sha)
        self.caches.facts.data[key] = got
        self.caches.facts.dirty = True
        return got

    def _written_after(self, call: RawCall, cause: Cause | None, fit: Fit) -> str:
        """When the call entered ATOM after the change it does not fit: say so (it was written for the
        older layout, copied from older code or from another project)."""
        if (
            cause is None
            or cause.old_sig is None
            or layout(fit.cand.sig) == layout(cause.new_sig or fit.cand.sig)
        ):
            return ""
        by = self.written_by(call)
        if by is None or by[0] <= cause.commit.date.timestamp():
            return ""
        day = datetime.fromtimestamp(by[0], tz=UTC).strftime("%Y-%m-%d")
        return (
            f". The call, added in ATOM {by[1][:10]} on {day}, fits aiter's signature before "
            f"{cause.commit.short}: it was written after that change, for the older layout"
        )

    def call_baseline(self, call: RawCall) -> str | None:
        """aiter as of the date the call's lines were last changed (or the explicit baseline)."""
        if self.explicit_baseline:
            return self.explicit_baseline
        ts = self.written_time(call)
        return self._aiter_as_of(ts) if ts is not None else None

    def _aiter_as_of(self, ts: int) -> str | None:
        if ts not in self._as_of:
            self._as_of[ts] = self.first_parent.as_of(ts)
        return self._as_of[ts]

    def _added_args(self, base: str | None = None) -> tuple[str, ...]:
        """`git log` of the ATOM files added up to this commit; since `base` when given (then no
        pathspec: with single parents no history simplification applies)."""
        only = (f"^{base}",) if base is not None else ("--", f"{ATOM_PREFIX}/")
        fmt = ("--diff-filter=A", "--no-renames", "--format=%x01%at", "--name-only")
        return ("log", *fmt, self.atom_sha, *only)

    def _start_file_added(self) -> None:
        key = f"added:{self.atom_sha}"
        if key in self.caches.facts.data or key in self.caches.soon:
            return
        for old in incremental.newest(self.caches.facts.data, "added:")[:1]:
            # a previous run's: extended by the commits since (a few, in most runs), both read now
            base = old.split(":", 1)[1]
            if base != self.atom_sha:
                self.caches.soon[f"{key}:chain"] = self.atom.soon(
                    *incremental.linear_args(self.atom_sha, base)
                )
                self.caches.soon[f"{key}:since"] = self.atom.soon(*self._added_args(base))
            return
        self.caches.soon[key] = self.atom.soon(*self._added_args())

    def _added_since(self) -> dict[str, int] | None:
        """The last run's `added` table extended by the commits since, when they are a plain chain."""
        key = f"added:{self.atom_sha}"
        for old in incremental.newest(self.caches.facts.data, "added:")[:1]:
            base = old.split(":", 1)[1]
            chain = incremental.linear_since(
                self.atom, self.atom_sha, base, self.caches.soon.pop(f"{key}:chain", None)
            )
            since = self.caches.soon.pop(f"{key}:since", None)
            if not chain and since is not None:
                since.cancel()  # (nothing since, or not a plain chain: not read)
            if chain is None:
                return None
            got = dict(self.caches.facts.data[old])
            if chain:
                _add_times(
                    got, (since or self.atom.soon(*self._added_args(base))).stdout(), f"{ATOM_PREFIX}/"
                )
            return got
        return None

    def file_added(self, path: str) -> int | None:
        """When the ATOM file first appeared (author time): no call in it is older."""
        key = f"added:{self.atom_sha}"
        got: dict[str, int] | None = self.caches.facts.data.get(key)
        if got is None:
            got = self._added_since()
            if got is None:
                out = (self.caches.soon.pop(key, None) or self.atom.soon(*self._added_args())).stdout()
                got = {}
                _add_times(got, out, "")
            for old in incremental.newest(self.caches.facts.data, "added:")[incremental.KEEP_TIPS - 1 :]:
                del self.caches.facts.data[old]
            self.caches.facts.data[key] = got
            self.caches.facts.dirty = True
        return got.get(path)

    # -- the check -----------------------------------------------------------
    @property
    def files(self) -> list[FileCalls]:
        """Every ATOM file's calls, in path order (the scan finished)."""
        for _ in self._files_as_ready():
            pass
        return [self._scanned[i] for i in sorted(self._scanned)]

    def _files_as_ready(self) -> Iterator[tuple[int, FileCalls]]:
        """(position in path order, calls) per file: the scan's results as they come, the first time."""
        if self._scan is None:
            yield from sorted(self._scanned.items())
            return
        for i, fc in self._scan:
            self._scanned[i] = fc
            yield i, fc
        self._scan = None
        files = [self._scanned[i] for i in sorted(self._scanned)]
        self.atom_ops = atom_ops(files)
        self.op_names = frozenset(c.ref[1][0] for fc in files for c in fc.calls if c.ref[0] == TORCH_OPS)
        for index in self._index.values():
            index.op_names = self.op_names

    # -- the check -----------------------------------------------------------
    def check(self, aiter_sha: str, *, with_causes: bool = True, nightly: bool = False) -> CheckReport:
        """Every call at one pin. `nightly`: carry the last check's plain verdicts that still hold
        (`pipeline.compat.carry`) and leave this one's for the next."""
        t0 = time.perf_counter()
        idx = self.index(aiter_sha)
        findings: list[Finding] = []
        unchecked: list[tuple[tuple[int, int, int], UncheckedCall]] = []  # keyed by where, for path order
        checked = 0
        ops: list[tuple[int, int, RawCall]] = []  # torch.ops calls: bound once every file says its ops
        tonight = Night(self._night_context(), aiter_sha, self.date_baseline, self.tip) if nightly else None
        if nightly:
            self._summarize_ahead(aiter_sha)
        carried = self._last_night(aiter_sha) if nightly else None
        if tonight is not None and carried is not None:
            tonight.before = carried.night  # (its files' verdicts carried unchanged are written as read)
        one = functools.partial(
            self._check_one, idx, aiter_sha=aiter_sha, causes=with_causes, carried=carried, tonight=tonight
        )
        for fi, fc in self._files_as_ready():
            for ui, u in enumerate(fc.unchecked):
                unchecked.append(((fi, 0, ui), UncheckedCall(u.path, u.line, u.display, u.reason)))
            for ci, call in enumerate(fc.calls):
                if call.ref[0] == TORCH_OPS:
                    ops.append((fi, ci, call))
                    continue
                checked += one(call, findings=findings, unchecked=unchecked, where=(fi, 1, ci))
        for fi, ci, call in ops:
            checked += one(call, findings=findings, unchecked=unchecked, where=(fi, 1, ci))
        unparseable = [Unparseable("atom", f.path, f.error) for f in self.files if f.error]
        broken = set(idx.unparseable())
        if tonight is not None:
            broken.update(u for v in tonight.all() for u in v.unparseable)
            self._leave_night(tonight)
        unparseable += [Unparseable("aiter", p, e) for p, e in sorted(broken)]
        findings.sort(key=lambda f: (f.path, f.line, f.col))
        unchecked.sort(key=lambda u: u[0])
        return CheckReport(
            findings=findings,
            calls_checked=checked,
            calls_unchecked=len(unchecked),
            unparseable=unparseable,
            atom_sha=self.atom_sha,
            aiter_sha=aiter_sha,
            baseline_aiter_sha=self.explicit_baseline or self.date_baseline,
            unchecked=[u for _, u in unchecked],
            seconds=time.perf_counter() - t0,
        )

    def _check_one(
        self,
        idx: ApiIndex,
        call: RawCall,
        aiter_sha: str,
        causes: bool,
        findings: list[Finding],
        unchecked: list[tuple[tuple[int, int, int], UncheckedCall]],
        where: tuple[int, int, int],
        carried: Carried | None = None,
        tonight: Night | None = None,
    ) -> int:
        """Bind one call at the pin; 1 when it counts as checked."""
        v = carried.verdict(call) if carried is not None else None
        if v is not None:
            if tonight is not None:
                tonight.keep(call, v)
            if v.outcome == UNCHECKED:
                unchecked.append((where, UncheckedCall(call.path, call.line, call.qualname, v.reason)))
            return 1 if v.outcome == CLEAN else 0
        t = target_of(idx, call)
        if t.kind in ("func", "class") and t.sig is not None:
            if (call.star_args or call.star_kwargs) and not (call.args or call.kwargs):
                unchecked.append((where, UncheckedCall(call.path, call.line, call.qualname, STAR_ONLY)))
                self._keep(tonight, idx, call, UNCHECKED, STAR_ONLY)
                return 0
            if self._unless_plain(call, t.sig, aiter_sha) is None:
                self._keep(tonight, idx, call, CLEAN, "", t.sig)
                return 1
            f = self.check_guarded(idx, call, t.sig, aiter_sha, causes)
            if f is not None:
                findings.append(dataclasses.replace(f, callee="op" if t.sig.compiled else "python"))
            return 1
        if t.kind == "missing":
            findings.append(self._missing(call, t, aiter_sha, causes))
            return 1
        if t.kind in ("module", "foreign"):
            self._keep(tonight, idx, call, NOT_AITERS, "")
            return 0  # a module, or a value of a type that is not aiter's: not a call of aiter
        if call.ref[0] == TORCH_OPS and call.ref[1] and call.ref[1][0] in self.atom_ops:
            self._keep(tonight, idx, call, NOT_AITERS, "")
            return 0  # an op ATOM registers in the `aiter` namespace itself: not a call of aiter
        reason = unchecked_reason(call, t, self.atom_ops)
        unchecked.append((where, UncheckedCall(call.path, call.line, call.qualname, reason)))
        self._keep(tonight, idx, call, UNCHECKED, reason)
        return 0

    # -- from one night to the next (pipeline.compat.carry) -------------------
    def _night_context(self) -> tuple[object, ...]:
        return (self.explicit_baseline,)

    def _keep(
        self,
        tonight: Night | None,
        idx: ApiIndex,
        call: RawCall,
        outcome: str,
        reason: str,
        sig: Signature | None = None,
    ) -> None:
        """Record a plain verdict with what it read, for the next check (when it can be traced)."""
        if tonight is None:
            return
        at_pin = idx.deps_of(call.ref)
        if at_pin is None:
            return
        at_date = history = date_ops = None
        if sig is not None:  # clean: what `_doubtful`'s screens read
            base = self.date_baseline
            if base is not None and base != tonight.pin:
                at_date = self.index(base).deps_of(call.ref)
                if at_date is None:
                    return
                date_ops = self.index(base).op_files(call.ref[1][0]) if call.ref[0] == TORCH_OPS else None
            born = self.file_added(call.path) if self.explicit_baseline is None else None
            history = (sig.path, born) if born is not None else None
        op = None
        if call.ref[0] == TORCH_OPS:  # found through the files that name it (`ApiIndex._torch_op`)
            if not call.ref[1]:
                return
            name = call.ref[1][0]
            op = (idx.op_files(name), date_ops, self.atom_ops.get(name))
        broken = idx.unparseable_in(at_pin)
        tonight.keep(call, Verdict(outcome, reason, at_pin, at_date, history, broken, op))

    def _night_key(self) -> str:
        # (not by aiter's path: a verdict holds by what it read, wherever the commits were read from)
        return f"night:{self.atom.path}"

    def _last_night(self, aiter_sha: str) -> Carried | None:
        """The last check's verdicts, when its commits are on tonight's first-parent history."""
        store = self.caches.nights
        night = store.get(self._night_key()) if store is not None else None
        if not isinstance(night, Night) or night.context != self._night_context():
            return None
        order = {sha: i for i, (_, sha) in enumerate(self.first_parent.commits)}  # 0: the tip
        p0, t0, p1 = (order.get(sha) for sha in (night.pin, night.tip, aiter_sha))
        if p0 is None or t0 is None or p1 is None or order.get(self.tip) != 0 or p0 < t0:
            return None  # a rewritten history, or a pin off aiter's first parents
        d0, d1 = order.get(night.date or ""), order.get(self.date_baseline or "")
        oldest = max(i for i in (p0, t0, p1, d0, d1) if i is not None)
        changed: list[set[str]] = [set() for _ in range(oldest)]  # per first parent, tip first
        if oldest > 0:  # (from aiter's first-parent log of its Python files, read for the causes too)
            self.hist.use_first_parent(self.tip, self.first_parent.commits, AITER_PREFIX + "/")
            newer = lambda sha: order.get(sha, 0) < oldest  # noqa: E731 (each file's log is newest first)
            for path, sha in self.hist.first_parent_changes(newer):
                i = order.get(sha)
                if i is not None:
                    changed[i].add(path)

        def between(a: int, b: int) -> frozenset[str]:
            """Files changed from the older of two first parents to the newer."""
            return frozenset().union(*changed[min(a, b) : max(a, b)])

        history = between(0, max(p0, t0, p1))  # the histories were read from the tip
        date_index = self.index(self.date_baseline) if self.date_baseline not in (None, aiter_sha) else None
        return Carried(
            night, (self.index(aiter_sha), between(p0, p1)),
            (date_index, between(d0, d1) if d0 is not None and d1 is not None else None), history,
            self.file_added, lambda name: self.atom_ops.get(name),  # (known once the scan is done)
        )  # fmt: skip

    def _leave_night(self, tonight: Night) -> None:
        if self.caches.nights is not None:
            self.caches.nights.put(self._night_key(), tonight)
            read = [
                self._index[s].paths_used() for s in (tonight.pin, self.date_baseline) if s in self._index
            ]
            self.caches.nights.put(f"read:{self._night_key()}", frozenset().union(*read))

    def _summarize_ahead(self, aiter_sha: str) -> None:
        """The aiter modules the last check read that changed since: summarized in a child while
        this process reads the last night's verdicts and binds the calls that did not change."""
        store = self.caches.nights
        read = store.get(f"read:{self._night_key()}") if store is not None else None
        if not isinstance(read, frozenset):
            return
        date = self.date_baseline
        indexes = [self.index(aiter_sha), *([self.index(date)] if date not in (None, aiter_sha) else [])]
        todo = {(p, i.tree.blobs[p]) for i in indexes for p in read if p in i.tree.blobs}
        unread = [i.ops_unread() for i in indexes]  # (both from the one newest table: the same names)
        ops = (unread[0][0], sorted({b for _, blobs in unread for b in blobs}))
        self.caches.workers.summaries(self.caches.aiter, self.aiter, sorted(todo), ops)

    # -- one call ------------------------------------------------------------
    def check_guarded(
        self, idx: ApiIndex, call: RawCall, sig: Signature, aiter_sha: str, with_causes: bool
    ) -> Finding | None:
        """`_check_call`, under the `inspect.signature` guards the call runs under: a finding under a
        guard that cannot hold at the pin is a note (the call is not reached); under one the check
        cannot evaluate, an error is a warning naming the guard."""
        f = self._check_call(call, sig, aiter_sha, with_causes)
        if f is None or not call.sig_guards:
            return f
        unknown: SigGuard | None = None
        for g in call.sig_guards:
            holds = guard_holds(g, idx)
            if holds is False:
                return dataclasses.replace(
                    f, severity="note", kind="unreachable-at-pin",
                    message=f"`{call.qualname}` is not reached at aiter {aiter_sha[:10]}: it runs only when "
                    f"`{g.text}` (line {g.line}) is {'true' if g.when else 'false'}, which cannot hold at "
                    f"this pin ({params_phrase(g, idx)}). Had it run: {f.message}",
                )  # fmt: skip
            if holds is None and unknown is None:
                unknown = g
        if unknown is not None and f.severity == "error":
            return dataclasses.replace(
                f, severity="warning",
                message=f"{sentence(f.message)} The call runs only under the signature guard "
                f"`{unknown.text}` (line {unknown.line}), which the check cannot evaluate statically: "
                "a warning, not an error",
            )  # fmt: skip
        return f

    def _sig_at(self, aiter_sha: str | None, call: RawCall) -> Signature | None:
        """The callee's signature at an aiter commit. At a commit whose index is not built, kept
        across runs: a commit's tree is fixed, and a finding's baseline (when its lines were written)
        is asked again every night; building that index (a tree listing) costs more than the check."""
        if aiter_sha is None:
            return None
        # (an op is found by the files that name it, not kept: see `ApiIndex._torch_op`)
        facts = self.caches.facts if call.ref[0] != TORCH_OPS else None
        key = f"sig-at:{aiter_sha}:{call.ref!r}"
        if facts is not None and (aiter_sha not in self._index or aiter_sha in self._sig_built):
            got = facts.data.get(key)
            if got is not None:
                return cast("Signature | None", got[0])
            self._sig_built.add(aiter_sha)
        else:
            facts = None
        t = target_of(self.index(aiter_sha), call)
        sig = t.sig if t.kind in ("func", "class") else None
        if facts is not None:
            facts.data[key] = (sig,)
            facts.dirty = True
        return sig

    def _sig_in_file(self, aiter_sha: str, path: str, name: str) -> Signature | None:
        """`name` as defined in `path` at an aiter commit (no index: one tree lookup, cached summary)."""
        key = (aiter_sha, path)
        if key not in self._blob_at:
            self._blob_at[key] = self.aiter.blob_sha(aiter_sha, path)
        return self.hist.sig_at(path, self._blob_at[key], name)

    def _history_rev(self, aiter_sha: str) -> str:
        """Histories are read from the tip when it contains the pin (newer versions are candidates too)."""
        if aiter_sha not in self._on_tip:
            if not self._first_parents:
                self._first_parents = {sha for _, sha in self.first_parent.commits}
            self._on_tip[aiter_sha] = aiter_sha in self._first_parents or self.aiter.is_ancestor(
                aiter_sha, self.tip
            )
        return self.tip if self._on_tip[aiter_sha] else aiter_sha

    def _versions(self, aiter_sha: str, path: str) -> tuple[str, list[FileVersion], int]:
        """(rev, the file's versions newest first, index of the first one at or before the pin)."""
        got = self._versions_at.get((aiter_sha, path))
        if got is None:
            got = self._versions_at[(aiter_sha, path)] = self._read_versions(aiter_sha, path)
        return got

    def _read_versions(self, aiter_sha: str, path: str) -> tuple[str, list[FileVersion], int]:
        self.hist.use_first_parent(self.tip, self.first_parent.commits, AITER_PREFIX + "/")
        rev = self._history_rev(aiter_sha)
        vs = self.hist.file_log(rev, path)
        k = self.hist.position(aiter_sha)
        if rev == aiter_sha or k is None:
            return rev, vs, 0
        start = next((i for i, v in enumerate(vs) if (self.hist.position(v.commit.sha) or 0) >= k), len(vs))
        return rev, vs, start

    def _history(self, aiter_sha: str, sig: Signature, born: int) -> list[Candidate]:
        """Runs of one layout in the history of the callee's file, newest first, however old.

        Versions newer than the pin count too (an ATOM written ahead of the pin);
        older ones stop where the function was not defined in this file. A call can
        enter ATOM after a change and still be written for the older layout (copied
        from older code), so the history does not stop at the ATOM file's creation
        (`born` only dates the candidates).
        """
        rev, vs, start = self._versions(aiter_sha, sig.path)
        key = (rev, sig.path, sig.name, 0, start)
        runs = self._runs.get(key)
        # The newest version's commit names the whole list (the first parents below it are its
        # own): kept across runs, so a nightly check reads no old signature again.
        fkey = f"runs:{sig.path}:{sig.name}:{vs[0].commit.sha if vs else rev}:{start}"
        if runs is None and vs:
            runs = self.caches.facts.data.get(fkey)
            if runs is not None:
                self._runs[key] = runs
        if runs is None:
            runs = []
            prev: Signature | None = None
            for i, v in enumerate(vs[: start + MAX_VERSIONS]):
                s = self.hist.sig_at(sig.path, v.blob, sig.name)
                if s is None:
                    if i < start:
                        prev = None  # not defined there after the pin: a gap, not the end
                        continue
                    break  # not defined in this file before: moved here or added
                t = int(v.commit.date.timestamp())
                if prev is not None and layout(s) == layout(prev):
                    last = runs[-1]
                    runs[-1] = Candidate(last.sha, last.sig, t, last.until, "history")
                else:
                    until = runs[-1].since if runs else None
                    runs.append(Candidate(v.commit.sha, s, t, until, "history"))
                prev = s
            self._runs[key] = runs
            if vs:
                self.caches.facts.data[fkey] = runs
                self.caches.facts.dirty = True
        return runs

    def candidates(self, call: RawCall, aiter_sha: str, sig: Signature) -> list[Candidate]:
        """The distinct signatures the callee has had: its file's history, and where it resolved before."""
        born = self.file_added(call.path) or 0
        runs = self._history(aiter_sha, sig, born)
        out = list(runs)
        if not any(layout(c.sig) == layout(sig) for c in out):
            out.append(Candidate(aiter_sha, sig, 0, None, "pin"))
        # Where the call resolved at the other anchors: another file (a move, a re-export), or older.
        oldest = min((c.since for c in runs), default=None)
        anchors: list[tuple[str | None, str]] = [(self.explicit_baseline, "explicit")]
        if self.date_baseline != aiter_sha:
            anchors.append((self.date_baseline, "date"))
        if oldest is None or oldest > born:  # not defined in this file back then: where was it?
            written = self.written_time(call)
            if written is not None and (oldest is None or written < oldest):
                anchors.append((self._aiter_as_of(written), "blame"))
        for sha, source in anchors:
            s = self._sig_at(sha, call) if sha is not None else None
            if sha is None or s is None:
                continue
            if (s.path, s.name) == (sig.path, sig.name) and any(layout(c.sig) == layout(s) for c in out):
                continue
            t = int(self.aiter.commit_info(sha).date.timestamp())
            out.append(Candidate(sha, s, t, t + 1, source))
        return out

    def written_for(self, call: RawCall, aiter_sha: str, sig: Signature) -> Fit | None:
        """The signature this call was written for (see `pipeline.compat.evidence`)."""
        key = (call.path, call.line, call.col, aiter_sha)
        if key not in self._fit:
            cands = self.candidates(call, aiter_sha, sig)
            # The blame date only breaks ties: no `git blame` when the fit alone decides.
            self._fit[key] = best_fit(call, cands, self.written_time(call) if tied(call, cands) else None)
        return self._fit[key]

    def _doubtful_memo(self, call: RawCall, aiter_sha: str, sig: Signature, b: Binding) -> bool:
        """`_doubtful`, once per call and definition: a search sees the same signature at many pins."""
        key = (id(call), id(sig))
        got = self._doubt.get(key)
        if got is not None and got[0] is call and got[1] is sig:
            return got[2]
        r = self._doubtful(call, aiter_sha, sig, b)
        self._doubt[key] = (call, sig, r)
        return r

    def _doubtful(self, call: RawCall, aiter_sha: str, sig: Signature, b: Binding) -> bool:
        """Could a call that binds cleanly at the pin have been written for another layout?

        Cheap screens first: an argument named like another parameter; the
        explicit or ATOM-date baseline having another layout; the callee's
        layout when the ATOM file was created differing from the pin's.
        """
        if agreement(call, sig, b).disagree:
            return True

        def matters(s: Signature | None) -> bool:
            """Another definition, or a layout under which this call's positionals land on other slots.
            Its keywords need not bind there: a call gains keywords after its positionals were written
            (`q_scale=` added to a call written for `sm_scale` at position 9, before aiter moved it)."""
            if s is None:
                return True
            if (s.path, s.name) != (sig.path, sig.name):
                return True
            if layout(s) == layout(sig):
                return False
            positionals_fit = not any(p.kind == "too-many-positional" for p in bind(call, s).problems)
            return positionals_fit and bool(shifted_args(s, sig, call))

        for base in (self.explicit_baseline, self.date_baseline):
            if base is not None and base != aiter_sha:
                s = self._sig_at(base, call)
                if s is not None and matters(s):
                    return True
        if self.explicit_baseline is not None:
            return False
        born = self.file_added(call.path)
        if born is None:
            return False
        return matters(self._oldest_since(aiter_sha, sig, born))

    def _oldest_since(self, aiter_sha: str, sig: Signature, born: int) -> Signature | None:
        """The callee as its file defined it when the ATOM file was created, or when first defined after.

        Two ends compared, not every version: the file's versions are bisected for
        the oldest one still defining the function (a change undone later is missed).
        """
        rev, vs, start = self._versions(aiter_sha, sig.path)
        key = (rev, sig.path, sig.name, born, start)  # shared by the pins between two versions of the file
        if key in self._oldest:
            return self._oldest[key]
        versions = vs[start:]
        # newest first; keep those after the ATOM file's creation and the one in effect then
        k = next((i for i, v in enumerate(versions) if v.commit.date.timestamp() < born), len(versions) - 1)
        versions = versions[: k + 1]
        if versions:
            then = self.hist.sig_at(sig.path, versions[-1].blob, sig.name)
            if then is not None:  # defined when the ATOM file was created: one read, no bisection
                self._oldest[key] = then
                return then
        lo, hi = 0, len(versions) - 1  # versions[0] defines it (the pin); find the oldest that still does
        got: Signature | None = None
        while lo <= hi:
            mid = (lo + hi) // 2
            s = self.hist.sig_at(sig.path, versions[mid].blob, sig.name)
            if s is not None:
                got, lo = s, mid + 1
            else:
                hi = mid - 1
        self._oldest[key] = got
        return got

    def _unless_plain(self, call: RawCall, sig: Signature, aiter_sha: str) -> Binding | None:
        """The call's binding at the pin; None when it binds cleanly and no screen doubts the layout
        it was written for (the plain case: no finding)."""
        b = bind(call, sig)
        return None if b.ok and not self._doubtful_memo(call, aiter_sha, sig, b) else b

    def _check_call(
        self,
        call: RawCall,
        sig: Signature,
        aiter_sha: str,
        with_causes: bool,
    ) -> Finding | None:
        b = self._unless_plain(call, sig, aiter_sha)
        if b is None:
            return None
        defined_at = f"{sig.path}:{sig.line}"
        head = f"`{call.qualname}` call does not match aiter {aiter_sha[:10]}: "
        fit = self.written_for(call, aiter_sha, sig)
        if fit is None:
            return None
        base, base_sig = fit.cand.sha, fit.cand.sig
        if not b.ok:
            details = tuple(p.message for p in b.problems)
            before = problem_keys(fit.binding)
            new = [p for p in b.problems if p.key not in before]
            unbound = [p for p in b.problems if p.kind in BINDING_ERRORS]
            if not fit.clean and not new:
                same = "; ".join(p.message for p in fit.binding.problems)
                msg = (
                    head + "; ".join(details) + f". Pre-existing: the call fails the same way ({same}) with "
                    f"aiter {base[:10]}, the signature it was written for, so no aiter pin fixes it"
                )
                if unbound:  # a TypeError whenever the line runs: on the model's path it crashes the model
                    msg += (
                        ". It cannot bind at this pin (a TypeError whenever it runs): an error that gates "
                        "the model when on its path; it needs a patch of ATOM or a waiver with a reason"
                    )
                    sev = "error"
                else:
                    msg += " (an evident type clash, not a failure to bind): a warning"
                    sev = "warning"
                return Finding(
                    call.path, call.line, call.col, call.qualname, sev, b.problems[0].kind, msg + ".",
                    details, None, defined_at, preexisting=True, written_against=base,
                )  # fmt: skip
            kind = new[0].kind

            def clean(s: Signature) -> bool:
                sb = bind(call, s)
                return problem_keys(sb) <= before and not shifted_args(base_sig, s, call)

            cause = None
            if with_causes:
                cause = self._cause_back(call, sig, aiter_sha, clean, fit)
                if cause is None:
                    cause = self._cause_forward(call, aiter_sha, base, base_sig, clean)
            if cause is not None and cause.shifted:
                kind = "positional-shift"
            msg = head + (cause.sentence() if cause is not None else "; ".join(p.message for p in new))
            msg += self._written_after(call, cause, fit)
            if not fit.clean:
                was = "; ".join(p.message for p in fit.binding.problems)
                msg += (
                    f". New at this pin: the call was already broken with aiter {base[:10]}, the signature "
                    f"it was written for ({was}), but not this way"
                )
            if with_causes and cause is None:
                msg += _no_cause(sig, aiter_sha)
            severity = "error"
            # Written for another layout (an older one fits cleanly): the clash is where the shift shows.
            other_layout = (
                fit.clean and layout(base_sig) != layout(sig) and bool(shifted_args(base_sig, sig, call))
            )
            if other_layout:
                kind = "positional-shift"
            if not unbound and all(p.kind == "type-mismatch" for p in new) and kind == "type-mismatch":
                if not sig.compiled:
                    severity = "warning"
                    msg += (
                        f". `{sig.name}` is plain Python, which does not enforce its annotations: "
                        "a warning, not an error"
                    )
                elif all(p.soft for p in new):
                    severity = "warning"
                    msg += ". An int where a flag is expected converts without error: a warning"
            return Finding(
                call.path, call.line, call.col, call.qualname, severity, kind, msg,
                details, _cause_info(cause), defined_at, written_against=base,
            )  # fmt: skip
        # Binds without error: do the arguments land where the author meant them to?
        if layout(base_sig) == layout(sig) and (base_sig.path, base_sig.name) == (sig.path, sig.name):
            return None
        if not fit.clean:
            return None  # it fits the pin better than anything it could have been written for
        shifted_at = shifted_args(base_sig, sig, call)
        if not shifted_at:
            return None  # the same slots (a parameter renamed in place keeps its slot)

        def clean_shift(s: Signature) -> bool:
            return bind(call, s).ok and not shifted_args(base_sig, s, call)

        cause = None
        if with_causes:
            cause = self._cause_back(call, sig, aiter_sha, clean_shift, fit) or self._cause_forward(
                call, aiter_sha, base, base_sig, clean_shift
            )
        shifted: list[str] = []
        for i in shifted_at:
            a, op, np_ = call.args[i - 1], fit.binding.positional[i - 1], b.positional[i - 1]
            shifted.append(
                f"argument {i} `{a.text}` was written for `{op.name if op else '?'}`, "
                f"now lands on `{np_.name if np_ else '*args'}`"
            )
        msg = (
            f"`{call.qualname}` call binds without error but its positional arguments land on other "
            f"parameters than under aiter {base[:10]} (the signature it was written for): "
        )
        if cause is not None:
            msg += cause.sentence() + self._written_after(call, cause, fit)
        else:
            change, effect = explain(base_sig, sig, call, sig.name)
            msg += f"{change}: {effect}" + (_no_cause(sig, aiter_sha) if with_causes else "")
        return Finding(
            call.path, call.line, call.col, call.qualname, "error", "positional-shift", msg,
            tuple(shifted), _cause_info(cause), defined_at, written_against=base,
        )  # fmt: skip

    def _cause_back(
        self, call: RawCall, sig: Signature, aiter_sha: str, clean: Callable[[Signature], bool], fit: Fit
    ) -> Cause | None:
        got = find_cause(self.hist, aiter_sha, sig, sig.path, sig.name, call, clean)
        if got is not None:
            return got
        old = fit.cand.sig
        if (old.path, old.name) != (sig.path, sig.name) and clean(old):
            return self._cause_moved(call, aiter_sha, sig, fit)
        return None

    def _cause_moved(self, call: RawCall, aiter_sha: str, sig: Signature, fit: Fit) -> Cause | None:
        """The call resolves to another definition than the one it was written for: when and why."""
        old = fit.cand.sig
        if not self.aiter.is_ancestor(fit.cand.sha, aiter_sha):
            return None
        commits = self.aiter.git("rev-list", "--first-parent", f"{fit.cand.sha}..{aiter_sha}").split()
        commits.reverse()  # oldest first; the last one is the pin

        def moved(sha: str) -> bool:
            s = self._sig_at(sha, call)
            return s is not None and (s.path, s.name) == (sig.path, sig.name)

        lo, hi = 0, len(commits) - 1  # the first commit resolving to the pin's definition
        probed: list[str] = []
        while lo < hi:
            mid = (lo + hi) // 2
            probed.append(commits[mid])
            if moved(commits[mid]):
                hi = mid
            else:
                lo = mid + 1
        for sha in probed:
            if sha != commits[lo]:
                self.drop_index(sha)
        c = self.aiter.commit_info(commits[lo])
        parent = self.hist.parent(c.sha)
        still = self._sig_in_file(aiter_sha, old.path, old.name) is not None
        if still:
            change = (
                f"`{call.qualname}` now resolves to {sig.path} instead of {old.path} "
                f"(star import order in {self.index(aiter_sha).mods.get(call.ref[0], ROOT_INIT)})"
            )
        else:
            change = f"`{sig.name}` moved from {old.path} to {sig.path}"
        new_at = self._sig_at(c.sha, call) or sig
        _, effect = explain(old, new_at, call, sig.name)
        shifted = bool(shifted_args(old, new_at, call))
        return Cause(c, parent, change, effect, old, new_at, shifted)

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
        if with_causes and what in ("function", "method") and t.module and name:
            idx = self.index(aiter_sha)
            # Where it used to live: the module looked up (the class's file for a method), or its file
            # under a baseline.
            paths: list[tuple[str, str]] = []
            if what == "method" and t.cls is not None:
                paths.append((t.cls.path, f"{t.cls.name}().{name}"))  # (only whether it exists is read)
            elif t.module in idx.mods:
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
                    to = self._moved_to(c.sha, def_name, path)
                    change = f"`{name}` moved from {path} to {to}" if to else f"`{name}` removed"
                    cause_info = CauseInfo(c, self.hist.parent(c.sha), change, "")
                    msg += (
                        f". Cause: `{def_name}` {'moved' if to else 'removed'} from {path}"
                        f'{f" to {to}" if to else ""} by aiter {c.short} ({_day(c)}, "{c.subject}")'
                    )
                    break
            if cause_info is None and not call.guarded:
                cause_info, extra = self._added_later(call, aiter_sha, name)
                msg += extra
            if cause_info is None and what == "function":
                cause_info, extra = self._last_defined(aiter_sha, name)
                written = self.written_time(call) if cause_info is not None else None
                if cause_info and written is not None and written > cause_info.commit.date.timestamp():
                    extra += " (before the call's lines were written: they were written for an older aiter)"
                msg += extra
            if cause_info is None and not call.guarded:
                msg += (
                    f". No cause named: no first-parent aiter commit up to {aiter_sha[:10]} removed a "
                    f"definition of `{name}`{f' from {paths[0][0]}' if paths else ''} (it may never have "
                    "existed under this name, or was only ever defined in a C++ extension)"
                )
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

    def _last_defined(self, aiter_sha: str, name: str) -> tuple[CauseInfo | None, str]:
        """The newest first-parent commit that removed `def name(` from an aiter file (git's pickaxe:
        the name existed at an older aiter than any the call could be dated by)."""
        key = f"pickaxe:{aiter_sha}:{name}"
        got = self.caches.facts.data.get(key)
        if got is None:
            out = self.aiter.git(
                "log", "-1", "--first-parent", "-m", f"-Sdef {name}(", "--format=%x01%H", "--name-only",
                aiter_sha, "--", AITER_PREFIX + "/",
            ).strip()  # fmt: skip
            got = out.lstrip("\x01")
            self.caches.facts.data[key] = got
            self.caches.facts.dirty = True
        if not got:
            return None, ""
        sha, *paths = got.split()
        parent = self.hist.parent(sha)
        if parent is None:
            return None, ""
        gone = [p for p in paths if self._sig_in_file(parent, p, name) is not None]
        if not gone or any(self._sig_in_file(sha, p, name) is not None for p in gone):
            return None, ""  # that commit added or kept it: not a removal
        c = self.aiter.commit_info(sha)
        to = self._moved_to(sha, name, gone[0])
        change = f"`{name}` moved from {gone[0]} to {to}" if to else f"`{name}` removed from {gone[0]}"
        return CauseInfo(c, parent, change, "this call now fails with AttributeError/ImportError"), (
            f'. Cause: {change} by aiter {c.short} ({_day(c)}, "{c.subject}")'
        )

    def _moved_to(self, sha: str, name: str, old_path: str) -> str | None:
        """Another file that commit `sha` made define `name` (the function moved there), if any."""
        self.hist.use_first_parent(self.tip, self.first_parent.commits, AITER_PREFIX + "/")
        for path, versions in self.hist.changed_by(sha).items():
            if path != old_path and self.hist.sig_at(path, versions, name) is not None:
                return path
        return None

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


def _no_cause(sig: Signature, aiter_sha: str) -> str:
    """Why an error names no commit."""
    return (
        f". No cause named: no version of `{sig.name}` in the first-parent history of {sig.path} up to "
        f"aiter {aiter_sha[:10]}, nor where the call resolved before, takes this call as it was written"
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
    begin_tree(caches, aiter, aiter_sha)  # (read by the check's first step: git lists it meanwhile)
    with no_collections():
        try:
            checker = Checker(
                atom, atom_sha, aiter, caches, tip=tip, explicit_baseline=explicit, dated_by=dated
            )
            report = checker.check(aiter_sha, nightly=True)
            caches.reports.put(key, report)
            return report
        finally:
            caches.close()
            caches.save()


@contextlib.contextmanager
def no_collections() -> Iterator[None]:
    """No cyclic garbage collection while a check runs: it makes hundreds of thousands of
    long-lived records and next to no reference cycles, so a collection traverses them all and
    finds nothing (a night's one collection was 20 ms of it). What it made is left out of later
    collections too (`gc.freeze`: still freed when no longer referenced)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.freeze()
            gc.enable()
