"""The patch-queue round trip (as `gbp pq import` / `gbp pq export`).

`import_series` turns the series into one commit per patch on a branch of an
ATOM work tree, for a release engineer to edit (reorder, fix, add commits).
`export_series` turns the commits `base..tip` back into `NNNN-slug.patch`
files with their DEP-3 headers and regenerates `series`; `new_patch` appends
one commit as the next patch. The header fields travel through the commits
as trailers (the last paragraph of the message), so export after import
gives the same files and the same tree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PatchError
from pipeline.fsutil import atomic_write_text
from pipeline.gitw import GitRepo
from pipeline.patchq.apply import commit_patch, dirty_summary, is_dirty, refs_snapshot, restore_refs
from pipeline.patchq.model import (
    AITER_AFTER,
    AITER_REQUIRES,
    DEP3_FIELDS,
    PIPELINE_FIELDS,
    RANGE,
    VERSION,
    Patch,
    PatchSeries,
)

PQ_PREFIX = "patch-queue"
_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):[ \t]+(.*)$")
_KNOWN = {f.lower() for f in (*DEP3_FIELDS, *PIPELINE_FIELDS)}
# Header order in exported files (unknown fields follow, in their own order).
FIELD_ORDER = (
    "Description",
    "Origin",
    "Bug",
    "Forwarded",
    "Author",
    "Reviewed-by",
    "Acked-by",
    "Applied-Upstream",
    "Last-Update",
    RANGE,
    AITER_AFTER,
    AITER_REQUIRES,
    VERSION,
)
SERIES_HEADER = "# ATOM patch series: applied in this order (see docs/patches.md).\n"


def work_tree_of(repo: GitRepo) -> Path:
    wt = repo.repo.working_tree_dir
    if repo.repo.bare or wt is None:
        raise PatchError(
            f"{repo.path} is a bare repository; this needs an ATOM work tree.",
            hint="Clone ATOM (or `git worktree add` from the mirror) and pass its path with --repo.",
        )
    return Path(wt)


def _refuse_dirty(repo: GitRepo, wt: Path) -> None:
    dirty = is_dirty(repo, wt)
    if dirty:
        raise PatchError(
            f"the work tree {wt} has uncommitted changes ({dirty_summary(dirty)}); refusing to touch it.",
            hint="Commit or stash them first.",
            evidence=dirty,
        )


# -- import ------------------------------------------------------------------------


def import_series(
    series: PatchSeries, repo: GitRepo, base: str, *, branch: str | None = None, force: bool = False
) -> tuple[str, str]:
    """Apply every patch (no range checks) as commits on `branch` from `base`, checked out.

    Returns (branch, head sha). All or nothing: on failure the work tree is
    back on its original branch and every ref is as before.
    """
    wt = work_tree_of(repo)
    base_sha = repo.rev_parse(base)
    if base_sha is None:
        raise PatchError(f"base {base} is not a commit in {repo.path}.", hint="Fetch it first.")
    branch = branch or f"{PQ_PREFIX}/{base_sha[:7]}"
    _refuse_dirty(repo, wt)
    if repo.rev_parse(f"refs/heads/{branch}") is not None and not force:
        raise PatchError(
            f"branch {branch} already exists in {repo.path}.",
            hint="Export it first (`pipeline patch export`), then delete it, or pass --force.",
        )
    before = refs_snapshot(repo)
    orig = repo.run("symbolic-ref", "-q", "--short", "HEAD").stdout.strip() or before["HEAD"]
    try:
        res = repo.run("checkout", "-q", "-B", branch, base_sha, work_tree=wt)
        if not res.ok:
            raise PatchError(f"cannot create branch {branch}: {res.stderr.strip()}", evidence=res.stderr)
        head = base_sha
        for patch in series:
            head = commit_patch(repo, wt, patch)
        return branch, head
    except BaseException:
        repo.run("reset", "-q", "--hard", work_tree=wt)
        repo.run("checkout", "-q", "-f", orig, work_tree=wt)
        restore_refs(repo, before)
        raise


# -- export ------------------------------------------------------------------------


@dataclass(frozen=True)
class Exported:
    name: str
    text: str


def slugify(subject: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", subject).strip("-").lower()
    if len(slug) > 52:
        cut = slug[:53]
        slug = cut.rsplit("-", 1)[0] if "-" in cut else slug[:52]  # whole words only
    return slug.strip("-") or "patch"


def split_message(message: str) -> tuple[str, str, list[tuple[str, str]]]:
    """(subject, body, trailers) of a commit message; trailers are our known fields."""
    lines = message.strip("\n").split("\n")
    subject = lines[0].strip()
    rest = "\n".join(lines[1:]).strip("\n")
    paragraphs = re.split(r"\n\s*\n", rest) if rest else []
    trailers: list[tuple[str, str]] = []
    if paragraphs:
        last = paragraphs[-1].split("\n")
        parsed: list[tuple[str, str]] = []
        ok = True
        for line in last:
            if line[:1] in (" ", "\t") and parsed:
                k, v = parsed[-1]
                parsed[-1] = (k, f"{v}\n{line.strip()}")
                continue
            m = _FIELD.match(line)
            if not m:
                ok = False
                break
            parsed.append((m.group(1), m.group(2).strip()))
        if ok and any(k.lower() in _KNOWN for k, _ in parsed):
            trailers = parsed
            paragraphs = paragraphs[:-1]
    body = "\n\n".join(paragraphs).strip("\n")
    return subject, body, trailers


def _ordered(fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
    rank = {f.lower(): i for i, f in enumerate(FIELD_ORDER)}
    known = sorted((f for f in fields if f[0].lower() in rank), key=lambda f: rank[f[0].lower()])
    return known + [f for f in fields if f[0].lower() not in rank]


def format_commit(
    repo: GitRepo, sha: str, *, base: str, overrides: Mapping[str, str] | None = None
) -> Exported:
    """One commit as a patch file with DEP-3 headers (missing required fields get defaults)."""
    meta = repo.run("show", "-s", "--format=%P%x00%an%x00%ae%x00%aD%x00%as%x00%B", sha)
    if not meta.ok:
        raise PatchError(f"cannot read commit {sha}: {meta.stderr.strip()}", evidence=meta.stderr)
    parents, name, email, date, day, message = meta.stdout.split("\x00", 5)
    if len(parents.split()) != 1:
        raise PatchError(
            f"commit {sha[:10]} is a merge or a root commit; a patch series is linear.",
            hint="Rebase the patch-queue branch onto the pinned ATOM commit without merges.",
        )
    parent = parents.strip()
    subject, body, trailers = split_message(message)
    fields = {k.lower(): (k, v) for k, v in trailers}
    for k, v in (overrides or {}).items():
        fields[k.lower()] = (k, v)
    defaults = (
        ("Origin", "vendor"),
        ("Forwarded", "no"),
        ("Last-Update", day.strip()),
        (RANGE, f"{base[:12]}.."),
        (VERSION, "1"),
    )
    for k, v in defaults:
        fields.setdefault(k.lower(), (k, v))
    diff = repo.run(
        "diff",
        "--full-index",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--no-renames",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        parent,
        sha,
    )
    stat = repo.run("diff", "--stat=72", "--no-color", "--no-renames", parent, sha)
    if not (diff.ok and stat.ok):
        raise PatchError(f"cannot diff commit {sha[:10]}: {(diff.stderr + stat.stderr).strip()}")
    if not diff.stdout.strip():
        raise PatchError(f"commit {sha[:10]} ({subject}) changes nothing; an empty patch is not allowed.")
    head = [f"From: {name} <{email}>", f"Date: {date}", f"Subject: {subject}"]
    for k, v in _ordered(list(fields.values())):
        head.append(f"{k}: {v}".replace("\n", "\n "))
    text = "\n".join(head) + "\n\n"
    if body:
        text += body + "\n"
    text += "---\n" + stat.stdout.rstrip("\n") + "\n\n" + diff.stdout
    if not text.endswith("\n"):
        text += "\n"
    return Exported(slugify(subject), text)


def _commits(repo: GitRepo, base: str, tip: str) -> list[str]:
    base_sha, tip_sha = repo.rev_parse(base), repo.rev_parse(tip)
    if base_sha is None or tip_sha is None:
        raise PatchError(f"{base if base_sha is None else tip} is not a commit in {repo.path}.")
    if not repo.is_ancestor(base_sha, tip_sha):
        raise PatchError(
            f"{tip} does not descend from the base {base}.",
            hint="Export commits made on top of the pinned ATOM commit.",
        )
    out = repo.run("rev-list", "--reverse", "--topo-order", f"{base_sha}..{tip_sha}")
    return out.stdout.split()


def _validated(directory: Path, name: str, text: str) -> None:
    Patch.parse(text.encode(), path=directory / name)  # never write a file we would refuse to read


def export_series(repo: GitRepo, base: str, tip: str, directory: Path) -> list[Path]:
    """Regenerate `directory` (patch files + `series`) from the commits base..tip."""
    commits = _commits(repo, base, tip)
    if not commits:
        raise PatchError(f"no commits between {base} and {tip}: nothing to export.")
    base_sha = repo.rev_parse(base) or base
    out: list[tuple[str, str]] = []
    for n, sha in enumerate(commits, 1):
        e = format_commit(repo, sha, base=base_sha)
        name = f"{n:04d}-{e.name}.patch"
        _validated(directory, name, e.text)
        out.append((name, e.text))
    directory.mkdir(parents=True, exist_ok=True)
    keep = {name for name, _ in out}
    for old in directory.glob("[0-9][0-9][0-9][0-9]-*.patch"):
        if old.name not in keep:
            old.unlink()
    written = []
    for name, text in out:
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            atomic_write_text(path, text)
        written.append(path)
    write_series(directory, [name for name, _ in out])
    return written


def write_series(directory: Path, names: list[str]) -> None:
    atomic_write_text(directory / "series", SERIES_HEADER + "".join(f"{n}\n" for n in names))


def new_patch(
    repo: GitRepo, commit: str, base: str, directory: Path, *, overrides: Mapping[str, str] | None = None
) -> Path:
    """Append `commit` to the series as the next `NNNN-slug.patch`."""
    sha = repo.rev_parse(commit)
    base_sha = repo.rev_parse(base)
    if sha is None or base_sha is None:
        raise PatchError(f"{commit if sha is None else base} is not a commit in {repo.path}.")
    series = PatchSeries.load(directory) if (directory / "series").is_file() else PatchSeries(directory)
    e = format_commit(repo, sha, base=base_sha, overrides=overrides)
    numbers = [int(p.name[:4]) for p in series]
    name = f"{max(numbers, default=0) + 1:04d}-{e.name}.patch"
    _validated(directory, name, e.text)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_text(directory / name, e.text)
    write_series(directory, [p.name for p in series] + [name])
    return directory / name
