"""Drift: what changed upstream in each recipe's source since the ATOM it was imported from.

`drift_one` re-reads a recipe's upstream markdown (pipeline.recipes.upstream) at a newer ATOM and
reports what changed (server flags, environment, reference numbers) with the upstream commits that
changed it, or the commit that removed the source.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from pipeline.gitw import CommitInfo, GitRepo
from pipeline.recipes.upstream import UPSTREAM, RecipeParseError, Variant, source_of, variants_at


@dataclass(frozen=True)
class Change:
    what: str  # "server", "environment", "gsm8k reference", ...
    old: Any
    new: Any
    commits: tuple[CommitInfo, ...]  # the upstream commits that changed it, oldest first


@dataclass(frozen=True)
class Drift:
    recipe: str
    path: str
    old: str
    new: str
    changes: tuple[Change, ...] = ()
    removed_by: CommitInfo | None = None
    note: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.changes) or self.removed_by is not None or bool(self.note)

    def summary(self) -> str:
        if self.removed_by is not None:
            c = self.removed_by
            return f"source {self.path} removed by ATOM {c.short} ({c.iso_date[:10]}, {c.subject!r})"
        if self.note:
            return self.note
        if not self.changes:
            return "no change upstream"
        return "; ".join(
            f"{c.what} changed by ATOM " + ", ".join(f"{x.short} ({x.subject!r})" for x in c.commits)
            for c in self.changes
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "source": self.path,
            "from": self.old,
            "to": self.new,
            "removed_by": self.removed_by.sha if self.removed_by else None,
            "note": self.note,
            "changes": [
                {
                    "what": c.what,
                    "old": c.old,
                    "new": c.new,
                    "commits": [{"sha": x.sha, "date": x.iso_date, "subject": x.subject} for x in c.commits],
                }
                for c in self.changes
            ],
        }


_PARSED: dict[tuple[str, str, str], tuple[list[Variant], list[str], list[RecipeParseError]] | str | None] = {}


def _facts(atom: GitRepo, rev: str, path: str, name: str) -> dict[str, Any] | str | None:
    """The variant's facts at rev; a string says why there are none; None: the file is absent."""
    key = (str(atom.path), rev, path)
    if key not in _PARSED:  # a commit's file never changes: parse it once per process
        try:
            _PARSED[key] = variants_at(atom, rev, path)
        except RecipeParseError as e:
            _PARSED[key] = f"upstream no longer parses: {e.message}"
    got = _PARSED[key]
    if got is None or isinstance(got, str):
        return got
    for v in got[0]:
        if v.name == name:
            return v.facts()
    return f"{path} @ {rev[:10]} has no MI355 variant {name} any more"


def _diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, old, new) for each field that differs; argv lists as (removed, added) words."""
    out: list[tuple[str, Any, Any]] = []
    for k in a:
        old, new = a[k], b.get(k)
        if old == new:
            continue
        if isinstance(old, list) and isinstance(new, list) and all(isinstance(x, str) for x in old + new):
            out.append((k, [x for x in old if x not in new], [x for x in new if x not in old]))
        elif isinstance(old, dict) and isinstance(new, dict):
            keys = [x for x in sorted(set(old) | set(new)) if old.get(x) != new.get(x)]
            out.append((k, {x: old.get(x) for x in keys}, {x: new.get(x) for x in keys}))
        else:
            out.append((k, old, new))
    return out


_LOGS: dict[tuple[str, str, str, str], list[CommitInfo]] = {}


def drift_one(atom: GitRepo, recipe_name: str, source: str, new_rev: str) -> Drift:
    got = source_of(source)
    if got is None:
        return Drift(
            recipe_name, "", "", new_rev, note=f"source {source!r} is not a {UPSTREAM} recipe: not checked"
        )
    path, old = got
    old_sha = atom.rev_parse(old)
    new_sha = atom.rev_parse(new_rev)
    if old_sha is None or new_sha is None:
        missing = old if old_sha is None else new_rev
        raise ConfigError(f"ATOM {missing} is not in {atom.path}.", hint="Fetch the ATOM mirror.")
    before = _facts(atom, old_sha, path, recipe_name)
    if not isinstance(before, dict):
        note = before or f"{path} does not exist at the recipe's own source commit {old_sha[:10]}"
        return Drift(recipe_name, path, old_sha, new_sha, note=note)
    # Oldest first: the commits between the two pins that touched the file (renames not followed);
    # one `git log` per source and range (no process at all for a recipe already at the new pin).
    key = (str(atom.path), old_sha, new_sha, path)
    if key not in _LOGS:
        _LOGS[key] = [] if old_sha == new_sha else list(reversed(atom.log(f"{old_sha}..{new_sha}", [path])))
    commits = _LOGS[key]
    prev: dict[str, Any] = before
    by: dict[str, list[CommitInfo]] = {}
    for c in commits:
        now = _facts(atom, c.sha, path, recipe_name)
        if now is None:
            return Drift(recipe_name, path, old_sha, new_sha, removed_by=c)
        if isinstance(now, str):
            return Drift(recipe_name, path, old_sha, new_sha, note=f"{now} (since ATOM {c.short})")
        for what, _, _ in _diff(prev, now):
            by.setdefault(what, []).append(c)
        prev = now
    final = [Change(w, o, n, tuple(by.get(w, ()))) for w, o, n in _diff(before, prev)]
    return Drift(recipe_name, path, old_sha, new_sha, tuple(final))


def drift_all(atom: GitRepo, recipes_dir: Path, new_rev: str, models: Sequence[str] = ()) -> list[Drift]:
    from pipeline.recipes.recipe import load_recipe

    out = []
    for p in sorted(recipes_dir.glob("*.yaml")):
        if models and p.stem not in models:
            continue
        r = load_recipe(p)
        out.append(drift_one(atom, r.name, r.source, new_rev))
    return out


def drift_text(drifts: Sequence[Drift]) -> str:
    lines = []
    for d in drifts:
        head = f"{d.recipe}: {d.path or '-'} {d.old[:10]}..{d.new[:10]}: {d.summary()}"
        lines.append(head)
        for c in d.changes:
            lines.append(f"    {c.what}: {json.dumps(c.old)} -> {json.dumps(c.new)}")
    return "\n".join(lines) + ("\n" if lines else "")
