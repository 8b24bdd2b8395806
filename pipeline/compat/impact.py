"""`impact`: the aiter side of the check. Which ATOM calls does an aiter range B..H break?

For each ATOM commit, the check is run at B and at H (`run_check`: the same caches, so a warm
pair is two small reads); a call that has no error at B and an error at H is broken by the range.
Its cause is the check's own (the commit in the callee's file history that broke it), kept when
it lies in B..H; otherwise the range's first-parent commits are bisected with the same checker.
Breaks are grouped by the aiter definition whose change breaks them (its file and line at H, or
at B when H no longer has it), and each call is placed on or off each model's path (reach).

compat does not import recipes: models come in as (name, ModelFacts or None); None means no
architecture is known, so every break counts as on that model's path (when unsure, it gates).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.compat.checker import (
    AITER_PREFIX,
    ATOM_PREFIX,
    Caches,
    Checker,
    aiter_tip,
    resolve_sha,
    run_check,
    target_of,
)
from pipeline.compat.report import CauseInfo, CheckReport, Finding, sarif_location, sarif_log, sarif_rule
from pipeline.errors import PipelineError
from pipeline.gitw import GitRepo

RULE_ID = "breaks-atom-call"
RULE_TEXT = "A change to this aiter function breaks ATOM calls that bound before it."
ATOM_WEB = "https://github.com/ROCm/ATOM"
AITER_WEB = "https://github.com/ROCm/aiter"

Key = tuple[str, int, int, str]  # ATOM path, line, column, function as called


def _key(f: Finding) -> Key:
    return (f.path, f.line, f.col, f.function)


@dataclass(frozen=True)
class ModelSpec:
    """A model to place each break for: its name and, when known, its reach facts."""

    name: str
    facts: Any = None  # pipeline.compat.reach.ModelFacts; None: every break is on its path


@dataclass(frozen=True)
class Site:
    """One ATOM call that binds at the base and breaks at the head."""

    atom_label: str  # how the ATOM commit was named: "main", "lock MiniMax-M3-MXFP4", a ref
    atom_sha: str
    finding: Finding  # the check's finding at the head
    cause: CauseInfo | None  # the commit in B..H that broke it (None: not found)
    cause_how: str  # "history" (the check's cause) or "bisected" (the range's commits)
    reach: tuple[tuple[str, str, str], ...] = ()  # (model, "on-path"/"off-path", evidence)

    @property
    def on_path_of(self) -> list[str]:
        return [m for m, r, _ in self.reach if r == "on-path"]

    def to_json(self) -> dict[str, Any]:
        f = self.finding
        return {
            "atom": self.atom_label,
            "atom_sha": self.atom_sha,
            "path": f.path,
            "line": f.line,
            "column": f.col,
            "function": f.function,
            "kind": f.kind,
            "message": f.message,
            "details": list(f.details),
            "cause": self.cause.to_json() if self.cause else None,
            "cause_found_by": self.cause_how,
            "models": {m: {"reach": r, "evidence": e} for m, r, e in self.reach},
        }


@dataclass(frozen=True)
class Definition:
    """An aiter definition whose change in B..H breaks ATOM calls."""

    name: str
    path: str
    line: int
    at: str  # the aiter SHA the location is read at (the head; the base when the head lacks it)
    sites: tuple[Site, ...]

    @property
    def on_path(self) -> bool:
        return any(s.on_path_of for s in self.sites)

    def to_json(self) -> dict[str, Any]:
        return {
            "function": self.name,
            "definition": {"path": self.path, "line": self.line, "aiter": self.at},
            "on_path_of": sorted({m for s in self.sites for m in s.on_path_of}),
            "sites": [s.to_json() for s in self.sites],
        }


@dataclass(frozen=True)
class AtomChecked:
    label: str
    sha: str
    calls_checked: int
    broken_at_base: int  # errors at the base too: not this range's doing, not listed


@dataclass(frozen=True)
class ImpactReport:
    aiter_base: str
    aiter_head: str
    commits: int  # first-parent commits in base..head
    atoms: tuple[AtomChecked, ...]
    models: tuple[str, ...]
    definitions: tuple[Definition, ...]
    fixed: int = 0  # calls with an error at the base and none at the head
    atom_web: str = ATOM_WEB
    aiter_web: str = AITER_WEB
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def sites(self) -> list[Site]:
        return [s for d in self.definitions for s in d.sites]

    def gates(self, d: Definition) -> bool:
        """A break on some model's path (with no model named, every break counts)."""
        return d.on_path or (not self.models and bool(d.sites))

    @property
    def breaks_on_path(self) -> bool:
        """Something on some model's path breaks (exit 4)."""
        return any(self.gates(d) for d in self.definitions)

    def summary(self) -> str:
        on = sorted({m for s in self.sites for m in s.on_path_of})
        n = len(self.sites)
        if not n:
            return f"no ATOM call breaks ({len(self.atoms)} ATOM commit(s) checked)"
        if not self.models:
            where = "no model named"
        elif on:
            where = f"on the path of {len(on)} model(s): {', '.join(on)}"
        else:
            where = "on no model's path"
        return (
            f"{n} ATOM call(s) break in {len(self.definitions)} aiter function(s), {where} "
            f"({len(self.atoms)} ATOM commit(s) checked)"
        )

    # -- renderings -------------------------------------------------------
    @staticmethod
    def _atom_json(a: AtomChecked) -> dict[str, Any]:
        return {
            "ref": a.label,
            "sha": a.sha,
            "calls_checked": a.calls_checked,
            "broken_at_base": a.broken_at_base,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": "atom-image-pipeline impact",
            "aiter_base": self.aiter_base,
            "aiter_head": self.aiter_head,
            "commits": self.commits,
            "atom": [self._atom_json(a) for a in self.atoms],
            "models": list(self.models),
            "breaks_on_path": self.breaks_on_path,
            "fixed": self.fixed,
            "functions": [d.to_json() for d in self.definitions],
            "notes": list(self.notes),
            "summary": self.summary(),
        }

    def to_text(self) -> str:
        lines = [
            f"aiter {self.aiter_base[:10]}..{self.aiter_head[:10]} ({self.commits} commit(s)) against "
            + ", ".join(f"ATOM {a.label} ({a.sha[:10]})" for a in self.atoms)
        ]
        for d in self.definitions:
            lines.append(f"{d.path}:{d.line}: `{d.name}`")
            for s in d.sites:
                f = s.finding
                lines.append(f"    ATOM {s.atom_sha[:10]} {f.path}:{f.line}:{f.col}: [{f.kind}] {f.message}")
                if s.cause is not None:
                    c = s.cause.commit
                    how = " (bisected)" if s.cause_how == "bisected" else ""
                    lines.append(f'        broken by aiter {c.sha} ("{c.subject}"){how}')
                else:
                    lines.append("        broken somewhere in the range (the commit was not found)")
                on = s.on_path_of
                off = [m for m, r, _ in s.reach if r != "on-path"]
                if s.reach:
                    lines.append(
                        f"        on the path of: {', '.join(on) or 'none'}"
                        + (f"; off the path of: {', '.join(off)}" if off else "")
                    )
        lines.extend(f"note: {n}" for n in self.notes)
        verdict = "BREAKS" if self.breaks_on_path else ("breaks off every path" if self.sites else "no break")
        lines.append(f"{verdict}: {self.summary()}")
        return "\n".join(lines)

    def to_sarif(self) -> dict[str, Any]:
        """SARIF 2.1.0 for the aiter pull request: primary locations are aiter definitions (so code
        scanning annotates the aiter diff), the ATOM call sites related locations at their SHAs."""
        results: list[dict[str, Any]] = []
        for d in self.definitions:
            related: list[dict[str, Any]] = []
            parts: list[str] = []
            for i, s in enumerate(d.sites, 1):
                f = s.finding
                url = f"{self.atom_web}/blob/{s.atom_sha}/{f.path}#L{f.line}"
                text = f"ATOM {s.atom_label} {f.path}:{f.line}"
                related.append(
                    {
                        "id": i,
                        "physicalLocation": {
                            "artifactLocation": {"uri": url},
                            "region": {"startLine": max(f.line, 1), "startColumn": max(f.col, 1)},
                        },
                        "message": {"text": text},
                    }
                )
                cause = f" by aiter {s.cause.commit.short}" if s.cause else ""
                models = f" (on the path of {', '.join(s.on_path_of)})" if s.on_path_of else ""
                parts.append(f"[{text}]({i}): [{f.kind}]{cause}{models}: {f.message}")
            head = f"`{d.name}` changed in aiter {self.aiter_base[:10]}..{self.aiter_head[:10]} breaks "
            head += f"{len(d.sites)} ATOM call(s) that bound before:"
            results.append(
                {
                    "ruleId": RULE_ID,
                    "ruleIndex": 0,
                    "level": "error" if self.gates(d) else "warning",
                    "message": {"text": "\n".join([head, *parts])},
                    "locations": [sarif_location(d.path, d.line)],
                    "relatedLocations": related,
                    "partialFingerprints": {"primaryLocationLineHash": f"{d.path}:{d.name}:{RULE_ID}"},
                    "properties": {
                        "function": d.name,
                        "onPathOf": sorted({m for s in d.sites for m in s.on_path_of}),
                        "causes": sorted({s.cause.commit.sha for s in d.sites if s.cause}),
                    },
                }
            )
        rule = sarif_rule(
            RULE_ID, "BreaksAtomCall", RULE_TEXT, self.atom_web, ["compatibility", "aiter", "atom"]
        )
        return sarif_log(
            tool="atom-image-pipeline impact",
            info_uri=self.atom_web,
            rules=[rule],
            repository=self.aiter_web,
            revision=self.aiter_head,
            properties={
                "aiterBase": self.aiter_base,
                "atom": {a.label: a.sha for a in self.atoms},
                "models": list(self.models),
            },
            results=results,
        )


def run_impact(
    atom: GitRepo,
    atom_refs: Sequence[tuple[str, str]],
    aiter: GitRepo,
    base_rev: str,
    head_rev: str,
    *,
    models: Sequence[ModelSpec] = (),
    cache_dir: Any = None,
    reach_of: Callable[[str, Any], Any] | None = None,
) -> ImpactReport:
    """The ATOM calls (at each `(label, rev)` of `atom_refs`) that bind at aiter `base_rev` and
    break at `head_rev`, each with the commit in the range that broke it, grouped by definition.

    `reach_of(atom_sha, facts) -> Reach` places a call on a model's path (default: `compute_reach`
    with the check's cache).
    """
    base = resolve_sha(aiter, base_rev, "aiter base")
    head = resolve_sha(aiter, head_rev, "aiter head")
    in_range = _Range(aiter, base, head)
    if reach_of is None:
        from pipeline.compat.reach import compute_reach

        def reach_of(sha: str, facts: Any) -> Any:
            return compute_reach(atom, sha, facts, cache_dir=cache_dir)

    atoms: list[AtomChecked] = []
    sites: list[tuple[Site, str, int, str]] = []  # site, definition path, line, SHA read at
    notes: list[str] = []
    fixed = 0
    seen: set[str] = set()
    for label, rev in atom_refs:
        sha = resolve_sha(atom, rev, "ATOM")
        if sha in seen:
            continue  # (the main branch and a lock at the same commit: checked once)
        seen.add(sha)
        at_base = run_check(atom, sha, aiter, base, cache_dir=cache_dir)
        at_head = run_check(atom, sha, aiter, head, cache_dir=cache_dir)
        before = {_key(f) for f in at_base.errors}
        after = {_key(f) for f in at_head.errors}
        fixed += len(before - after)
        new = [f for f in at_head.errors if _key(f) not in before]
        atoms.append(AtomChecked(label, sha, at_head.calls_checked, len(before & after)))
        if not new:
            continue
        bisect = _Bisect(atom, sha, aiter, head, in_range, cache_dir)
        places = _Places(atom, sha, aiter, base, cache_dir)
        reaches: dict[str, Any] = {}
        for m in models:
            if m.facts is None:
                continue
            try:
                reaches[m.name] = reach_of(sha, m.facts)
            except PipelineError as e:  # (a ReachError: when unsure, every break gates)
                notes.append(f"{m.name} at ATOM {sha[:10]}: reachability not computed ({e}); it gates")
        try:
            for f in new:
                cause, how = f.cause, "history"
                if cause is None or not in_range.has(cause.commit.sha):
                    cause, how = bisect.first_broken(_key(f)), "bisected"
                reach = tuple(_reach(m, reaches.get(m.name), f) for m in models)
                path, line, read_at = places.of(f, head)
                sites.append((Site(label, sha, f, cause, how, reach), path, line, read_at))
        finally:
            bisect.close()
            places.close()
    defs: dict[tuple[str, int], list[tuple[Site, str]]] = {}
    for site, path, line, read_at in sites:
        defs.setdefault((path, line), []).append((site, read_at))
    definitions = tuple(
        Definition(
            name=got[0][0].finding.function.rsplit(".", 1)[-1],
            path=path,
            line=line,
            at=got[0][1],
            sites=tuple(s for s, _ in got),
        )
        for (path, line), got in sorted(defs.items())
    )
    return ImpactReport(
        aiter_base=base,
        aiter_head=head,
        commits=len(in_range.commits),
        atoms=tuple(atoms),
        models=tuple(m.name for m in models),
        definitions=definitions,
        fixed=fixed,
        notes=tuple(notes),
    )


def _reach(model: ModelSpec, reach: Any, f: Finding) -> tuple[str, str, str]:
    if reach is None:
        why = "no architecture known" if model.facts is None else "reachability not computed"
        return (model.name, "on-path", f"{why}: every break gates")
    if reach.on_path(f.path):
        return (model.name, "on-path", reach.evidence(f.path))
    return (model.name, "off-path", reach.evidence(f.path))


class _Range:
    """The first-parent commits of base..head, oldest first, and membership."""

    def __init__(self, aiter: GitRepo, base: str, head: str) -> None:
        self.aiter = aiter
        self.base = base
        self.head = head
        out = aiter.git("rev-list", "--first-parent", "--reverse", f"{base}..{head}")
        self.commits = out.split()
        self._all: set[str] | None = None

    def has(self, sha: str) -> bool:
        if sha in self.commits:
            return True
        if self._all is None:  # a commit merged in by a first-parent merge of the range
            self._all = set(self.aiter.git("rev-list", f"{self.base}..{self.head}").split())
        return sha in self._all


class _Bisect:
    """The first commit of the range at which a call has an error (the check, without causes)."""

    def __init__(
        self, atom: GitRepo, atom_sha: str, aiter: GitRepo, head: str, rng: _Range, cache_dir: Any
    ) -> None:
        self.args = (atom, atom_sha, aiter, head, cache_dir)
        self.rng = rng
        self._checker: Checker | None = None
        self._caches: Caches | None = None
        self._errors: dict[str, set[Key]] = {}

    def _broken(self, sha: str, key: Key) -> bool:
        if sha not in self._errors:
            atom, atom_sha, aiter, head, cache_dir = self.args
            if self._checker is None:
                self._caches = Caches.open(cache_dir)
                self._checker = Checker(atom, atom_sha, aiter, self._caches, tip=aiter_tip(aiter, head))
            report: CheckReport = self._checker.check(sha, with_causes=False)
            self._errors[sha] = {_key(f) for f in report.errors}
        return key in self._errors[sha]

    def first_broken(self, key: Key) -> CauseInfo | None:
        commits = self.rng.commits
        if not commits:
            return None
        lo, hi = 0, len(commits) - 1  # commits[hi] (the head) is broken
        while lo < hi:
            mid = (lo + hi) // 2
            if self._broken(commits[mid], key):
                hi = mid
            else:
                lo = mid + 1
        aiter = self.args[2]
        c = aiter.commit_info(commits[lo])
        parent = self.rng.base if lo == 0 else commits[lo - 1]
        return CauseInfo(c, parent, "the first commit of the range at which the call breaks", "")

    def close(self) -> None:
        if self._caches is not None:
            self._caches.close()
            self._caches.save()


class _Places:
    """Where the definition a finding is about lives: at the head, or at the base when it is gone."""

    def __init__(self, atom: GitRepo, atom_sha: str, aiter: GitRepo, base: str, cache_dir: Any) -> None:
        self.args = (atom, atom_sha, aiter, base, cache_dir)
        self._caches: Caches | None = None

    def of(self, f: Finding, head: str) -> tuple[str, int, str]:
        if f.defined_at:
            path, _, line = f.defined_at.rpartition(":")
            return path, int(line), head
        found = self._at_base(f)
        if found is not None:
            return (*found, self.args[3])
        return f"{AITER_PREFIX}/__init__.py", 1, head  # a module gone: the package the call reached through

    def _at_base(self, f: Finding) -> tuple[str, int] | None:
        from pipeline.compat.aiterapi import ApiIndex
        from pipeline.compat.calls import scan_file
        from pipeline.compat.pysource import Tree

        atom, atom_sha, aiter, base, cache_dir = self.args
        if self._caches is None:
            self._caches = Caches.open(cache_dir)
        tree = Tree.load(atom, atom_sha, prefix=ATOM_PREFIX)
        blob = tree.blobs.get(f.path)
        if blob is None:
            return None
        calls = self._caches.atom.get_many(atom, [(f.path, blob)], scan_file)[f.path]
        call = next((c for c in calls.calls if (c.line, c.col) == (f.line, f.col)), None)
        if call is None:
            return None
        t = target_of(ApiIndex(Tree.load(aiter, base, prefix=AITER_PREFIX), self._caches.aiter), call)
        return (t.sig.path, t.sig.line) if t.sig is not None else None

    def close(self) -> None:
        if self._caches is not None:
            self._caches.close()
            self._caches.save()


def with_links(report: ImpactReport, atom_url: str | None, aiter_url: str | None) -> ImpactReport:
    """The report with its SARIF links based on these repositories (GitHub https URLs only)."""
    return replace(report, atom_web=web_url(atom_url) or ATOM_WEB, aiter_web=web_url(aiter_url) or AITER_WEB)


def web_url(url: str | None) -> str | None:
    """`https://github.com/ROCm/ATOM.git` -> `https://github.com/ROCm/ATOM`; a local path: None."""
    if not url or not url.startswith("https://"):
        return None
    return url.removesuffix("/").removesuffix(".git")
