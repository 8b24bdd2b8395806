"""Ref resolution in a mirror: branches, tags, full or short SHAs, `HEAD`, `rev~N`; near misses named."""

from __future__ import annotations

import difflib
import re

from pipeline.errors import SourceError, UsageError
from pipeline.gitw import CommitInfo, GitRepo
from pipeline.sources.mirrors import last_fetched

_HEX = re.compile(r"^[0-9a-fA-F]{4,40}$")


def _ref_sha(repo: GitRepo, full_ref: str) -> str | None:
    try:
        out = repo.git("rev-parse", "--verify", "--quiet", f"{full_ref}^{{commit}}")
    except SourceError:
        return None
    return out.strip() or None


def _commit_candidates(repo: GitRepo, prefix: str) -> list[str]:
    """Full SHAs of commits whose name starts with `prefix`."""
    try:
        out = repo.git("rev-parse", f"--disambiguate={prefix.lower()}")
    except SourceError:
        return []
    shas = [s for s in out.split() if s]
    if not shas:
        return []
    commits = []
    for sha in shas:
        try:
            if repo.git("cat-file", "-t", sha) == "commit":
                commits.append(sha)
        except SourceError:
            continue
    return commits


def nearest_refs(repo: GitRepo, ref: str, n: int = 5) -> list[str]:
    names = repo.refs()
    names = [r for r in names if not r.startswith("pins/")]
    close = difflib.get_close_matches(ref, names, n=n, cutoff=0.6)
    if not close:
        low = ref.lower()
        close = [r for r in names if low in r.lower()][:n]
    return close


def resolve_ref(repo: GitRepo, ref: str, *, url: str, name: str = "") -> CommitInfo:
    """Resolve a branch, tag (annotated tags peeled), full or short SHA, or `HEAD` to a commit.

    Branch and tag names are those of the remote (the mirror's `refs/heads`,
    `refs/tags`). `rev~N` / `rev^` expressions are accepted too. Unknown or
    ambiguous refs are `SourceError`s naming the repository.
    """
    what = f"{name} " if name else ""
    ref = ref.strip()
    if not ref:
        raise UsageError(f"empty {what}ref for {url}.", hint="Give a branch, tag, SHA or HEAD.")

    if ref == "HEAD":
        sha = _ref_sha(repo, "HEAD")
        if sha is None:
            raise SourceError(f"{what}repository {url} has no HEAD commit (empty repository?).")
        return repo.commit_info(sha)

    if ref.startswith("refs/"):
        sha = _ref_sha(repo, ref)
        if sha is not None:
            return repo.commit_info(sha)
    else:
        branch = _ref_sha(repo, f"refs/heads/{ref}")
        tag = _ref_sha(repo, f"refs/tags/{ref}")
        if branch and tag and branch != tag:
            raise SourceError(
                f"{what}ref {ref!r} is both a branch and a tag in {url}, at different commits.",
                hint=f"Say which: refs/heads/{ref} or refs/tags/{ref}.",
            )
        if branch or tag:
            return repo.commit_info(branch or tag or "")

    looks_sha = bool(_HEX.match(ref))
    if looks_sha:
        if len(ref) == 40:
            if _ref_sha(repo, ref.lower()):
                return repo.commit_info(ref.lower())
        else:
            cands = _commit_candidates(repo, ref)
            if len(cands) == 1:
                return repo.commit_info(cands[0])
            if len(cands) > 1:
                listed = "; ".join(
                    f"{c[:12]} {repo.commit_info(c).subject[:60]!r}" for c in sorted(cands)[:10]
                )
                raise SourceError(
                    f"{what}short SHA {ref!r} is ambiguous in {url}: {len(cands)} commits match ({listed}).",
                    hint="Give more hex digits, or the full 40-character SHA.",
                )

    if not looks_sha and any(c in ref for c in "~^") and not ref.startswith("-"):
        sha = _ref_sha(repo, ref)
        if sha is not None:
            return repo.commit_info(sha)

    near = nearest_refs(repo, ref.removeprefix("origin/"))
    parts = [f"{what}ref {ref!r} not found in {url}."]
    if looks_sha:
        parts.append(
            f"It looks like a commit SHA, but no commit starting with {ref.lower()!r} is in the mirror "
            f"(last fetched {last_fetched(repo.path)}); it may be on an unfetched branch, "
            "or not pushed upstream."
        )
    if near:
        parts.append("Nearest refs: " + ", ".join(near) + ".")
    else:
        head = repo.git("symbolic-ref", "--quiet", "--short", "HEAD") if _ref_sha(repo, "HEAD") else ""
        if head:
            parts.append(f"The default branch is {head}.")
    raise SourceError(
        " ".join(parts),
        hint="Give a branch, tag, full or unique short SHA, or HEAD.",
    )
