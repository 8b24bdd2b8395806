"""`search_compatible`: the newest aiter commit an ATOM commit is compatible with.

Only commits that change a file the check read at the aiter head (the
modules defining the functions ATOM calls, and the re-exporting packages)
can change the verdict, so only those commits on aiter's first-parent
history are examined, newest first; the first compatible one is the answer
and the examined commit just after it is the first that breaks ATOM.

The walk stops early when an examined commit lacks a function ATOM calls
(unguarded) that exists at the head: aiter adds functions and rarely
removes and re-adds them, so every older commit lacks it too, and no
compatible aiter exists without patching ATOM.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.compat.checker import AITER_PREFIX, Caches, Checker, no_collections, resolve_sha
from pipeline.compat.report import CheckReport, Finding
from pipeline.gitw import CommitInfo, GitRepo

if TYPE_CHECKING:
    from pipeline.compat.aiterapi import ApiIndex, Dep
    from pipeline.patchq import PatchSeries
    from pipeline.patchq.model import Patch


@dataclass(frozen=True)
class SearchResult:
    newest_compatible: CommitInfo | None
    first_breaking: CommitInfo | None
    report_at_head: CheckReport
    commits_examined: int
    report_at_newest: CheckReport | None = None
    # When nothing is compatible: the errors at the oldest commit examined, and why the walk stopped.
    blocking: list[Finding] = field(default_factory=list)
    explanation: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        def c(x: CommitInfo | None) -> dict[str, str] | None:
            return {"sha": x.sha, "date": x.iso_date, "subject": x.subject} if x else None

        return {
            "newest_compatible": c(self.newest_compatible),
            "first_breaking": c(self.first_breaking),
            "commits_examined": self.commits_examined,
            "explanation": self.explanation,
            "blocking": [f.to_json() for f in self.blocking],
            "report_at_head": self.report_at_head.to_json(),
        }


@no_collections()  # (a search makes what a check makes, a hundred times over)
def search_compatible(
    atom: GitRepo,
    atom_rev: str,
    aiter: GitRepo,
    aiter_head: str,
    *,
    cache_dir: Path | None = None,
    baseline_aiter_rev: str | None = None,
    max_commits: int = 2000,
    patches: PatchSeries | None = None,
    adjust: Callable[[CheckReport], CheckReport] | None = None,
) -> SearchResult:
    """Newest aiter commit (first-parent history of `aiter_head`) ATOM is compatible with.

    With `patches`, each aiter commit is checked against the patched ATOM tree
    for that commit (the series' aiter conditions decide which patches apply),
    as `pipeline patch` would build it. `adjust` is applied to every report
    before it is judged (the pipeline passes the recipe's waivers).
    """

    def check(checker: Checker, sha: str, *, with_causes: bool = True) -> CheckReport:
        report = checker.check(sha, with_causes=with_causes)
        return adjust(report) if adjust is not None else report

    t0 = time.perf_counter()
    atom_sha = resolve_sha(atom, atom_rev, "ATOM")
    head = resolve_sha(aiter, aiter_head, "aiter")
    explicit = resolve_sha(aiter, baseline_aiter_rev, "aiter baseline") if baseline_aiter_rev else None
    caches = Caches.open(cache_dir)
    try:
        base_checker = Checker(atom, atom_sha, aiter, caches, tip=head, explicit_baseline=explicit)
        variants = _Variants(patches, atom, atom_sha, aiter, caches, head, base_checker)
        checker = variants.checker_for(head)
        at_head = check(checker, head)
        examined = 1
        if pin_fits(at_head):
            return SearchResult(
                aiter.commit_info(head), None, at_head, examined, at_head,
                explanation=f"ATOM {atom_sha[:10]} is compatible with the aiter head {head[:10]}."
                + _unfixable(at_head),
                seconds=time.perf_counter() - t0,
            )  # fmt: skip
        head_idx = checker.index(head)
        relevant = _relevant_paths(head_idx)
        read = head_idx.paths_used()  # every module a check has parsed so far in the walk
        present_at_head = _called_functions(checker, head)
        unchanged = _Unchanged(checker, head)
        candidates = [c for c in unchanged.log(head, relevant) if c.sha != head]
        newer: CommitInfo = aiter.commit_info(head)
        last_report = at_head
        # The calls that broke at the last commit examined, per ATOM tree: an older commit where one of
        # them still breaks is not compatible either, and needs no full check to say so.
        suspects: dict[int, set[tuple[str, int, int]]] = {id(checker): _sites(at_head)}
        # The last examined commit, what its breaking calls read, and the commits since the last one
        # whose every call was resolved (a function ATOM calls may have gone missing among them).
        ref, ref_checker = head, checker
        ref_deps = unchanged.deps(checker, head_idx, at_head)
        unscanned: list[CommitInfo] = []

        def lacking(report: CheckReport) -> list[Finding]:
            return [
                f for f in report.errors
                if f.kind in ("missing-function", "missing-module") and f.function in present_at_head
            ]  # fmt: skip

        def stop(checker: Checker, cand: CommitInfo, gone: list[Finding]) -> SearchResult:
            """The walk ends at the newest commit lacking a function ATOM calls."""
            if unscanned:
                cand = unchanged.first_lacking(checker, [*unscanned, cand], {f.function for f in gone})
            report = check(checker, cand.sha, with_causes=False)  # every break, for the record
            gone = lacking(report) or gone
            names = ", ".join(sorted({f"`{f.function}`" for f in gone}))
            others = sorted(
                {f"`{f.function}` ({f.path}:{f.line})" for f in _pin_errors(report)}
                - {f"`{f.function}` ({f.path}:{f.line})" for f in gone}
            )
            also = f"; it also breaks {', '.join(others[:5])}" if others else ""
            return _none(
                at_head, examined, report, t0,
                f"no aiter commit up to {head[:10]} is compatible with ATOM {atom_sha[:10]} "
                f"{variants.phrase}: going back from the head, every commit keeps at least one "
                "breaking call "
                f"until {cand.short} ({cand.iso_date}), which lacks {names} that ATOM calls "
                f"(older aiter commits lack them too){also}."
                + _unfixable(report).replace(", this one included", ""),
            )  # fmt: skip

        for cand in candidates[:max_commits]:
            checker = variants.checker_for(cand.sha)
            if checker is ref_checker and ref_deps is not None and unchanged.between(ref, cand.sha, ref_deps):
                unscanned.append(cand)  # the calls that break at `ref` break here the same way
                newer = cand
                continue
            every_call = len(unscanned) >= SCAN_EVERY or checker is not ref_checker
            index = checker.index(cand.sha)
            want = read if every_call else _modules_read(index, ref_deps, read)
            caches.workers.ahead(caches.aiter, aiter, index.tree, want)
            report = _quick(checker, cand.sha, suspects.get(id(checker), set()), adjust, every_call)
            scanned = every_call
            if report is None:
                caches.workers.ahead(caches.aiter, aiter, index.tree, read)
                report = check(checker, cand.sha, with_causes=False)
                scanned = True
            read |= index.paths_used()
            suspects[id(checker)] = _sites(report)
            examined += 1
            # Files the check reads may differ at older commits (functions move).
            extra = _relevant_paths(checker.index(cand.sha)) - relevant
            if extra:
                relevant |= extra
                more = {c.sha for c in unchanged.log(cand.sha, extra)}
                known = {c.sha for c in candidates}
                if more - known:
                    rest = unchanged.log(cand.sha, relevant)
                    idx = candidates.index(cand)
                    candidates[idx + 1 :] = [c for c in rest if c.sha != cand.sha]
            if pin_fits(report):
                final = check(checker, cand.sha)  # with causes, for the record
                return SearchResult(
                    cand, newer, at_head, examined, final,
                    explanation=(
                        f"newest aiter compatible with ATOM {atom_sha[:10]}: {cand.short} "
                        f"({cand.iso_date}); first breaking: {newer.short} ({newer.subject})"
                    )
                    + _unfixable(final),
                    seconds=time.perf_counter() - t0,
                )  # fmt: skip
            gone = lacking(report)
            if gone:
                return stop(checker, cand, gone)
            last_report = report
            newer = cand
            if scanned:
                unscanned = []
            else:
                unscanned.append(cand)
            ref, ref_checker = cand.sha, checker
            ref_deps = unchanged.deps(checker, checker.index(cand.sha), report)
            checker.drop_index(cand.sha)
        if unscanned:  # the last commits were not scanned for functions gone missing
            last = check(checker, newer.sha, with_causes=False)
            gone = lacking(last)
            if gone:
                unscanned.pop()  # `newer` itself: the last of them
                return stop(checker, newer, gone)
        if last_report is not at_head:
            last_report = check(checker, newer.sha, with_causes=False)  # every break, not only the first
        return _none(
            at_head, examined, last_report, t0,
            f"no aiter commit in the {examined} examined up to {head[:10]} is compatible with ATOM "
            f"{atom_sha[:10]} {variants.phrase}.",
        )  # fmt: skip
    finally:
        caches.close()
        caches.save()


class _Variants:
    """The ATOM tree to check for each aiter commit: as pinned, or patched as that commit requires."""

    def __init__(
        self,
        series: PatchSeries | None,
        atom: GitRepo,
        atom_sha: str,
        aiter: GitRepo,
        caches: Caches,
        head: str,
        base: Checker,
    ) -> None:
        self.series = series
        self.atom, self.atom_sha, self.aiter, self.caches, self.head = atom, atom_sha, aiter, caches, head
        self.base = base
        self.phrase = "without patches" if series is None else "even with the patch series applied"
        self._by_key: dict[tuple[bool, ...], Checker] = {}
        self._in_range: list[Patch] = []
        if series is not None:
            from pipeline.patchq.conditions import atom_in_range

            self._in_range = [p for p in series if atom_in_range(p, atom, atom_sha).needed]
        self._req_memo: dict[tuple[str, str, str], bool] = {}

    def checker_for(self, aiter_sha: str) -> Checker:
        if not self._in_range:
            return self.base
        key = tuple(self._needed(p, aiter_sha) for p in self._in_range)
        got = self._by_key.get(key)
        if got is None:
            if not any(key):
                got = self.base
            else:
                assert self.series is not None
                from pipeline.patchq import patched_commit

                head = patched_commit(self.series, self.atom, self.atom_sha, self.aiter, aiter_sha).head_sha
                # The patched lines were written for the aiter that needs them; the rest of the
                # tree keeps the unpatched commit's baseline.
                got = Checker(
                    self.atom, head, self.aiter, self.caches, tip=self.head,
                    explicit_baseline=self.base.explicit_baseline, dated_by=self.atom_sha,
                )  # fmt: skip
            self._by_key[key] = got
        return got

    def _needed(self, patch: Patch, aiter_sha: str) -> bool:
        """aiter conditions of the patch, with `F has P` read from the (cached) signature index."""
        after = patch.aiter_after
        if after is not None:
            sha = self.aiter.rev_parse(after)
            if sha is None or not self.aiter.is_ancestor(sha, aiter_sha):
                return False
        for req in patch.aiter_requires:
            t = self.base.index(aiter_sha).resolve((req.function,))
            if t.sig is not None:
                has = any(p.name == req.param for p in t.sig.params)
            else:
                from pipeline.patchq.conditions import requirement_holds

                holds = requirement_holds(req, self.aiter, aiter_sha)[0]
                has = holds if req.verb == "has" else not holds
            if has != (req.verb == "has"):
                return False
        return True


# How many commits a walk passes or examines by their breaking calls alone before it resolves every
# call again (a function ATOM calls gone missing ends the walk; the commit is then found by bisection,
# six steps at most). A full resolution is most of an examined commit's cost: on four real ATOM commits
# 64 gave the same answers as 16 with up to a third less CPU.
SCAN_EVERY = 64


class _Unchanged:
    """Which aiter commits a walk may pass unexamined: no fact the breaking calls' resolutions read changed.

    A call's resolution records each fact it relied on (`ApiIndex.deps_of`): a module's
    blob, whether a module or namespace exists, and that a star-imported module does not
    mention a name. Its finding depends on those and on the callee's history, which is
    read from aiter's head whatever the pin. So a break found at one commit holds at
    every older commit up to the next one whose first-parent diff breaks such a fact.
    Most aiter commits that touch a module a resolution read only add a file beside it,
    or edit a star-imported module that still does not mention the name.
    """

    def __init__(self, checker: Checker, head: str) -> None:
        from pipeline.compat.aiterapi import module_from_path

        self.commits = [sha for _, sha in checker.first_parent.commits]  # newest first
        self.order = {sha: i for i, sha in enumerate(self.commits)}
        self.repo = checker.aiter
        self.raw = checker.caches.aiter.raw
        # commit -> (module, blob after, blob before) of each .py file its first-parent diff touches
        self.changes: dict[str, list[tuple[str, str | None, str | None]]] = {}
        self.paths: dict[str, set[str]] = {}  # commit -> the .py files its first-parent diff touches
        self.info: dict[str, CommitInfo] = {}
        for path, versions in checker.hist.first_parent_log(head, AITER_PREFIX + "/").items():
            mod = module_from_path(path)
            for k, v in enumerate(versions):
                before = versions[k + 1].blob if k + 1 < len(versions) else None
                self.changes.setdefault(v.commit.sha, []).append((mod, v.blob, before))
                self.paths.setdefault(v.commit.sha, set()).add(path)
                self.info[v.commit.sha] = v.commit
        self._git_log = checker.aiter.log
        self._mentions: dict[tuple[str, str], bool] = {}
        self._stars: dict[str, tuple[bytes, ...]] = {}

    def log(self, rev: str, paths: set[str]) -> list[CommitInfo]:
        """`git log --first-parent rev -- paths`, newest first, from the first-parent log already read."""
        start = self.order.get(rev)
        if start is None or not all(p.endswith(".py") for p in paths):  # the log read holds .py files only
            return self._git_log(rev, sorted(paths), first_parent=True)
        touch = self.paths
        return [self.info[sha] for sha in self.commits[start:] if not touch.get(sha, set()).isdisjoint(paths)]

    def deps(self, checker: Checker, idx: ApiIndex, report: CheckReport) -> frozenset[Dep] | None:
        """What the breaking calls' resolutions relied on (None: one is not traced: examine every commit)."""
        from pipeline.compat.aiterapi import TORCH_OPS

        sites = _sites(report)
        out: set[Dep] = set()
        found = 0
        for fc in checker.files:
            for call in fc.calls:
                if (call.path, call.line, call.col) not in sites:
                    continue
                read = idx.deps_of(call.ref)
                if read is None or call.ref[0] == TORCH_OPS:
                    return None
                # A module with its own file exists as long as that file does (a namespace package
                # exists through the files below it: those are watched).
                out.update(("f", *d[1:]) if d[0] == "e" and d[2] and d[1] in idx.mods else d for d in read)
                found += 1
        return frozenset(out) if found and out else None

    def between(self, newer: str, older: str, deps: frozenset[Dep]) -> bool:
        """Every fact in `deps` (true at `newer`) still holds at `older`: no first-parent diff from
        `newer` (included) back to `older` (excluded) breaks one."""
        i, j = self.order.get(newer), self.order.get(older)
        if i is None or j is None or j <= i:
            return False
        blobs = {d[1] for d in deps if d[0] == "m"}
        exists = {(d[1], d[0] == "e", d[2]) for d in deps if d[0] in ("e", "f")}
        unnamed: dict[str, list[str]] = {}
        for kind, module, _, name in deps:
            if kind == "n":
                unnamed.setdefault(module, []).append(name)
        for sha in self.commits[i:j]:
            for module, after, before in self.changes.get(sha, ()):
                if module in blobs:
                    return False
                if after is None or before is None:  # going back, a file appears or goes
                    # ...and with it the module, or a namespace package above it that has no other file
                    appears = after is None
                    if any(
                        m == module or (ns and flag != appears and module.startswith(m + "."))
                        for m, ns, flag in exists
                    ):
                        return False
                    if module in unnamed:
                        return False
                    continue
                names = unnamed.get(module)
                if names and not self._still_unnamed(after, before, names):
                    return False
        return True

    def _still_unnamed(self, after: str, before: str, names: list[str]) -> bool:
        """The older version of a star-imported module (`before`) still does not mention any of `names`,
        and star-imports the same modules as the newer one (so it exports none of them either)."""
        if self._star_targets(before) != self._star_targets(after):
            return False
        for name in names:
            key = (before, name)
            got = self._mentions.get(key)
            if got is None:
                got = self._mentions[key] = name.encode() in self._blob(before)
            if got:
                return False
        return True

    def _star_targets(self, blob: str) -> tuple[bytes, ...]:
        got = self._stars.get(blob)
        if got is None:
            from pipeline.compat.aiterapi import _STAR_RE

            got = self._stars[blob] = tuple(m.group(0).strip() for m in _STAR_RE.finditer(self._blob(blob)))
        return got

    def _blob(self, sha: str) -> bytes:
        raw = self.raw.get(sha)
        if raw is None:
            raw = self.raw[sha] = next(iter(self.repo.read_blobs([sha])))[1]
        return raw

    def first_lacking(self, checker: Checker, commits: list[CommitInfo], names: set[str]) -> CommitInfo:
        """The newest of `commits` (newest first; the last lacks one of `names`) that lacks one of them."""
        from pipeline.compat.checker import target_of

        def lacks(c: CommitInfo) -> bool:
            idx = checker.index(c.sha)
            return any(
                call.qualname in names and target_of(idx, call).kind == "missing"
                for fc in checker.files
                for call in fc.calls
            )

        lo, hi = 0, len(commits) - 1  # lacks(commits[hi]) holds
        while lo < hi:
            mid = (lo + hi) // 2
            if lacks(commits[mid]):
                hi = mid
            else:
                lo = mid + 1
            checker.drop_index(commits[mid].sha)
        return commits[lo]


def pin_fits(report: CheckReport) -> bool:
    """No error another aiter pin could fix (a call that fails to bind under the signature it was
    written for fails at every pin: the search does not walk history for it)."""
    return not _pin_errors(report)


def _pin_errors(report: CheckReport) -> list[Finding]:
    return [f for f in report.errors if not f.preexisting]


def _unfixable(report: CheckReport) -> str:
    left = [f for f in report.errors if f.preexisting]
    if not left:
        return ""
    sites = ", ".join(f"`{f.function}` ({f.path}:{f.line})" for f in left[:5])
    return (
        f" {len(left)} call(s) fail to bind at every aiter, this one included: {sites}; no aiter pin "
        "fixes them (the search did not walk history for them): each needs a patch of ATOM or a "
        "waiver with a reason."
    )


def _sites(report: CheckReport) -> set[tuple[str, int, int]]:
    return {(f.path, f.line, f.col) for f in _pin_errors(report)}


def _quick(
    checker: Checker,
    sha: str,
    suspects: set[tuple[str, int, int]],
    adjust: Callable[[CheckReport], CheckReport] | None,
    every_call: bool = True,
) -> CheckReport | None:
    """The breaks at `sha` among the suspects (and, with `every_call`, every call to a missing name).

    None when none of them breaks (then only a full check can tell). A report from here is
    incomplete (other calls are not bound), but enough to say "not compatible" and to see the
    missing functions that stop the walk.
    """
    if not suspects:
        return None
    from pipeline.compat.checker import target_of

    idx = checker.index(sha)
    findings: list[Finding] = []
    for fc in checker.files:
        for call in fc.calls:
            if not every_call and (call.path, call.line, call.col) not in suspects:
                continue
            t = target_of(idx, call)
            if t.kind == "missing":
                findings.append(checker._missing(call, t, sha, False))
            elif (call.path, call.line, call.col) in suspects and t.kind in ("func", "class") and t.sig:
                if (call.star_args or call.star_kwargs) and not (call.args or call.kwargs):
                    continue
                f = checker.check_guarded(idx, call, t.sig, sha, False)
                if f is not None:
                    findings.append(f)
    report = CheckReport(
        findings=findings, calls_checked=len(findings), calls_unchecked=0, unparseable=[],
        atom_sha=checker.atom_sha, aiter_sha=sha, baseline_aiter_sha=checker.date_baseline,
        unchecked=[], seconds=0.0,
    )  # fmt: skip
    if adjust is not None:
        report = adjust(report)
    return None if pin_fits(report) else report


def _none(at_head: CheckReport, examined: int, last: CheckReport, t0: float, why: str) -> SearchResult:
    blocking = _pin_errors(last)
    return SearchResult(None, None, at_head, examined, None, blocking, why, seconds=time.perf_counter() - t0)


def _modules_read(idx: ApiIndex, deps: frozenset[Dep] | None, otherwise: set[str]) -> set[str]:
    """The files of the modules the last breaking calls' resolutions read (their summaries are what
    a check of those calls parses again where they changed); `otherwise` when that is unknown."""
    if deps is None:
        return otherwise
    return {idx.mods[d[1]] for d in deps if d[0] == "m" and d[1] in idx.mods}


def _relevant_paths(idx: object) -> set[str]:
    from pipeline.compat.aiterapi import ApiIndex

    assert isinstance(idx, ApiIndex)
    paths = idx.paths_used() | {idx.mods[m] for m in idx.raw_read() if m in idx.mods}
    return {p for p in paths if p.startswith(AITER_PREFIX + "/")}


def _called_functions(checker: Checker, sha: str) -> set[str]:
    """Qualified names ATOM calls (unguarded) that resolve to a function at `sha`."""
    from pipeline.compat.checker import target_of

    idx = checker.index(sha)
    out: set[str] = set()
    for fc in checker.files:
        for call in fc.calls:
            if call.guarded:
                continue
            if target_of(idx, call).kind in ("func", "class", "value", "module"):
                out.add(call.qualname)
    return out
