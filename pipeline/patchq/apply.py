"""Check and apply the series against the pinned ATOM and aiter commits.

`check_series` never touches the repository: it applies patches to a
scratch index whose new objects go to a temporary object directory (the
repository's objects are only read, as alternates).

`apply_series` makes one commit per patch in a fresh linked work tree of the
pinned ATOM commit (detached), then points the ref
`refs/pipeline/patched/<atom7>-<series7>` at the result. That ref is outside
`refs/heads/`, which the mirror's fetch prunes to upstream's branches: a later
`pin` never deletes it, nor leaves the work tree on a vanished branch. All or nothing: on any
failure the work tree is removed and every ref is restored, then checked to
be exactly as before. Commits are deterministic (author and committer taken
from the patch), so the same inputs give the same patched SHA.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.errors import PatchError, PipelineError
from pipeline.gitw import GitRepo, GitResult
from pipeline.lock import PatchPin
from pipeline.patchq.conditions import aiter_conditions, atom_in_range
from pipeline.patchq.model import Patch, PatchSeries, series_digest

Status = Literal["applies", "not-needed", "already-upstream", "conflict"]
# The tool's own refs in the ATOM mirror: never under refs/heads/ (pruned by every fetch).
REF_PREFIX = "refs/pipeline/patched"


@dataclass(frozen=True)
class PatchCheck:
    patch: Patch
    status: Status
    reason: str
    hunks: tuple[str, ...] = ()  # failing hunks: "path @@ -a,b +c,d @@ (patch line N)"
    three_way: str = ""  # the three-way attempt's result (conflicts only)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.patch.name,
            "sha256": self.patch.sha256,
            "version": self.patch.version,
            "status": self.status,
            "reason": self.reason,
            "hunks": list(self.hunks),
            "three_way": self.three_way,
        }

    def line(self) -> str:
        text = f"{self.patch.name}: {self.status} ({self.reason})"
        for h in self.hunks:
            text += f"\n    failing hunk: {h}"
        if self.three_way:
            text += f"\n    three-way: {self.three_way}"
        return text


@dataclass(frozen=True)
class AppliedSeries:
    head_sha: str  # the patched commit (== atom_sha when nothing applied)
    pins: tuple[PatchPin, ...]  # what the lock records
    notes: list[str] = field(default_factory=list)
    worktree: Path | None = None
    branch: str | None = None

    @property
    def applied(self) -> tuple[PatchPin, ...]:
        return tuple(p for p in self.pins if p.status == "applied")


# -- what git applies ----------------------------------------------------------------


def exact_copy(patch: Patch, directory: Path) -> Path:
    """The bytes `patch` was parsed from, in a file of ours: git applies exactly what was validated."""
    copy = directory / f"exact-{patch.name}"
    copy.write_bytes(patch.data)
    return copy


@dataclass(frozen=True)
class GitTouch:
    """One file as `git apply --numstat` reports it would change it."""

    added: int | None  # None: a binary change
    deleted: int | None
    old_path: str | None  # set for a rename or copy
    path: str


def git_view(repo: GitRepo, patch_file: Path) -> tuple[tuple[GitTouch, ...], tuple[str, ...]]:
    """(the files, the `--summary` lines) that `git apply` reads in `patch_file`, applying nothing."""
    what = f"read {patch_file.name} as git does"
    numstat = _must(repo.run("apply", "--numstat", "-z", str(patch_file)), what)
    touches: list[GitTouch] = []
    items = numstat.stdout.split("\0")
    k = 0
    while k < len(items):
        item = items[k]
        k += 1
        if not item:
            continue
        added, deleted, name = item.split("\t", 2)
        old = None
        if not name:  # a rename or copy: the old and the new path follow
            old, name = items[k], items[k + 1]
            k += 2
        text = added.isdigit() and deleted.isdigit()  # a binary change counts `-` `-`
        touches.append(GitTouch(int(added) if text else None, int(deleted) if text else None, old, name))
    summary = _must(repo.run("apply", "--summary", str(patch_file)), what)
    return tuple(touches), tuple(line.strip() for line in summary.stdout.splitlines() if line.strip())


def _ours(patch: Patch) -> tuple[list[GitTouch], list[str]]:
    """What our parse says git should report: the same shape as `git_view`."""
    touches: list[GitTouch] = []
    summary: list[str] = []
    for fd in patch.files:
        body = [line for h in fd.hunks for line in h.lines]
        added = sum(1 for line in body if line.startswith("+"))
        deleted = sum(1 for line in body if line.startswith("-"))
        moved = fd.old_path is not None and fd.new_path is not None and fd.old_path != fd.new_path
        touches.append(GitTouch(added, deleted, fd.old_path if moved else None, fd.path))
        if fd.old_path is None:
            summary.append(f"create mode {fd.new_mode} {fd.path}")
        elif fd.new_path is None:
            summary.append(f"delete {fd.path}")
    return touches, summary


def same_as_git(patch: Patch, repo: GitRepo, patch_file: Path) -> tuple[GitTouch, ...]:
    """Refuse `patch` unless git would change exactly the files, lines and modes our parse read.

    Returns git's view: the files the patch changes are what git says, never what we parsed.
    """
    touches, summary = git_view(repo, patch_file)
    want, want_summary = _ours(patch)
    binary = [t.path for t in touches if t.added is None]
    if binary:
        raise PatchError(
            f"{patch.name}: git would apply a binary change to {', '.join(binary)}; "
            "binary patches are refused.",
            hint="Ship binary changes some other way. Nothing was applied.",
        )
    got_summary = [
        line if not line.startswith("delete mode ") else "delete " + line.split(" ", 3)[3]
        for line in summary
        if line.startswith(("create mode ", "delete mode "))
    ]
    if sorted(touches, key=repr) != sorted(want, key=repr) or sorted(got_summary) != sorted(want_summary):
        extra = sorted({t.path for t in touches} - {t.path for t in want})
        what = (
            f"files the patch does not show: {', '.join(extra)}"
            if extra
            else "changes (lines, modes or files) other than the ones the patch shows"
        )
        raise PatchError(
            f"{patch.name}: git would apply {what}; refused. Nothing was applied.",
            hint="A patch must hold exactly the diff it shows: regenerate it with `pipeline patch export`.",
            evidence="git apply --numstat/--summary:\n"
            + "\n".join(f"{t.added}\t{t.deleted}\t{t.old_path or ''}\t{t.path}" for t in touches)
            + "\n"
            + "\n".join(summary),
        )
    return touches


# -- scratch index ---------------------------------------------------------------


def objects_dir(repo: GitRepo) -> Path:
    return Path(repo.repo.common_dir) / "objects"


class _Scratch:
    """An index of `base` in a temp dir; written objects stay in the temp dir."""

    def __init__(self, repo: GitRepo, base: str, tmp: Path) -> None:
        self.repo = repo
        self.tmp = tmp
        (tmp / "objects").mkdir()
        self.env = {
            "GIT_INDEX_FILE": str(tmp / "index"),
            "GIT_OBJECT_DIRECTORY": str(tmp / "objects"),
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(objects_dir(repo)),
        }
        _must(self.repo.run("read-tree", base, env=self.env), f"read {base[:9]} into a scratch index")
        self._n = 0

    def apply(
        self,
        patch_file: Path,
        *,
        check: bool = False,
        reverse: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> GitResult:
        args = ["apply", "--cached", "--whitespace=nowarn"]
        if check:
            args.append("--check")
        if reverse:
            args.append("-R")
        return self.repo.run(*args, str(patch_file.resolve()), env=env or self.env)

    def text_file(self, text: str) -> Path:
        self._n += 1
        p = self.tmp / f"piece-{self._n}.patch"
        p.write_text(text, encoding="utf-8")
        return p

    def failing_hunks(self, patch: Patch) -> tuple[str, ...]:
        failing: list[str] = []
        for fd in patch.files:
            if not fd.hunks:
                if not self.apply(self.text_file("\n".join(fd.head) + "\n"), check=True).ok:
                    failing.append(f"{fd.path} (file header, patch line {fd.line})")
                continue
            for h in fd.hunks:
                if not self.apply(self.text_file(fd.hunk_patch(h)), check=True).ok:
                    failing.append(f"{fd.path} {h.short} (patch line {h.line})")
        return tuple(failing)

    def three_way(self, patch_file: Path) -> str:
        idx = self.tmp / f"index-3way-{self._n}"
        self._n += 1
        shutil.copyfile(self.tmp / "index", idx)
        env = {**self.env, "GIT_INDEX_FILE": str(idx)}
        res = self.repo.run("apply", "--cached", "--3way", "--whitespace=nowarn", str(patch_file), env=env)
        if res.ok:
            return "a three-way merge applies cleanly: refresh the patch against this ATOM commit"
        unmerged = self.repo.run("ls-files", "-u", env=env)
        paths = sorted({line.split("\t", 1)[1] for line in unmerged.stdout.splitlines() if "\t" in line})
        if paths:
            return "a three-way merge leaves conflicts in " + ", ".join(paths)
        if "lacks the necessary blob" in res.stderr or "sha1 information is lacking" in res.stderr:
            return "no three-way merge possible: the patch's original blobs are not in this repository"
        return "three-way merge failed: " + _first_error(res.stderr)


def _first_error(stderr: str) -> str:
    for line in stderr.splitlines():
        if line.startswith("error:"):
            return line[len("error:") :].strip()
    return stderr.strip().splitlines()[0] if stderr.strip() else "(no output)"


def _check_tree_paths(
    patch: Patch, touches: tuple[GitTouch, ...], repo: GitRepo, env: Mapping[str, str]
) -> None:
    """Refuse a patch that writes through a symlink of the tree (e.g. `link/x`, link -> /etc).

    The paths are the ones git would write (`touches`), not the ones our parse read.
    """
    prefixes: set[str] = set()
    for p in {q for t in touches for q in (t.old_path, t.path) if q}:
        parts = p.split("/")
        prefixes.update("/".join(parts[:k]) for k in range(1, len(parts)))
    if not prefixes:
        return
    res = repo.run("ls-files", "-s", "--", *sorted(prefixes), env=env)
    for line in res.stdout.splitlines():
        meta, _, path = line.partition("\t")
        if path in prefixes and meta.startswith("120000"):
            raise PatchError(
                f"{patch.name} touches a path under {path!r}, which is a symlink in the ATOM tree; refused.",
                hint="A patch may only touch files inside the ATOM tree. Nothing was applied.",
            )


# -- check -------------------------------------------------------------------------


def _full_sha(repo: GitRepo, rev: str, what: str) -> str:
    sha = repo.rev_parse(rev)
    if sha is None:
        raise PatchError(
            f"{what} commit {rev} is not in {repo.path}.", hint="Run `pipeline pin` to fetch it."
        )
    return sha


def check_series(
    series: PatchSeries, atom: GitRepo, atom_sha: str, aiter: GitRepo, aiter_sha: str
) -> list[PatchCheck]:
    """Status of every patch for these commits, patches checked in order on top of each other."""
    atom_sha = _full_sha(atom, atom_sha, "ATOM")
    aiter_sha = _full_sha(aiter, aiter_sha, "aiter")
    results: list[PatchCheck] = []
    with tempfile.TemporaryDirectory(prefix="pipeline-patch-check-") as tmp:
        scratch = _Scratch(atom, atom_sha, Path(tmp))
        exact = {}
        for patch in series:  # every patch, needed here or not: git reads what we read, or nothing runs
            exact[patch.name] = exact_copy(patch, Path(tmp))
            touches = same_as_git(patch, atom, exact[patch.name])
            _check_tree_paths(patch, touches, atom, scratch.env)
        for patch in series:
            patch_file = exact[patch.name]
            rng = atom_in_range(patch, atom, atom_sha)
            if not rng.needed:
                results.append(PatchCheck(patch, "not-needed", rng.reason))
                continue
            cond = aiter_conditions(patch, aiter, aiter_sha)
            if not cond.needed:
                results.append(PatchCheck(patch, "not-needed", cond.reason))
                continue
            why = f"{rng.reason}; {cond.reason}"
            if scratch.apply(patch_file, check=True).ok:
                _must(scratch.apply(patch_file), f"apply {patch.name} to a scratch index")
                results.append(PatchCheck(patch, "applies", why))
            elif scratch.apply(patch_file, check=True, reverse=True).ok:
                results.append(
                    PatchCheck(
                        patch,
                        "already-upstream",
                        f"its change is already in ATOM {atom_sha[:9]} (the reverse patch applies cleanly)",
                    )
                )
            else:
                results.append(
                    PatchCheck(
                        patch,
                        "conflict",
                        f"does not apply to ATOM {atom_sha[:9]}",
                        hunks=scratch.failing_hunks(patch),
                        three_way=scratch.three_way(patch_file),
                    )
                )
    return results


def patched_commit(
    series: PatchSeries, atom: GitRepo, atom_sha: str, aiter: GitRepo, aiter_sha: str
) -> AppliedSeries:
    """The patched ATOM commit without a work tree or a branch (the patch stage of `pipeline build`).

    Same commits, so the same `head_sha`, as `apply_series`; they are written
    into the ATOM object store but no ref points at them, so a static check
    can read the patched sources with `GitRepo(mirror).read_blob(head_sha, path)`.
    Raises PatchError on a conflict.
    """
    atom_sha = _full_sha(atom, atom_sha, "ATOM")
    checks = check_series(series, atom, atom_sha, aiter, aiter_sha)
    _raise_on_conflict(checks, atom_sha)
    _refuse_drafts(checks)
    pins, notes = pins_for(checks)
    head = atom_sha
    with tempfile.TemporaryDirectory(prefix="pipeline-patch-commit-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _must(atom.run("read-tree", atom_sha, env=env), f"read ATOM {atom_sha[:9]} into an index")
        for c in checks:
            if c.status != "applies":
                continue
            exact = exact_copy(c.patch, Path(tmp))
            res = atom.run("apply", "--cached", "--whitespace=nowarn", str(exact), env=env)
            if not res.ok:
                raise PatchError(
                    f"patch {c.patch.name} failed: {_failing_hunk_from_stderr(c.patch, res.stderr)}.",
                    evidence=res.stderr,
                )
            tree = _must(atom.run("write-tree", env=env), "write the patched tree").stdout.strip()
            head = _commit_tree(atom, tree, head, c.patch)
    return AppliedSeries(head, pins, notes)


def _raise_on_conflict(checks: list[PatchCheck], atom_sha: str) -> None:
    for c in checks:
        if c.status == "conflict":
            hunk = c.hunks[0] if c.hunks else "(no single failing hunk: the hunks only fail together)"
            raise PatchError(
                f"patch {c.patch.name} does not apply to ATOM {atom_sha[:9]}: failing hunk {hunk}"
                + (f" and {len(c.hunks) - 1} more" if len(c.hunks) > 1 else "")
                + f"; {c.three_way}.",
                hint="Nothing was changed. Refresh the patch (`pipeline patch import`, fix, "
                "`pipeline patch export`), or narrow its X-Atom-Range.",
                evidence=c.line(),
            )


def _refuse_drafts(checks: list[PatchCheck]) -> None:
    """A drafted patch (`patch draft`) that still holds placeholders is not applied: a person writes
    each value first."""
    from pipeline.patchq.draft import PLACEHOLDER, placeholders_in

    for c in checks:
        todo = placeholders_in(c.patch) if c.status == "applies" else []
        if todo:
            raise PatchError(
                f"patch {c.patch.name} is a draft with {len(todo)} placeholder(s) a person must fill: "
                + "; ".join(todo)
                + ".",
                hint=f"Replace each {PLACEHOLDER} with the value the call needs (`pipeline patch import`, "
                "edit, `pipeline patch export`), or remove the draft from the series. Nothing was changed.",
            )


# -- apply -------------------------------------------------------------------------


def refs_snapshot(repo: GitRepo) -> dict[str, str]:
    out = repo.run("for-each-ref", "--format=%(refname) %(objectname)")
    snap: dict[str, str] = {}
    for line in out.stdout.splitlines():
        ref, _, sha = line.partition(" ")
        snap[ref] = sha
    head = repo.run("rev-parse", "--verify", "-q", "HEAD")
    snap["HEAD"] = head.stdout.strip()
    return snap


def restore_refs(repo: GitRepo, before: dict[str, str]) -> None:
    """Put every ref back as in `before`; raise if the repository still differs."""
    now = refs_snapshot(repo)
    for ref, sha in now.items():
        if ref == "HEAD":
            continue
        if ref not in before:
            repo.run("update-ref", "-d", ref, sha)
        elif before[ref] != sha:
            repo.run("update-ref", ref, before[ref], sha)
    for ref, sha in before.items():
        if ref != "HEAD" and ref not in now:
            repo.run("update-ref", ref, sha)
    after = refs_snapshot(repo)
    if after != before:
        diff = sorted(set(after.items()) ^ set(before.items()))
        raise PatchError(f"could not restore the refs of {repo.path} after a failed apply: {diff}")


def worktree_gitdir(work_tree: Path) -> Path | None:
    dotgit = work_tree / ".git"
    if dotgit.is_file():
        text = dotgit.read_text(encoding="utf-8").strip()
        if text.startswith("gitdir: "):
            return Path(text[len("gitdir: ") :])
    return None


def dirty_summary(porcelain: str) -> str:
    paths = [line[3:] for line in porcelain.splitlines() if len(line) > 3]
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    return f"{len(paths)} path{'s' if len(paths) != 1 else ''}: {shown}"


def is_dirty(repo: GitRepo, work_tree: Path) -> str:
    """`git status --porcelain` of a work tree ('' when clean)."""
    res = repo.run("status", "--porcelain", "--ignore-submodules=none", work_tree=work_tree)
    if not res.ok:
        raise PatchError(f"cannot read the status of {work_tree}: {res.stderr.strip()}", evidence=res.stderr)
    return res.stdout.rstrip()  # not strip(): " M path" keeps its leading status column


def commit_patch(repo: GitRepo, work_tree: Path, patch: Patch) -> str:
    """Apply `patch` in `work_tree` (index and files) and commit it; returns the new HEAD.

    Author and committer are both taken from the patch, so the commit SHA
    depends only on the parent, the patch and its headers.
    """
    with tempfile.TemporaryDirectory(prefix="pipeline-patch-apply-") as tmp:
        exact = exact_copy(patch, Path(tmp))
        same_as_git(patch, repo, exact)  # `patch import` comes here without check_series
        res = repo.run("apply", "--index", "--whitespace=nowarn", str(exact), work_tree=work_tree)
    if not res.ok:
        raise PatchError(
            f"patch {patch.name} failed in {work_tree}: {_failing_hunk_from_stderr(patch, res.stderr)}.",
            hint="Nothing was changed. Refresh the patch or narrow its X-Atom-Range.",
            evidence=res.stderr,
        )
    tree = _must(repo.run("write-tree", work_tree=work_tree), "write the tree").stdout.strip()
    parent = _must(repo.run("rev-parse", "HEAD", work_tree=work_tree), "read HEAD").stdout.strip()
    sha = _commit_tree(repo, tree, parent, patch)
    upd = repo.run("update-ref", "-m", f"pipeline: apply {patch.name}", "HEAD", sha, work_tree=work_tree)
    if not upd.ok:
        raise PatchError(f"could not advance HEAD to {sha}: {upd.stderr.strip()}")
    return sha


def _commit_tree(repo: GitRepo, tree: str, parent: str, patch: Patch) -> str:
    """commit-tree with author and committer from the patch (no hooks, no signing)."""
    name, email = patch.author
    env = {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": patch.date,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_COMMITTER_DATE": patch.date,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".msg", delete=False, encoding="utf-8") as f:
        f.write(patch.commit_message())
        msg = f.name
    try:
        res = repo.run("commit-tree", "--no-gpg-sign", tree, "-p", parent, "-F", msg, env=env)
    finally:
        Path(msg).unlink(missing_ok=True)
    return _must(res, f"commit {patch.name}").stdout.strip()


def _failing_hunk_from_stderr(patch: Patch, stderr: str) -> str:
    # git: "error: patch failed: atom/models/x.py:418"
    for line in stderr.splitlines():
        if line.startswith("error: patch failed: "):
            where = line[len("error: patch failed: ") :]
            path, _, num = where.rpartition(":")
            for fd in patch.files:
                if fd.path == path or fd.old_path == path:
                    for h in fd.hunks:
                        if str(h.old_start) == num:
                            return f"hunk {path} {h.short} (patch line {h.line})"
            return f"hunk at {where}"
    return _first_error(stderr)


def branch_name(atom_sha: str, pins: tuple[PatchPin, ...]) -> str:
    digest = series_digest([(p.name, p.sha256) for p in pins if p.status == "applied"])
    return f"{REF_PREFIX}/{atom_sha[:7]}-{digest[:7]}"


@contextmanager
def all_or_nothing(repo: GitRepo) -> Iterator[list[Path]]:
    """Restore every ref, and remove the work trees listed in the yielded list, if the body raises."""
    before = refs_snapshot(repo)
    work_trees: list[Path] = []
    try:
        yield work_trees
    except BaseException:
        for wt in work_trees:
            repo.run("worktree", "remove", "--force", str(wt))
            shutil.rmtree(wt, ignore_errors=True)
        repo.run("worktree", "prune")
        restore_refs(repo, before)
        raise


def pins_for(checks: list[PatchCheck]) -> tuple[tuple[PatchPin, ...], list[str]]:
    pins: list[PatchPin] = []
    notes: list[str] = []
    for c in checks:
        if c.status == "applies":
            pins.append(PatchPin(name=c.patch.name, sha256=c.patch.sha256, status="applied"))
        elif c.status in ("not-needed", "already-upstream"):
            pins.append(PatchPin(name=c.patch.name, sha256=c.patch.sha256, status=c.status))
            label = "not needed" if c.status == "not-needed" else "already upstream"
            notes.append(f"{c.patch.name} {label}: {c.reason}; dropped")
    return tuple(pins), notes


def apply_series(
    series: PatchSeries, atom: GitRepo, atom_sha: str, aiter: GitRepo, aiter_sha: str, *, workdir: Path
) -> AppliedSeries:
    """Apply the needed patches as commits; `refs/pipeline/patched/<atom7>-<series7>` names the result.

    The linked work tree is `workdir/atom-<atom7>-<series7>`. Patches that are
    not needed or already upstream are recorded (status + note), not applied.
    """
    atom_sha = _full_sha(atom, atom_sha, "ATOM")
    checks = check_series(series, atom, atom_sha, aiter, aiter_sha)
    _raise_on_conflict(checks, atom_sha)
    _refuse_drafts(checks)
    pins, notes = pins_for(checks)
    todo = [c.patch for c in checks if c.status == "applies"]
    branch = branch_name(atom_sha, pins)
    work_tree = (workdir / f"atom-{branch.rsplit('/', 1)[1]}").absolute()
    _refuse_unusable(atom, work_tree)
    if not todo:
        notes.append(f"no patch applies to ATOM {atom_sha[:9]}: the image uses it unpatched")
        return AppliedSeries(atom_sha, pins, notes, None, None)
    workdir.mkdir(parents=True, exist_ok=True)
    atom.run("worktree", "prune")  # forget work trees deleted by hand (they would hold the branch)
    # Build in a fresh work tree beside the target; swap it in only on success.
    fresh = Path(tempfile.mkdtemp(prefix=f".{work_tree.name}.", dir=workdir)).absolute()
    fresh.rmdir()
    with all_or_nothing(atom) as cleanup:
        cleanup.append(fresh)
        res = atom.run("worktree", "add", "--detach", str(fresh), atom_sha)
        if not res.ok:
            raise PatchError(
                f"cannot create a work tree at {fresh}: {res.stderr.strip()}", evidence=res.stderr
            )
        head = atom_sha
        for patch in todo:
            head = commit_patch(atom, fresh, patch)
        if worktree_gitdir(work_tree) is not None:
            _must(atom.run("worktree", "remove", "--force", str(work_tree)), "remove the old work tree")
        elif work_tree.exists():
            work_tree.rmdir()  # empty (checked above)
        _must(atom.run("worktree", "move", str(fresh), str(work_tree)), "move the work tree into place")
        cleanup[:] = [work_tree]  # the rollback removes it from here on
        _must(
            atom.run("update-ref", "-m", "pipeline: patch apply", branch, head),
            f"point {branch} at the result",
        )
    return AppliedSeries(head, pins, notes, work_tree, branch)


def _must(res: GitResult, what: str) -> GitResult:
    if not res.ok:
        raise PatchError(f"cannot {what}: {res.stderr.strip()}", evidence=res.stderr)
    return res


def _refuse_unusable(atom: GitRepo, work_tree: Path) -> None:
    """A previous run's work tree may be replaced only if clean; anything else is refused."""
    if not work_tree.exists():
        return
    if worktree_gitdir(work_tree) is None:
        if any(work_tree.iterdir()):
            raise PatchError(
                f"{work_tree} exists and is not a work tree of {atom.path}; refusing to overwrite it.",
                hint="Remove it or pass another --workdir.",
            )
        return
    _reattach_lost_head(atom, work_tree)
    try:
        dirty = is_dirty(atom, work_tree)
    except PipelineError:
        dirty = "(unreadable status)"
    if dirty:
        raise PatchError(
            f"the patched work tree {work_tree} has local changes ({dirty_summary(dirty)}); "
            "refusing to replace it.",
            evidence=dirty,
            hint=f"To keep them, commit them there (`git -C {work_tree} add -A`, then `commit`) and add "
            f"that commit to the series (`pipeline patch new --repo {work_tree}`); to drop them, "
            f"remove the work tree (`git -C {atom.path} worktree remove --force {work_tree}`).",
        )


def _reattach_lost_head(atom: GitRepo, work_tree: Path) -> None:
    """A work tree left on a branch that a fetch pruned (versions before refs/pipeline/): detach it
    at its last commit, from its own HEAD reflog, so that its status means something again.

    Without this its HEAD is unborn, and `git status` reports every file as a local change.
    """
    if atom.run("rev-parse", "--verify", "-q", "HEAD", work_tree=work_tree).ok:
        return
    gitdir = worktree_gitdir(work_tree)
    last = ""
    reflog = gitdir / "logs" / "HEAD" if gitdir is not None else None
    if reflog is not None and reflog.is_file():
        lines = reflog.read_bytes().decode("utf-8", "replace").splitlines()
        last = lines[-1].split(" ", 2)[1] if lines and lines[-1].count(" ") >= 2 else ""
    if last and atom.rev_parse(last) == last:
        _must(
            atom.run("update-ref", "--no-deref", "HEAD", last, work_tree=work_tree),
            f"re-attach {work_tree} at its last commit {last[:9]}",
        )
        return
    raise PatchError(
        f"the patched work tree {work_tree} is on a branch that no longer exists and its last commit "
        "is unknown, so whether it holds local changes cannot be told; refusing to replace it.",
        hint=f"Look at it, then remove it: `git -C {atom.path} worktree remove --force {work_tree}`.",
    )
