"""Git, wrapped once.

Everything that talks to git goes through `GitRepo`. GitPython's exceptions
become our `SourceError` (or `InfraError` for unreachable remotes), keeping
git's stderr as evidence. Reads of file contents come straight from git
objects: no checkout is needed to analyse a commit.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import git
from git.exc import BadName, GitCommandError, InvalidGitRepositoryError, NoSuchPathError

from pipeline.errors import InfraError, SourceError

# Phrases git prints when a remote cannot be reached at all (as opposed to a
# remote that answers "no such ref").
_UNREACHABLE = (
    "could not resolve host",
    "unable to access",
    "connection refused",
    "connection timed out",
    "could not read from remote repository",
    "does not appear to be a git repository",
    "unable to connect",
    "no route to host",
    "network is unreachable",
    "failed to connect",
)


def is_unreachable(stderr: str) -> bool:
    low = stderr.lower()
    return any(p in low for p in _UNREACHABLE)


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    date: datetime  # committer date, UTC
    subject: str
    author: str

    @property
    def short(self) -> str:
        return self.sha[:10]

    @property
    def iso_date(self) -> str:
        return self.date.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class GitResult:
    """Outcome of a git command whose failure the caller interprets itself."""

    status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.status == 0


class GitRepo:
    """A local repository (bare mirror or work tree)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.repo = git.Repo(self.path)
        except (InvalidGitRepositoryError, NoSuchPathError) as e:
            raise SourceError(
                f"{self.path} is not a git repository.",
                hint="Check the repository path in your configuration or flags.",
            ) from e
        # Pin git's discovery to this repository for every command gitpython
        # runs (bare mirrors without a `config` file are otherwise missed).
        self.repo.git.update_environment(GIT_DIR=str(self.repo.git_dir))

    # -- plumbing -----------------------------------------------------------
    def git(self, *args: str, env: dict[str, str] | None = None) -> str:
        """Run `git <args>` in this repository and return stdout (stripped)."""
        try:
            # --git-dir always: mirrors may lack a `config` file, which
            # makes git's own discovery fail.
            out: str = self.repo.git.execute(
                ["git", f"--git-dir={self.repo.git_dir}", *args],
                env=env,
                with_extended_output=False,
                strip_newline_in_stdout=True,
            )
            return out
        except GitCommandError as e:
            stderr = (e.stderr or "").strip()
            cmd = " ".join(str(a) for a in e.command) if isinstance(e.command, list) else str(e.command)
            if is_unreachable(stderr):
                raise InfraError(
                    f"git could not reach a remote while running `{cmd}`: {_first_line(stderr)}",
                    hint="Check the URL and the network, or use a local mirror path.",
                    evidence=stderr,
                ) from e
            raise SourceError(f"`{cmd}` failed in {self.path}: {_first_line(stderr)}", evidence=stderr) from e

    # -- objects ------------------------------------------------------------
    def rev_parse(self, rev: str) -> str | None:
        """Full SHA of `rev` as a commit, or None when it does not resolve."""
        try:
            return str(self.repo.commit(rev).hexsha)
        except (BadName, ValueError, GitCommandError):
            return None

    def commit_info(self, rev: str) -> CommitInfo:
        try:
            c = self.repo.commit(rev)
        except (BadName, ValueError, GitCommandError) as e:
            raise SourceError(f"{rev!r} is not a commit in {self.path}.") from e
        return CommitInfo(
            sha=c.hexsha,
            date=datetime.fromtimestamp(c.committed_date, tz=UTC),
            subject=str(c.summary),
            author=str(c.author.name),
        )

    def list_files(self, rev: str, prefix: str = "", suffix: str = "") -> list[str]:
        """Paths of blobs under `prefix` at `rev` ending with `suffix`."""
        args = ["ls-tree", "-r", "--name-only", "--full-tree", rev]
        if prefix:
            args += ["--", prefix]
        out = self.git(*args)
        return [p for p in out.splitlines() if p and p.endswith(suffix)]

    def blob_shas(self, rev: str, prefix: str = "", suffix: str = "") -> dict[str, str]:
        """{path: blob sha} under `prefix` at `rev` (for caches keyed by content)."""
        args = ["ls-tree", "-r", "--full-tree", rev]
        if prefix:
            args += ["--", prefix]
        result: dict[str, str] = {}
        for line in self.git(*args).splitlines():
            meta, _, path = line.partition("\t")
            parts = meta.split()
            if len(parts) == 3 and parts[1] == "blob" and path.endswith(suffix):
                result[path] = parts[2]
        return result

    def submodules(self, rev: str) -> list[tuple[str, str]]:
        """[(path, pinned sha)] of gitlinks at `rev`."""
        out = self.git("ls-tree", "-r", "--full-tree", rev)
        subs = []
        for line in out.splitlines():
            meta, _, path = line.partition("\t")
            parts = meta.split()
            if len(parts) == 3 and parts[1] == "commit":
                subs.append((path, parts[2]))
        return subs

    def read_blob(self, rev: str, path: str) -> bytes | None:
        """Contents of `path` at `rev`, or None if absent."""
        try:
            data: bytes = (self.repo.commit(rev).tree / path).data_stream.read()
            return data
        except KeyError:
            return None

    def read_blobs(self, shas: Sequence[str]) -> Iterator[tuple[str, bytes]]:
        """Stream many blobs through gitpython's persistent `cat-file --batch`."""
        for sha in shas:
            yield sha, self.repo.odb.stream(bytes.fromhex(sha)).read()

    def cat_blobs(self, shas: Sequence[str]) -> dict[str, bytes]:
        """Many blobs in one `git cat-file --batch` run (one round trip instead of one per blob)."""
        if not shas:
            return {}
        proc = subprocess.run(
            ["git", f"--git-dir={self.repo.git_dir}", "cat-file", "--batch"],
            input=("\n".join(shas) + "\n").encode(),
            capture_output=True,
            check=False,
        )
        if proc.returncode != 0:
            stderr = proc.stderr.decode(errors="replace")
            raise SourceError(f"`git cat-file --batch` failed in {self.path}: {_first_line(stderr)}")
        out: dict[str, bytes] = {}
        data, pos = proc.stdout, 0
        for _ in shas:
            nl = data.index(b"\n", pos)
            header = data[pos:nl].split()
            if len(header) < 3:  # "<sha> missing"
                raise SourceError(f"object {header[0].decode()} is missing from {self.path}.")
            size = int(header[2])
            out[header[0].decode()] = data[nl + 1 : nl + 1 + size]
            pos = nl + 1 + size + 1
        return out

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        try:
            self.git("merge-base", "--is-ancestor", ancestor, descendant)
            return True
        except SourceError as e:
            if isinstance(e.__cause__, GitCommandError) and e.__cause__.status == 1:
                return False
            raise

    def log(self, rev: str, paths: Sequence[str] = (), *, first_parent: bool = False) -> list[CommitInfo]:
        """Commits reachable from `rev` (newest first), optionally touching `paths`."""
        args = ["log", "--format=%H%x00%ct%x00%an%x00%s", rev]
        if first_parent:
            args.insert(1, "--first-parent")
        if paths:
            args += ["--", *paths]
        result = []
        for line in self.git(*args).splitlines():
            sha, ts, author, subject = line.split("\x00", 3)
            result.append(CommitInfo(sha, datetime.fromtimestamp(int(ts), tz=UTC), subject, author))
        return result

    def refs(self) -> list[str]:
        """Short names of all branches and tags (for 'nearest refs' hints)."""
        out = self.git("for-each-ref", "--format=%(refname:short)", "refs/heads", "refs/tags")
        return [r for r in out.splitlines() if r]

    def run(
        self, *args: str, env: Mapping[str, str] | None = None, work_tree: Path | None = None
    ) -> GitResult:
        """Run `git <args>`; return status/stdout/stderr without raising on failure.

        For commands whose exit status is the answer (`apply --check`, `grep`).
        With `work_tree`, the command runs inside that (linked) work tree and
        git finds the git dir from its `.git` file.
        """
        if work_tree is None:
            runner = self.repo.git
            cmd = ["git", f"--git-dir={self.repo.git_dir}", *args]
        else:
            runner = git.Git(str(work_tree))
            cmd = ["git", *args]
        status, out, err = runner.execute(
            cmd,
            env=dict(env) if env else None,
            with_extended_output=True,
            with_exceptions=False,
            strip_newline_in_stdout=False,
        )
        return GitResult(int(status or 0), str(out), str(err))


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line
    return "(no output)"
