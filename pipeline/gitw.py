"""Git, wrapped once.

Every git command the tool runs goes through `run_git`: one environment (no
prompts, English messages, no inherited `GIT_DIR`), stdout and stderr both
captured (stderr is kept as evidence in our errors), optional streaming of
`--progress` lines, and the child killed if we are interrupted. `GitRepo`
runs its commands through it; GitPython is used only to read objects (commits,
trees, blobs through its persistent `cat-file --batch`), so no checkout is
needed to analyse a commit.
"""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING

from pipeline.errors import InfraError, SourceError, sentence
from pipeline.pickling import by_fields

if TYPE_CHECKING:
    import git  # (imported when `GitRepo.repo` is first used: 60 ms a check does not need)

ProgressFn = Callable[[str], None]

# The environment of every git command (on top of ours).
GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",  # never wait for a password on a terminal
    "LC_ALL": "C",  # English messages, so failures can be classified
    "GIT_ASKPASS": "",
    "SSH_ASKPASS": "",
}


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(GIT_ENV)
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    if extra:
        env.update(extra)
    return env


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


@by_fields
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
    args: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def command(self) -> str:
        return " ".join(("git", *self.args))


_PROGRESS = re.compile(r"\d+% \(")


class _ProgressLines:
    """Turn git's `--progress` stderr into lines for `progress`, throttled.

    A line is emitted when the phase changes, at most every 2 s within a
    phase, and the final line of each phase. Progress lines are not kept as
    evidence; every other stderr line is.
    """

    def __init__(self, progress: ProgressFn | None) -> None:
        self.progress = progress
        self.kept: list[str] = []
        self.phase = ""
        self.last_emit = 0.0
        self.pending = ""
        self.buf = b""

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        parts = re.split(rb"[\r\n]", self.buf)
        self.buf = parts.pop()
        for raw in parts:
            self._line(raw.decode("utf-8", "replace").strip())

    def _line(self, line: str) -> None:
        if not line:
            return
        this_phase = line.split(":", 1)[0]
        is_progress = bool(_PROGRESS.search(line))
        if not is_progress:
            self.kept.append(line)
        if self.progress is None:
            return
        now = time.monotonic()
        if this_phase != self.phase:
            if self.pending:
                self.progress(self.pending)
            self.phase, self.pending, self.last_emit = this_phase, "", now
            self.progress(line)
        elif line.endswith("done.") or not is_progress or now - self.last_emit >= 2.0:
            self.progress(line)
            self.pending, self.last_emit = "", now
        else:
            self.pending = line

    def close(self) -> str:
        if self.buf.strip():
            self.kept.append(self.buf.decode("utf-8", "replace").strip())
        if self.progress is not None and self.pending:
            self.progress(self.pending)
        return "\n".join(self.kept)


def run_git(
    args: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    progress: ProgressFn | None = None,
) -> GitResult:
    """Run `git <args>`; never raises for git's own failure (see `GitResult.ok`).

    stdout and stderr are both read as they come (no pipe can fill up). With
    `progress`, stderr is parsed as `--progress` output and streamed to it;
    without, stderr is kept whole. On any exception (Ctrl-C, a kill of our
    process group's parent) the child is killed and reaped before re-raising.
    """
    argv = ["git", *args]
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=git_env(env),
        )
    except OSError as e:  # git itself missing, or cwd gone
        return GitResult(127, "", f"fatal: cannot run git: {e}", tuple(args))
    assert proc.stdout is not None and proc.stderr is not None
    out: list[bytes] = []
    err_raw: list[bytes] = []
    lines = _ProgressLines(progress) if progress is not None else None
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, "out")
            sel.register(proc.stderr, selectors.EVENT_READ, "err")
            open_streams = 2
            while open_streams:
                for key, _ in sel.select():
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        open_streams -= 1
                    elif key.data == "out":
                        out.append(chunk)
                    elif lines is not None:
                        lines.feed(chunk)
                    else:
                        err_raw.append(chunk)
        status = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
        proc.stderr.close()
    stderr = lines.close() if lines is not None else b"".join(err_raw).decode("utf-8", "replace")
    return GitResult(status, b"".join(out).decode("utf-8", "replace"), stderr, tuple(args))


class GitSoon:
    """A git command started now and read later: git runs on the other core while we work.

    Its output goes to an unlinked temporary file, not a pipe, so git never waits
    for a reader, and no thread is needed (the run later forks its workers).
    `result()` waits and reads; `cancel()` kills it. Either closes the files.
    """

    def __init__(self, args: Sequence[str], *, where: str, cwd: Path | None = None) -> None:
        self.args = tuple(args)
        self.where = where  # the repository, for the error
        self.cwd = cwd
        self._out: IO[bytes] | None = None
        self._err: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            self._out = tempfile.TemporaryFile()  # noqa: SIM115 (kept open until result or cancel)
            self._err = tempfile.TemporaryFile()  # noqa: SIM115
            self._proc = subprocess.Popen(
                ["git", *args], cwd=cwd, stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err,
                env=git_env(None),
            )  # fmt: skip
        except OSError:  # no temporary file, or no git: `result()` runs it the ordinary way
            self._close()

    def result(self) -> GitResult:
        if self._proc is None or self._out is None or self._err is None:
            self._close()
            return run_git(self.args, cwd=self.cwd)
        try:
            status = self._proc.wait()
            self._out.seek(0)
            self._err.seek(0)
            out, err = self._out.read(), self._err.read()
        except BaseException:
            self.cancel()
            raise
        self._close()
        return GitResult(status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), self.args)

    def stdout(self) -> str:
        """As `GitRepo.git`: stdout, one trailing newline dropped; our error when git failed."""
        return _stdout(self.result(), self.where)

    def cancel(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._close()

    def _close(self) -> None:
        self._proc = None
        for f in (self._out, self._err):
            if f is not None:
                f.close()
        self._out = self._err = None


def _stdout(res: GitResult, where: str) -> str:
    if not res.ok:
        raise git_error(res, where)
    return res.stdout[:-1] if res.stdout.endswith("\n") else res.stdout


def git_error(res: GitResult, where: str) -> SourceError | InfraError:
    """Our error for a failed `res`, with git's stderr as evidence."""
    stderr = res.stderr.strip()
    if is_unreachable(stderr):
        return InfraError(
            f"git could not reach a remote while running `{res.command}`: {sentence(_first_line(stderr))}",
            hint="Check the URL and the network, or use a local mirror path.",
            evidence=stderr,
        )
    return SourceError(f"`{res.command}` failed in {where}: {sentence(_first_line(stderr))}", evidence=stderr)


class BlobReader:
    """One persistent `git cat-file --batch` of a repository, for a process that holds no GitRepo
    (a worker forked from one must not share its parent's pipes)."""

    def __init__(self, git_dir: str) -> None:
        self.git_dir = git_dir
        self._proc: subprocess.Popen[bytes] | None = None

    def read(self, sha: str) -> bytes:
        if self._proc is None:
            self._proc = subprocess.Popen(
                ["git", f"--git-dir={self.git_dir}", "cat-file", "--batch"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=git_env(None),
            )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(sha.encode() + b"\n")
        self._proc.stdin.flush()
        header = self._proc.stdout.readline().split()
        if len(header) < 3:
            raise SourceError(f"object {sha} is missing from {self.git_dir}.")
        data = self._proc.stdout.read(int(header[2]))
        self._proc.stdout.read(1)
        return data


STREAM_MIN_BLOBS = 16  # from this many blobs, one `cat-file --batch` of their own beats round trips


def _is_git_dir(d: Path) -> bool:
    """A git directory: objects, refs and HEAD (as gitpython's `is_git_dir` decides)."""
    head = d / "HEAD"
    return (d / "objects").is_dir() and (d / "refs").is_dir() and (head.is_file() or head.is_symlink())


def find_git_dir(path: Path) -> Path | None:
    """The git directory of `path`: itself (bare), its `.git` directory, or where its `.git` file
    points (a linked work tree, a submodule). None: not a repository (no parent is searched)."""
    if _is_git_dir(path):
        return path
    dot = path / ".git"
    if dot.is_dir():
        return dot if _is_git_dir(dot) else None
    if dot.is_file():
        try:
            text = dot.read_text(errors="replace")
        except OSError:
            return None
        if text.startswith("gitdir:"):
            target = Path(text[len("gitdir:") :].strip())
            target = target if target.is_absolute() else path / target
            return target if target.is_dir() else None
    return None


class _Objects:
    """One persistent `git cat-file --batch` of a repository: commits and blobs by name, no process
    per question (as gitpython's, without importing gitpython)."""

    def __init__(self, git_dir: str) -> None:
        self.git_dir = git_dir
        self._proc: subprocess.Popen[bytes] | None = None

    def get(self, name: str) -> tuple[str, str, bytes] | None:
        """(sha, type, content) of the object `name` denotes, or None when it names none."""
        if not name or any(c in name for c in "\n\r\0"):
            return None
        proc = self._proc
        if proc is None or proc.poll() is not None:
            proc = self._proc = subprocess.Popen(
                ["git", f"--git-dir={self.git_dir}", "cat-file", "--batch"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=git_env(None),
            )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(name.encode() + b"\n")
            proc.stdin.flush()
            header = proc.stdout.readline().split()
            if len(header) != 3 or not header[2].isdigit():
                return None  # "<name> missing" / "ambiguous"
            data = proc.stdout.read(int(header[2]))
            proc.stdout.read(1)
        except (OSError, ValueError) as e:
            self.close()
            raise SourceError(f"`git cat-file --batch` failed in {self.git_dir}: {e}") from e
        return header[0].decode(), header[1].decode(), data

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
            proc.wait()


def _commit_info(sha: str, data: bytes) -> CommitInfo:
    """A raw commit object read as gitpython read it: committer date, summary and author name,
    decoded as UTF-8 (gitpython never honoured an `encoding` header, and neither do we)."""
    head, _, message = data.partition(b"\n\n")
    author = committed = b""
    for line in head.split(b"\n"):
        if line.startswith(b"author "):
            author = line[7:]
        elif line.startswith(b"committer "):
            committed = line[10:]
    name = author.rpartition(b" <")[0].decode("utf-8", "replace")
    ts = int(committed.rsplit(b" ", 2)[-2]) if committed.count(b" ") >= 2 else 0
    subject = message.decode("utf-8", "replace").split("\n", 1)[0]
    return CommitInfo(sha, datetime.fromtimestamp(ts, tz=UTC), subject, name)


class GitRepo:
    """A local repository (bare mirror or work tree)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        found = find_git_dir(self.path) if self.path.is_dir() else None
        self._repo: git.Repo | None = None
        if found is None:
            self.git_dir = str(self.repo.git_dir)  # (gitpython decides, and says why not)
        else:
            self.git_dir = str(found)
        # The work tree when `path` is one (it holds `.git`), None for a bare repository: not
        # gitpython's guess, which takes a mirror without a `config` file for a work tree's .git.
        self.work_tree: Path | None = self.path if (self.path / ".git").exists() else None
        self._objects = _Objects(self.git_dir)

    @property
    def repo(self) -> git.Repo:
        """gitpython's view of the repository, for what our own commands do not cover (imported on
        first use: a check never needs it)."""
        if self._repo is None:
            import git
            from git.exc import InvalidGitRepositoryError, NoSuchPathError

            try:
                repo = git.Repo(self.path)
            except (InvalidGitRepositoryError, NoSuchPathError) as e:
                raise SourceError(
                    f"{self.path} is not a git repository.",
                    hint="Check the repository path in your configuration or flags.",
                ) from e
            if not (self.path / ".git").exists():
                # Pin git's discovery to this repository for every command gitpython runs (bare
                # mirrors without a `config` file are otherwise missed). Never for a work tree:
                # GIT_DIR alone makes git take the current directory as the work tree.
                repo.git.update_environment(GIT_DIR=str(repo.git_dir))
            self._repo = repo
        return self._repo

    # -- plumbing -----------------------------------------------------------
    def git(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        """Run `git <args>` in this repository and return stdout (one trailing newline dropped)."""
        return _stdout(self.run(*args, env=env), str(self.path))

    # -- objects ------------------------------------------------------------
    def rev_parse(self, rev: str) -> str | None:
        """Full SHA of `rev` as a commit, or None when it does not resolve."""
        got = self._objects.get(f"{rev}^{{commit}}")
        return got[0] if got is not None and got[1] == "commit" else None

    def commit_info(self, rev: str) -> CommitInfo:
        got = self._objects.get(f"{rev}^{{commit}}")
        if got is None or got[1] != "commit":
            raise SourceError(f"{rev!r} is not a commit in {self.path}.")
        return _commit_info(got[0], got[2])

    def blob_sha(self, rev: str, path: str) -> str | None:
        """The SHA of the blob at `path` in commit `rev`, or None when there is none."""
        got = self._objects.get(f"{rev}:{path}")
        return got[0] if got is not None and got[1] == "blob" else None

    def list_files(self, rev: str, prefix: str = "", suffix: str = "") -> list[str]:
        """Paths of blobs under `prefix` at `rev` ending with `suffix`."""
        args = ["ls-tree", "-r", "--name-only", "--full-tree", rev]
        if prefix:
            args += ["--", prefix]
        out = self.git(*args)
        return [p for p in out.splitlines() if p and p.endswith(suffix)]

    @staticmethod
    def blob_shas_args(rev: str, prefix: str = "") -> tuple[str, ...]:
        """The git command `blob_shas` reads (begun early by a caller that knows it will ask)."""
        return ("ls-tree", "-r", "--full-tree", rev, *(("--", prefix) if prefix else ()))

    def blob_shas(
        self, rev: str, prefix: str = "", suffix: str = "", ahead: GitSoon | None = None
    ) -> dict[str, str]:
        """{path: blob sha} under `prefix` at `rev` (for caches keyed by content); `ahead`:
        `blob_shas_args` begun earlier."""
        out = ahead.stdout() if ahead is not None else self.git(*self.blob_shas_args(rev, prefix))
        result: dict[str, str] = {}
        for line in out.splitlines():
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
        got = self._objects.get(f"{rev}:{path}")
        if got is not None:
            return got[2]
        if self.rev_parse(rev) is None:
            raise SourceError(f"{rev!r} is not a commit in {self.path}.")
        return None

    def read_blobs(self, shas: Sequence[str]) -> Iterator[tuple[str, bytes]]:
        """Blobs by SHA: a few through the repository's persistent `cat-file --batch` (no process
        to start), many through one `stream_blobs` (no round trip per blob: 2-3x faster for a tree)."""
        if len(shas) >= STREAM_MIN_BLOBS:
            yield from self.stream_blobs(shas)
            return
        for sha in shas:
            got = self._objects.get(sha)
            if got is None:
                raise SourceError(f"object {sha} is missing from {self.path}.")
            yield sha, got[2]

    def cat_blobs(self, shas: Sequence[str]) -> dict[str, bytes]:
        """Many blobs in one `git cat-file --batch` run (one round trip instead of one per blob)."""
        if not shas:
            return {}
        proc = subprocess.run(
            ["git", f"--git-dir={self.git_dir}", "cat-file", "--batch"],
            input=("\n".join(shas) + "\n").encode(),
            capture_output=True,
            check=False,
            env=git_env(None),
        )  # not run_git: blobs are bytes and go in through stdin
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

    def stream_blobs(self, shas: Sequence[str]) -> Iterator[tuple[str, bytes]]:
        """`cat_blobs`, yielding each blob as git writes it: the caller works on one while git
        inflates the next (on two cores that hides most of git's time)."""
        if not shas:
            return
        proc = subprocess.Popen(
            ["git", f"--git-dir={self.git_dir}", "cat-file", "--batch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=git_env(None),
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        request = ("\n".join(shas) + "\n").encode()
        # Fed from a thread: a request larger than the pipe buffer must not block against stdout.
        feeder = threading.Thread(target=_feed, args=(proc.stdin, request), daemon=True)
        feeder.start()
        out = proc.stdout
        try:
            for _ in shas:
                header = out.readline().split()
                if len(header) < 3:
                    if header:  # "<sha> missing"
                        raise SourceError(f"object {header[0].decode()} is missing from {self.path}.")
                    proc.wait()
                    stderr = proc.stderr.read().decode(errors="replace")
                    raise SourceError(f"`git cat-file --batch` failed in {self.path}: {_first_line(stderr)}")
                blob = out.read(int(header[2]))
                out.read(1)
                yield header[0].decode(), blob
        finally:
            if proc.poll() is None:
                proc.kill()
            feeder.join()
            proc.wait()
            out.close()
            proc.stderr.close()

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        res = self.run("merge-base", "--is-ancestor", ancestor, descendant)
        if res.status in (0, 1):
            return res.ok
        raise git_error(res, str(self.path))

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

    def soon(self, *args: str) -> GitSoon:
        """Start `git <args>` in this repository now; its `result()` is read when needed."""
        if self.work_tree is None:
            return GitSoon([f"--git-dir={self.git_dir}", *args], where=str(self.path))
        return GitSoon(args, where=str(self.path), cwd=self.work_tree)

    def run(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        work_tree: Path | None = None,
        progress: ProgressFn | None = None,
    ) -> GitResult:
        """Run `git <args>`; return status/stdout/stderr without raising on failure.

        For commands whose exit status is the answer (`apply --check`, `grep`).
        With `work_tree`, the command runs inside that (linked) work tree and
        git finds the git dir from its `.git` file. A repository that has a work
        tree of its own runs there (paths are relative to its top, `add -A` sees
        its files), never in the caller's current directory.
        """
        if work_tree is None:
            work_tree = self.work_tree
        if work_tree is None:
            # --git-dir always: mirrors may lack a `config` file, which makes git's own discovery fail.
            return run_git([f"--git-dir={self.git_dir}", *args], env=env, progress=progress)
        return run_git(list(args), cwd=work_tree, env=env, progress=progress)


def _feed(pipe: IO[bytes], data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except BrokenPipeError:  # git stopped early; the reader reports why
        pass


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line
    return "(no output)"
