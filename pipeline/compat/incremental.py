"""Whole-history git facts carried from one night's commit to the next.

A scheduled check sees aiter's tip and ATOM's commit a few commits on from the
last run. The facts read over a whole history (aiter's first parents, its
`git log --raw`, when each ATOM file was added) are then the last run's plus
those few commits: one `git log base..tip` instead of a walk of the history,
and only when the old commit is provably where the new history passes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from pipeline.gitw import GitRepo, GitSoon

KEEP_TIPS = 2  # whole-history entries kept per kind (the newest): each is read by every run


def first_parents_since(repo: GitRepo, tip: str, base: str) -> list[tuple[int, str]] | None:
    """(commit time, sha) of `tip`'s first parents after `base`, newest first, when `base` is one of
    them (else None: the history must be read whole)."""
    if tip == base:
        return []
    out = repo.git("log", "--first-parent", "--format=%ct %H %P", tip, f"^{base}")
    rows = [line.split() for line in out.splitlines() if line]
    if not rows or len(rows[-1]) < 3 or rows[-1][2] != base:
        return None  # `base` is not on `tip`'s first parents (a rewritten or other branch)
    return [(int(r[0]), r[1]) for r in rows]


def linear_args(new: str, base: str) -> tuple[str, ...]:
    """The git command `linear_since` reads (started early by a caller that knows it will ask)."""
    return ("rev-list", "--topo-order", "--parents", new, f"^{base}")


def linear_since(repo: GitRepo, new: str, base: str, ahead: GitSoon | None = None) -> list[str] | None:
    """The commits from `base` (excluded) to `new`, newest first, when each has a single parent and
    the chain ends on `base`: then any history walk from `new` is the one from `base` plus these.
    `ahead`: `linear_args` begun earlier."""
    if new == base:
        if ahead is not None:
            ahead.cancel()
        return []
    out = ahead.stdout() if ahead is not None else repo.git(*linear_args(new, base))
    rows = [line.split() for line in out.splitlines() if line]
    if not rows or any(len(r) != 2 for r in rows):
        return None  # a merge in between (its other side may hold anything), or `base` not below
    for child, parent in itertools.pairwise(rows):
        if child[1] != parent[0]:
            return None
    return [r[0] for r in rows] if rows[-1][1] == base else None


def newest(keys: Iterable[str], prefix: str, suffix: str = "") -> list[str]:
    """The keys `prefix<sha><suffix>` in insertion order reversed (the newest entry first)."""
    return [k for k in reversed(list(keys)) if k.startswith(prefix) and k.endswith(suffix)]
