"""Bare mirrors: one per URL under `settings.mirrors_dir`, locked, created atomically, fetched.

- A local path is mirrored too (`git clone --bare` of a path copies or
  hard-links its objects, which also works for partial clones that
  `upload-pack` would refuse to serve).
- One lock per mirror (`<mirror>.git.lock`): two runs never fetch the same
  mirror at once. A URL that never gave a mirror leaves no lock behind.
- A mirror is created in a temporary directory and renamed into place when
  complete; an interrupted fetch leaves the mirror as it was (git writes the
  pack first and moves refs last).
- Unreachable remotes are retried with backoff (`pipeline.retry`), then an
  `InfraError`; when a mirror already exists we warn and continue offline.
- The mirror fetches `refs/heads/*` and `refs/tags/*` with `--prune`: only
  upstream's refs live there. The tool's own refs live outside that
  namespace (`refs/pins/<sha>` for pinned commits, `refs/pipeline/...` for the
  patch series), so a fetch never deletes them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import retry
from pipeline.config import Settings
from pipeline.errors import DiskError, InfraError, SourceError, sentence
from pipeline.fsutil import acquire_lock, make_temp_dir, remove_held_lock
from pipeline.gitw import GitRepo, GitResult, ProgressFn, is_unreachable, run_git
from pipeline.log import Logger
from pipeline.progress import Progress, Task
from pipeline.sources.urls import is_local, mirror_path, normalise_url

if TYPE_CHECKING:
    import filelock

    from pipeline.lock import Lock

# How long to wait for another run holding a mirror's lock.
MIRROR_LOCK_TIMEOUT = 30 * 60.0
# Marker written in a mirror after each successful fetch (its mtime is "last fetched").
FETCHED_MARKER = "pipeline-fetched"
PIN_REF_PREFIX = "refs/pins/"
LOCK_SUFFIX = ".lock"
# Abort HTTP transfers that stall (otherwise git waits forever on a dead link).
FETCH_CONFIG = ("-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=60")
# What the mirror fetches (and prunes): upstream's branches and tags, nothing else.
FETCH_REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")


# -- errors and retries ---------------------------------------------------------------


_GIT_DISK_FAULTS = {
    "no space left on device": "is full (ENOSPC)",
    "disk quota exceeded": "is over its quota (EDQUOT)",
    "read-only file system": "is read-only (EROFS)",
}


def _classify(stderr: str, url: str, action: str) -> SourceError | InfraError | DiskError:
    """InfraError when the remote could not be reached at all, DiskError when our own mirror
    could not be written, else SourceError."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    fatal = [ln for ln in lines if ln.startswith(("fatal:", "error:", "remote: fatal", "ssh:"))]
    first = (fatal or lines or ["(no output)"])[0]
    low = stderr.lower()
    # git reports our full or read-only cache as "not a git repository" or a remote failure
    # further down its stderr; the errno text is the truth, so it is looked for first
    for text, why in _GIT_DISK_FAULTS.items():
        if text in low:
            return DiskError(
                f"could not write the mirror of {url} while {action}: the cache's file system {why}.",
                hint="Free space or make the cache writable (or point [paths] cache_dir / "
                "PIPELINE_CACHE_DIR elsewhere), then run the command again.",
                evidence=stderr,
            )
    if "corruption on the remote side" in low or "remote: fatal: unable to read" in low:
        return SourceError(
            f"{url} is missing objects it refers to (a partial clone, or corrupt) while {action}.",
            hint="If it is a local partial mirror, give it as a plain path, not file://: "
            "a local clone copies its objects as they are.",
            evidence=stderr,
        )
    if is_local(url) or url.startswith("file://"):  # never "unreachable": missing or not a repository
        return SourceError(
            f"cannot read the repository at {url} while {action}: {sentence(first)}",
            hint="Check that the path is a git repository (bare or not).",
            evidence=stderr,
        )
    if is_unreachable(stderr) or "timed out" in stderr.lower():
        return InfraError(
            f"could not reach {url} while {action}: {sentence(first)}",
            hint="Check the URL and the network; for offline use point the source at a local mirror path.",
            evidence=stderr,
        )
    if "terminal prompts disabled" in stderr or "authentication failed" in stderr.lower():
        return SourceError(
            f"{url} asked for credentials while {action}: {sentence(first)}",
            hint="Configure a git credential helper or ssh key for this host; "
            "credentials are never taken from the command line.",
            evidence=stderr,
        )
    return SourceError(f"git failed while {action} from {url}: {sentence(first)}", evidence=stderr)


def _with_retries(
    attempt: Callable[[], GitResult],
    *,
    url: str,
    action: str,
    retries: int,
    log: Logger | None,
    backoff: float | None = None,
) -> None:
    """Run `attempt` until it succeeds; retry only when the remote is unreachable."""

    def once() -> None:
        res = attempt()
        if not res.ok:
            raise _classify(res.stderr, url, action)

    def told(n: int, tries: int, wait: float, error: BaseException) -> None:
        if log is not None:
            log.warn(f"{url} unreachable (attempt {n}/{tries}); retrying in {wait:.1f}s")

    try:
        retry.with_retries(
            once,
            retries=retries,
            transient=lambda e: isinstance(e, InfraError),
            backoff=backoff,
            on_retry=told,
        )
    except retry.GaveUp as e:
        err = e.error
        assert isinstance(err, InfraError)
        attempts = f"{e.attempts} attempt{'s' if e.attempts > 1 else ''}"
        err.message = err.message.rstrip(".") + f" (gave up after {attempts})."
        raise err from None


# -- the mirror's lock and configuration -----------------------------------------------


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + LOCK_SUFFIX)


def _mirror_lock(path: Path, log: Logger | None) -> filelock.BaseFileLock:
    lock_file = lock_path(path)
    return acquire_lock(
        lock_file,
        wait=MIRROR_LOCK_TIMEOUT,
        busy=f"another process has held the lock on mirror {path} for {MIRROR_LOCK_TIMEOUT:.0f}s.",
        hint=f"Check for a stuck `pipeline` or `git` process; the lock file is {lock_file}.",
        on_wait=(lambda: log.info(f"waiting for another run that is fetching {path.name} ..."))
        if log
        else None,
    )


def _configure_mirror(git_dir: Path, url: str) -> None:
    """Fetch branches and tags only (not GitHub's refs/pull/*); no automatic gc."""
    steps: list[list[str]] = [["config", "remote.origin.url", url]]
    for n, spec in enumerate(FETCH_REFSPECS):
        steps.append(["config", "--replace-all" if n == 0 else "--add", "remote.origin.fetch", spec])
    steps += [
        ["config", "remote.origin.tagOpt", "--no-tags"],
        ["config", "core.bare", "true"],
        ["config", "gc.auto", "0"],  # no background gc while another stage reads
    ]
    for args in steps:
        res = run_git([f"--git-dir={git_dir}", *args])
        if not res.ok:
            raise SourceError(
                f"cannot configure mirror {git_dir}: {res.stderr.strip()}",
                hint="Check that the cache directory is writable, or delete the mirror to re-create it.",
                evidence=res.stderr,
            )


def _clear_stale_git_locks(path: Path, log: Logger | None) -> None:
    """Remove `*.lock` files a killed git left behind (we hold the mirror's own lock)."""
    candidates = [path / "packed-refs.lock", path / "config.lock", path / "HEAD.lock", path / "shallow.lock"]
    refs = path / "refs"
    if refs.is_dir():
        candidates += list(refs.rglob("*.lock"))
    for f in candidates:
        if f.is_file():
            f.unlink(missing_ok=True)
            if log is not None:
                log.warn(f"removed stale git lock {f} (left by an interrupted git)")


def _update_head(repo: GitRepo) -> None:
    """Point the mirror's HEAD at the remote's default branch (best effort)."""
    try:
        out = repo.git(*FETCH_CONFIG, "ls-remote", "--symref", "origin", "HEAD")
    except (SourceError, InfraError):
        return
    for line in out.splitlines():
        if line.startswith("ref: ") and line.endswith("\tHEAD"):
            target = line[5:].split("\t", 1)[0]
            if repo.rev_parse(target):
                repo.git("symbolic-ref", "HEAD", target)
            return


_GIT_PROGRESS = re.compile(
    r"^(?:remote: )?(?P<phase>[A-Z][a-z]+(?: [a-z]+)*):\s+\d+% \((?P<n>\d+)/(?P<total>\d+)\)"
    r"(?:, (?P<size>[0-9.]+ [KMG]?i?B))?(?: \| (?P<rate>[0-9.]+ [KMG]?i?B/s))?"
)


class FetchProgress:
    """git's ``--progress`` lines as a live task: objects done of the total, bytes and git's rate.

    Every line goes to the log file (detail level). A fetch that is still running after `after`
    seconds gets a progress task (`pipeline.progress`): a live bar on a terminal, a plain line
    every 30 s on CI or off a terminal, so quick fetches print nothing extra. Call `close()`.
    """

    def __init__(
        self, log: Logger, url: str, *, after: float = 5.0, progress: Progress | None = None
    ) -> None:
        self.log = log
        self.url = url
        self.after = after
        self.progress = progress or Progress.for_stream(log.stream, redact=log.redact)
        self.start = time.monotonic()
        self._stack = contextlib.ExitStack()
        self.task: Task | None = None
        self.phase = ""

    def __call__(self, line: str) -> None:
        self.log.detail(line)
        m = _GIT_PROGRESS.match(line.strip())
        if m is None or (self.task is None and time.monotonic() - self.start < self.after):
            return
        if self.task is None:
            self.task = self._stack.enter_context(self.progress.task(f"fetch {self.url}", unit="objects"))
        phase = m.group("phase")
        status = phase + "".join(f", {x}" for x in (m.group("size"), m.group("rate")) if x)
        self.task.update(
            int(m.group("n")), total=int(m.group("total")), status=status, description=f"fetch {self.url}"
        )
        self.phase = phase

    def close(self) -> None:
        self._stack.close()


def _touch_marker(path: Path) -> None:
    (path / FETCHED_MARKER).write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()), encoding="utf-8")


def last_fetched(path: Path) -> str:
    marker = path / FETCHED_MARKER
    if not marker.is_file():
        return "never"
    return marker.read_text(encoding="utf-8").strip()


def _open_existing(path: Path) -> GitRepo | None:
    if not (path / "HEAD").is_file() or not (path / "objects").is_dir():
        return None
    try:
        return GitRepo(path)
    except SourceError:
        return None


def _refuse_non_repository(url: str, path: Path, log: Logger | None) -> GitRepo | None:
    """A local source that is missing or not a repository: its old mirror (with a warning), or an error."""
    src = Path(url)
    if src.is_dir() and (
        (src / ".git").exists() or ((src / "HEAD").is_file() and (src / "objects").is_dir())
    ):
        return None
    what = (
        "is a directory but not a git repository"
        if src.is_dir()
        else ("is a file, not a git repository" if src.exists() else "does not exist")
    )
    existing = _open_existing(path)
    if existing is not None:
        if log is not None:
            log.warn(
                f"{url} {what} any more; using its existing mirror as it is "
                f"(last fetched {last_fetched(path)})."
            )
        return existing
    raise SourceError(
        f"the repository path {url} {what}.",
        hint="Check the path given with --atom-repo/--aiter-repo, in pipeline.toml or PIPELINE_*_REPO: "
        "it must be a git repository (bare or with a work tree).",
    )


# -- open, create, fetch -----------------------------------------------------------


def open_mirror(
    settings: Settings,
    url: str,
    *,
    fetch: bool = True,
    progress: ProgressFn | None = None,
    log: Logger | None = None,
    retries: int | None = None,
    backoff: float | None = None,
) -> GitRepo:
    """The bare mirror of `url`, created or fetched as needed.

    `fetch=False` never touches the network and fails if there is no mirror.
    When the remote is unreachable but a mirror exists, warn and return it as
    it is. Without a mirror, an unreachable remote is an `InfraError` after
    `retries` retries (default `settings.sources.fetch_retries`).
    """
    url = normalise_url(url)
    path = mirror_path(settings, url)
    if retries is None:
        retries = settings.sources.fetch_retries

    if not fetch:
        repo = _open_existing(path)
        if repo is None:
            raise SourceError(
                f"there is no mirror of {url} (expected at {path}).",
                hint="Point the source at a local clone or mirror (--atom-repo/--aiter-repo, or [sources] "
                "atom_repo/aiter_repo in pipeline.toml), or pin once with network access (not offline).",
            )
        return repo

    if is_local(url):
        kept = _refuse_non_repository(url, path, log)
        if kept is not None:
            return kept

    lock = _mirror_lock(path, log)
    stack = contextlib.ExitStack()
    try:
        start = time.monotonic()
        if progress is None and log is not None:
            progress = shown = FetchProgress(log, url)
            stack.callback(shown.close)
        # temp dirs of a clone that was killed (we hold this mirror's lock: none is in use)
        for stale in path.parent.glob(f".{path.name}.*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        repo = _open_existing(path)
        if repo is None and path.exists():
            if log is not None:
                log.warn(f"{path} is not a usable mirror; re-creating it.")
            shutil.rmtree(path)
        if repo is None:
            repo = _create_mirror(path, url, progress=progress, log=log, retries=retries, backoff=backoff)
            verb = "mirrored"
        else:
            _clear_stale_git_locks(path, log)
            _configure_mirror(path, url)
            args = [f"--git-dir={path}", *FETCH_CONFIG, "fetch", "--prune", "--progress", "origin"]
            try:
                _with_retries(
                    lambda: run_git(args, progress=progress),
                    url=url,
                    action="fetching",
                    retries=retries,
                    log=log,
                    backoff=backoff,
                )
            except InfraError as e:
                if log is not None:
                    log.warn(
                        f"{sentence(e.message)} Continuing OFFLINE with the existing mirror of {url} "
                        f"as it is (last fetched {last_fetched(path)}); refs may be out of date."
                    )
                return repo
            _update_head(repo)
            _touch_marker(path)
            verb = "fetched"
        stack.close()  # the progress task's last line before the summary
        if log is not None:
            log.info(f"{verb} {url} in {time.monotonic() - start:.1f}s")
        return repo
    finally:
        stack.close()
        if not path.exists():  # nothing was mirrored: leave no lock file for this URL
            remove_held_lock(lock)
        lock.release()


def _create_mirror(
    path: Path,
    url: str,
    *,
    progress: ProgressFn | None,
    log: Logger | None,
    retries: int,
    backoff: float | None,
) -> GitRepo:
    """`git clone --bare` into a temp dir next to `path`, configure, rename into place."""
    tmp_parent = make_temp_dir(path.parent, prefix=f".{path.name}.")
    tmp = tmp_parent / "repo.git"
    try:

        def attempt() -> GitResult:
            if tmp.exists():
                shutil.rmtree(tmp)
            return run_git(
                [*FETCH_CONFIG, "clone", "--bare", "--progress", "--", url, str(tmp)], progress=progress
            )

        _with_retries(attempt, url=url, action="cloning", retries=retries, log=log, backoff=backoff)
        _configure_mirror(tmp, url)
        _touch_marker(tmp)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp_parent, ignore_errors=True)
    return GitRepo(path)


def fetch_commit(repo: GitRepo, sha: str, *, url: str, log: Logger | None = None) -> bool:
    """Try to fetch one commit by full SHA (for commits not on any branch). True if now present."""
    if repo.rev_parse(sha):
        return True
    lock = _mirror_lock(repo.path, log)
    try:
        repo.git(*FETCH_CONFIG, "fetch", "--no-tags", "origin", f"+{sha}:{PIN_REF_PREFIX}{sha}")
    except (SourceError, InfraError) as e:
        if log is not None:
            log.detail(f"fetching {sha} from {url} by SHA failed: {e.message}")
        return False
    finally:
        lock.release()
    return repo.rev_parse(sha) is not None


def keep_pinned(repo: GitRepo, sha: str) -> None:
    """`refs/pins/<sha>`: the pinned commit survives upstream force-pushes and pruning."""
    ref = f"{PIN_REF_PREFIX}{sha}"
    if repo.rev_parse(ref) != sha:
        repo.git("update-ref", ref, sha)


def mirrors_for_lock(settings: Settings, lock: Lock, *, fetch: bool = False) -> tuple[GitRepo, GitRepo]:
    """The (ATOM, aiter) mirrors holding the locked commits; no network unless `fetch`."""
    repos = []
    for name, src in (("ATOM", lock.atom), ("aiter", lock.aiter)):
        repo = open_mirror(settings, src.url, fetch=fetch)
        if repo.rev_parse(src.sha) is None and not (fetch and fetch_commit(repo, src.sha, url=src.url)):
            raise SourceError(
                f"the locked {name} commit {src.sha} is not in the mirror of {src.url} ({repo.path}).",
                hint="Run `pipeline pin` again (with network access) to refresh the mirrors.",
            )
        repos.append(repo)
    return repos[0], repos[1]
