"""Sources: bare mirrors of ATOM, aiter (and its submodules) and ref resolution.

Every repository we read is first mirrored under `settings.mirrors_dir`
(`<readable-name>-<hash>.git`, bare), then fetched incrementally. Later stages
read only from these mirrors, at the full SHAs written in the lock file, so
they never need the network.

- Any git URL or a local path can be a source. A local path is mirrored too
  (`git clone --bare` of a path copies or hard-links its objects, which also
  works for partial clones that `upload-pack` would refuse to serve).
- One `filelock.FileLock` per mirror: two runs never fetch the same mirror
  at once.
- A mirror is created in a temporary directory and renamed into place when
  complete; an interrupted fetch leaves the mirror as it was (git writes the
  pack first and moves refs last).
- Unreachable remotes are retried with backoff, then an `InfraError`; when a
  mirror already exists we warn and continue offline with it as it is.
- Commits we pin get a `refs/pins/<sha>` ref in the mirror, so an upstream
  force-push never lets them be garbage-collected.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import filelock

from pipeline.config import Settings
from pipeline.errors import IncompatibleError, InfraError, RunLocked, SourceError, TagError, UsageError
from pipeline.gitw import CommitInfo, GitRepo, is_unreachable
from pipeline.lock import BaseImagePin, Lock, SourcePin, Sources, Submodule
from pipeline.log import Logger

ProgressFn = Callable[[str], None]
DigestResolver = Callable[[str], "str | None"]
# Chooses the aiter commit to pin from (atom mirror, atom commit, aiter mirror, aiter commit
# resolved from the requested ref); used by `pipeline pin --auto`.
AiterChooser = Callable[[GitRepo, CommitInfo, GitRepo, CommitInfo], CommitInfo]

# First retry waits this long, then doubles. Tests make it short.
BACKOFF_SECONDS = 1.0
# How long to wait for another run holding a mirror's lock.
MIRROR_LOCK_TIMEOUT = 30 * 60.0
# Marker written in a mirror after each successful fetch (its mtime is "last fetched").
FETCHED_MARKER = "pipeline-fetched"
PIN_REF_PREFIX = "refs/pins/"

_HEX = re.compile(r"^[0-9a-fA-F]{4,40}$")
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_SCP = re.compile(r"^(?:[^@/]+@)?[^/:]+:")  # git@host:path (git's scp-like syntax)


# -- URLs -------------------------------------------------------------------------


def is_local(url: str) -> bool:
    """True for a local path (as git decides: no `scheme://`, no scp-like `host:`)."""
    if "://" in url:
        return False
    return not _SCP.match(url) or url.startswith(("/", "./", "../", "~"))


def normalise_url(url: str, *, cwd: Path | None = None) -> str:
    """Local paths become absolute; URLs lose embedded credentials; else unchanged."""
    url = url.strip()
    if not url:
        raise UsageError("an empty repository URL was given.", hint="Pass a git URL or a local path.")
    if is_local(url):
        p = Path(url).expanduser()
        if not p.is_absolute():
            p = (cwd or Path.cwd()) / p
        return str(Path(os.path.normpath(p)))
    return strip_credentials(url)


def strip_credentials(url: str) -> str:
    """`https://user:token@host/x` -> `https://host/x` (never written to a lock or log)."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    # keep a bare user name for ssh:// (git@host), drop user:password for http(s)
    if parts.scheme.startswith("ssh") and parts.username and parts.password is None:
        host = f"{parts.username}@{host}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def mirror_name(url: str) -> str:
    """A readable, unique directory name for `url`'s mirror (without `.git`)."""
    key = url.rstrip("/")
    key = key.removesuffix(".git")
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    readable = re.sub(r"^[a-z][a-z0-9+.-]*://", "", key)
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", readable).strip("-.")
    readable = readable[-60:].lstrip("-.") or "repo"
    return f"{readable}-{digest}"


def mirror_path(settings: Settings, url: str) -> Path:
    return settings.mirrors_dir / f"{mirror_name(normalise_url(url))}.git"


def resolve_relative_url(parent: str, url: str) -> str:
    """Resolve a submodule URL (`../ck.git`, `./x`) against its superproject's URL, as git does."""
    if not url.startswith(("./", "../")):
        return url
    if "://" in parent:
        scheme, rest = parent.split("://", 1)
        host, _, path = rest.partition("/")
        prefix, sep = f"{scheme}://{host}", "/"
    elif not is_local(parent):
        host, _, path = parent.partition(":")
        prefix, sep = host, ":"
    else:
        prefix, sep, path = "", "/", parent
    comps = [c for c in path.split("/") if c]
    rel = url
    while True:
        if rel.startswith("./"):
            rel = rel[2:]
        elif rel.startswith("../"):
            rel = rel[3:]
            if not comps:
                raise SourceError(f"submodule URL {url!r} climbs above its superproject URL {parent!r}.")
            comps.pop()
        else:
            break
    return prefix + sep + "/".join([*comps, rel] if rel else comps)


def validate_model(model: str) -> str:
    if not _MODEL.match(model):
        raise UsageError(
            f"invalid model name {model!r}: use letters, digits, '.', '-' and '_' "
            "(starting with a letter or digit, at most 100 characters).",
            hint="For example: --model MiniMax-M3-MXFP4.",
        )
    return model


# -- running git with progress ---------------------------------------------------------

_GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",  # never wait for a password on a terminal
    "LC_ALL": "C",  # English messages, so failures can be classified
    "GIT_ASKPASS": "",
    "SSH_ASKPASS": "",
}
# Abort HTTP transfers that stall (otherwise git waits forever on a dead link).
_FETCH_CONFIG = ("-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=60")


def _git_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(_GIT_ENV)
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    return env


@dataclass(frozen=True)
class _GitResult:
    returncode: int
    stderr: str


def _run_git_progress(args: list[str], progress: ProgressFn | None) -> _GitResult:
    """Run `git <args>` streaming stderr (`--progress` output) to `progress`, throttled.

    Progress lines are emitted when the phase changes, at most every 2 s within
    a phase, and the final line of each phase.
    """
    proc = subprocess.Popen(
        ["git", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_git_env(),
    )
    assert proc.stderr is not None
    kept: list[str] = []
    phase = ""
    last_emit = 0.0
    pending = ""
    buf = b""
    try:
        while True:
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            parts = re.split(rb"[\r\n]", buf)
            buf = parts.pop()
            for raw in parts:
                line = raw.decode("utf-8", "replace").strip()
                if not line:
                    continue
                this_phase = line.split(":", 1)[0]
                is_progress = bool(re.search(r"\d+% \(", line))
                if not is_progress:
                    kept.append(line)
                if progress is None:
                    continue
                now = time.monotonic()
                if this_phase != phase:
                    if pending:
                        progress(pending)
                    phase, pending, last_emit = this_phase, "", now
                    progress(line)
                elif line.endswith("done.") or not is_progress or now - last_emit >= 2.0:
                    progress(line)
                    pending, last_emit = "", now
                else:
                    pending = line
        if buf.strip():
            kept.append(buf.decode("utf-8", "replace").strip())
        if progress is not None and pending:
            progress(pending)
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return _GitResult(rc, "\n".join(kept))


def _classify(stderr: str, url: str, action: str) -> SourceError | InfraError:
    """InfraError when the remote could not be reached at all, else SourceError."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    fatal = [ln for ln in lines if ln.startswith(("fatal:", "error:", "remote: fatal", "ssh:"))]
    first = (fatal or lines or ["(no output)"])[0]
    low = stderr.lower()
    if "corruption on the remote side" in low or "remote: fatal: unable to read" in low:
        return SourceError(
            f"{url} is missing objects it refers to (a partial clone, or corrupt) while {action}.",
            hint="If it is a local partial mirror, give it as a plain path, not file://: "
            "a local clone copies its objects as they are.",
            evidence=stderr,
        )
    if is_local(url):  # a path is never "unreachable": it is missing or not a repository
        return SourceError(
            f"cannot read the repository at {url} while {action}: {first}",
            hint="Check that the path is a git repository (bare or not).",
            evidence=stderr,
        )
    if is_unreachable(stderr) or "timed out" in stderr.lower():
        return InfraError(
            f"could not reach {url} while {action}: {first}",
            hint="Check the URL and the network; for offline use point the source at a local mirror path.",
            evidence=stderr,
        )
    if "terminal prompts disabled" in stderr or "authentication failed" in stderr.lower():
        return SourceError(
            f"{url} asked for credentials while {action}: {first}",
            hint="Configure a git credential helper or ssh key for this host; "
            "credentials are never taken from the command line.",
            evidence=stderr,
        )
    return SourceError(f"git failed while {action} from {url}: {first}", evidence=stderr)


def _with_retries(
    attempt: Callable[[], _GitResult],
    *,
    url: str,
    action: str,
    retries: int,
    log: Logger | None,
    backoff: float | None = None,
) -> None:
    """Run `attempt` until it succeeds; retry only when the remote is unreachable."""
    delay = BACKOFF_SECONDS if backoff is None else backoff
    tries = max(0, retries) + 1
    for n in range(1, tries + 1):
        result = attempt()
        if result.returncode == 0:
            return
        err = _classify(result.stderr, url, action)
        if isinstance(err, InfraError) and n < tries:
            if log is not None:
                log.warn(f"{url} unreachable (attempt {n}/{tries}); retrying in {delay:.1f}s")
            time.sleep(delay)
            delay *= 2
            continue
        if isinstance(err, InfraError):
            err.message += f" (gave up after {tries} attempt{'s' if tries > 1 else ''})"
        raise err


# -- mirrors ------------------------------------------------------------------------


def _mirror_lock(path: Path, log: Logger | None) -> filelock.BaseFileLock:
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(path) + ".lock")
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        if log is not None:
            log.info(f"waiting for another run that is fetching {path.name} ...")
        try:
            lock.acquire(timeout=MIRROR_LOCK_TIMEOUT)
        except filelock.Timeout:
            raise RunLocked(
                f"another process has held the lock on mirror {path} for {MIRROR_LOCK_TIMEOUT:.0f}s.",
                hint=f"Check for a stuck `pipeline` or `git` process; the lock file is {lock.lock_file}.",
            ) from None
    return lock


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


def _configure_mirror(git_dir: Path, url: str) -> None:
    """Fetch branches and tags only (not GitHub's refs/pull/*), and keep refs/pins/* alive."""
    base = ["git", f"--git-dir={git_dir}"]
    env = _git_env()
    for args in (
        ["config", "remote.origin.url", url],
        ["config", "--replace-all", "remote.origin.fetch", "+refs/heads/*:refs/heads/*"],
        ["config", "--add", "remote.origin.fetch", "+refs/tags/*:refs/tags/*"],
        ["config", "remote.origin.tagOpt", "--no-tags"],
        ["config", "core.bare", "true"],
        ["config", "gc.auto", "0"],  # no background gc while another stage reads
    ):
        done = subprocess.run([*base, *args], env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SourceError(
                f"cannot configure mirror {git_dir}: {done.stderr.strip()}",
                hint="Check that the cache directory is writable, or delete the mirror to re-create it.",
                evidence=done.stderr,
            )


def _update_head(repo: GitRepo) -> None:
    """Point the mirror's HEAD at the remote's default branch (best effort)."""
    try:
        out = repo.git(*_FETCH_CONFIG, "ls-remote", "--symref", "origin", "HEAD", env=_GIT_ENV)
    except (SourceError, InfraError):
        return
    for line in out.splitlines():
        if line.startswith("ref: ") and line.endswith("\tHEAD"):
            target = line[5:].split("\t", 1)[0]
            if repo.rev_parse(target):
                repo.git("symbolic-ref", "HEAD", target)
            return


class LongFetchProgress:
    """git's progress lines: all at detail level; when a fetch runs long, some at info level.

    Quiet runs see nothing for quick fetches, and one line every `every`
    seconds once a fetch has taken more than `after` seconds.
    """

    def __init__(self, log: Logger, url: str, *, after: float = 5.0, every: float = 10.0) -> None:
        self.log = log
        self.url = url
        self.after = after
        self.every = every
        self.start = time.monotonic()
        self.last_info = 0.0

    def __call__(self, line: str) -> None:
        self.log.detail(line)
        now = time.monotonic()
        if self.log.verbosity == 0 and now - self.start >= self.after and now - self.last_info >= self.every:
            self.last_info = now
            self.log.info(f"  {self.url}: {line}")


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
                hint="Run `pipeline pin` with network access (without --offline) once to create it.",
            )
        return repo

    local = is_local(url)
    if local and not Path(url).exists():
        existing = _open_existing(path)
        if existing is not None:
            if log is not None:
                log.warn(
                    f"{url} does not exist any more; using its existing mirror as it is "
                    f"(last fetched {last_fetched(path)})."
                )
            return existing
        raise SourceError(
            f"repository path {url} does not exist.",
            hint="Check the path given with --atom-repo/--aiter-repo, in pipeline.toml or PIPELINE_*_REPO.",
        )

    lock = _mirror_lock(path, log)
    try:
        start = time.monotonic()
        if progress is None and log is not None:
            progress = LongFetchProgress(log, url)
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
            args = [f"--git-dir={path}", *_FETCH_CONFIG, "fetch", "--prune", "--progress", "origin"]
            try:
                _with_retries(
                    lambda: _run_git_progress(args, progress),
                    url=url,
                    action="fetching",
                    retries=retries,
                    log=log,
                    backoff=backoff,
                )
            except InfraError as e:
                if log is not None:
                    log.warn(
                        f"{e.message}. Continuing OFFLINE with the existing mirror of {url} as it is "
                        f"(last fetched {last_fetched(path)}); refs may be out of date."
                    )
                return repo
            _update_head(repo)
            _touch_marker(path)
            verb = "fetched"
        if log is not None:
            log.info(f"{verb} {url} in {time.monotonic() - start:.1f}s")
        return repo
    finally:
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
    tmp_parent = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp = tmp_parent / "repo.git"
    try:

        def attempt() -> _GitResult:
            if tmp.exists():
                shutil.rmtree(tmp)
            return _run_git_progress(
                [*_FETCH_CONFIG, "clone", "--bare", "--progress", "--", url, str(tmp)], progress
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
        repo.git(
            *_FETCH_CONFIG, "fetch", "--no-tags", "origin", f"+{sha}:{PIN_REF_PREFIX}{sha}", env=_GIT_ENV
        )
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


# -- refs ---------------------------------------------------------------------------


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


# -- submodules ----------------------------------------------------------------------


def read_submodules(repo: GitRepo, rev: str, *, parent_url: str) -> tuple[Submodule, ...]:
    """Submodules at `rev`: `.gitmodules` (path -> url) joined with the gitlinks (path -> sha)."""
    links = repo.submodules(rev)
    if not links:
        return ()
    urls: dict[str, str] = {}
    if repo.read_blob(rev, ".gitmodules") is not None:
        out = repo.git("config", "--blob", f"{rev}:.gitmodules", "--null", "--list")
        names: dict[str, dict[str, str]] = {}
        for entry in out.split("\0"):
            if not entry:
                continue
            key, _, value = entry.partition("\n")
            m = re.match(r"^submodule\.(.+)\.(path|url)$", key)
            if m:
                names.setdefault(m.group(1), {})[m.group(2)] = value
        for fields in names.values():
            if "path" in fields and "url" in fields:
                urls[fields["path"]] = fields["url"]
    subs = []
    for path, sha in links:
        raw = urls.get(path, "")
        url = resolve_relative_url(parent_url, raw) if raw else ""
        subs.append(Submodule(path=path, url=url, sha=sha))
    return tuple(subs)


def submodule_mirror(settings: Settings, url: str) -> GitRepo | None:
    """The existing mirror of a submodule URL, or None (no network)."""
    if not url:
        return None
    return _open_existing(mirror_path(settings, url))


def _mirror_submodule(settings: Settings, sub: Submodule, log: Logger) -> None:
    if not sub.url:
        log.warn(f"submodule {sub.path} has no URL in .gitmodules; not mirrored.")
        return
    try:
        repo = open_mirror(
            settings, sub.url, log=log, retries=min(1, settings.sources.fetch_retries), progress=log.detail
        )
    except (SourceError, InfraError) as e:
        log.warn(
            f"submodule {sub.path} ({sub.url}) could not be mirrored: {e.message}. "
            "Its pinned SHA is in the lock; the render stage decides how to get it."
        )
        return
    if not repo.rev_parse(sub.sha) and not fetch_commit(repo, sub.sha, url=sub.url, log=log):
        log.warn(f"submodule {sub.path}: pinned commit {sub.sha} is not in the mirror of {sub.url}.")
        return
    keep_pinned(repo, sub.sha)


# -- base image ----------------------------------------------------------------------


def default_digest_resolver(ref: str, env: Mapping[str, str] | None = None) -> str | None:
    """The registry's digest for `ref` (Docker config credentials from `env`), None if none answers."""
    from pipeline.registry import resolve_digest

    return resolve_digest(ref, timeout=10.0, env=env)


def pin_base_image(
    ref: str,
    *,
    log: Logger,
    resolver: DigestResolver | None = None,
    previous: BaseImagePin | None = None,
    env: Mapping[str, str] | None = None,
) -> BaseImagePin:
    """Keep `ref` as given; add its digest when a registry answers.

    No registry answering is a warning (the digest of an earlier lock for the
    same reference is kept). A registry that answers "no such image" or
    refuses access is an error: pinning must not hide it.
    """
    ref = ref.strip()
    if not ref:
        raise UsageError("the base image reference is empty.", hint="Pass --base-image or set base_image.")
    m = re.search(r"@(sha256:[0-9a-f]{64})$", ref)
    if m:
        return BaseImagePin(ref=ref, digest=m.group(1))
    digest: str | None
    try:
        digest = resolver(ref) if resolver is not None else default_digest_resolver(ref, env)
    except InfraError as e:
        log.detail(f"digest lookup for {ref} failed: {e}")
        digest = None
    except TagError as e:  # the registry answered and refused: a source problem for pin
        raise SourceError(f"base image {ref}: {e.message}", hint=e.hint, evidence=e.evidence) from e
    if digest:
        return BaseImagePin(ref=ref, digest=digest)
    if previous is not None and previous.ref == ref and previous.digest:
        log.warn(
            f"no registry answered for base image {ref}; keeping the digest from the existing lock "
            f"({previous.digest})."
        )
        return previous
    log.warn(f"no registry answered for base image {ref}; kept as given (no digest pinned).")
    return BaseImagePin(ref=ref, digest="")


# -- pinning ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PinResult:
    lock: Lock
    atom_repo: GitRepo
    aiter_repo: GitRepo
    # aiter commit the requested ref resolved to (differs from the pin with --auto)
    aiter_requested: CommitInfo


def _source_pin(url: str, ref: str, info: CommitInfo, submodules: tuple[Submodule, ...] = ()) -> SourcePin:
    return SourcePin(
        url=url, ref=ref, sha=info.sha, date=info.iso_date, subject=info.subject, submodules=submodules
    )


def _resolve_in_mirror(
    repo: GitRepo, ref: str, *, url: str, name: str, fetch: bool, log: Logger
) -> CommitInfo:
    try:
        return resolve_ref(repo, ref, url=url, name=name)
    except SourceError:
        # A full SHA on no branch (e.g. a PR commit) can still be fetched by SHA.
        if (
            fetch
            and re.fullmatch(r"[0-9a-fA-F]{40}", ref)
            and fetch_commit(repo, ref.lower(), url=url, log=log)
        ):
            return resolve_ref(repo, ref, url=url, name=name)
        raise


def pin(
    settings: Settings,
    *,
    model: str,
    atom_ref: str,
    aiter_ref: str,
    base_image: str,
    log: Logger,
    offline: bool = False,
    previous: Lock | None = None,
    digest_resolver: DigestResolver | None = None,
    choose_aiter: AiterChooser | None = None,
    env: Mapping[str, str] | None = None,
) -> PinResult:
    """Resolve both sources to full SHAs (mirroring as needed).

    Returns the Lock, the two mirrors and the aiter commit that was asked for (for reports).
    """
    validate_model(model)
    atom_url = normalise_url(settings.sources.atom_repo)
    aiter_url = normalise_url(settings.sources.aiter_repo)
    fetch = not offline

    atom_repo = open_mirror(settings, atom_url, fetch=fetch, log=log)
    atom = _resolve_in_mirror(atom_repo, atom_ref, url=atom_url, name="ATOM", fetch=fetch, log=log)
    aiter_repo = open_mirror(settings, aiter_url, fetch=fetch, log=log)
    aiter_req = _resolve_in_mirror(aiter_repo, aiter_ref, url=aiter_url, name="aiter", fetch=fetch, log=log)

    aiter = aiter_req
    aiter_ref_recorded = aiter_ref
    if choose_aiter is not None:
        aiter = choose_aiter(atom_repo, atom, aiter_repo, aiter_req)
        aiter_ref_recorded = f"auto:{aiter_ref}"

    subs = read_submodules(aiter_repo, aiter.sha, parent_url=aiter_url)
    if subs and settings.sources.mirror_submodules and not offline:
        for sub in subs:
            _mirror_submodule(settings, sub, log)

    keep_pinned(atom_repo, atom.sha)
    keep_pinned(aiter_repo, aiter.sha)

    base = pin_base_image(
        base_image,
        log=log,
        resolver=digest_resolver,
        previous=previous.base_image if previous is not None else None,
        env=env,
    )
    lock = Lock(
        model=model,
        sources=Sources(
            atom=_source_pin(atom_url, atom_ref, atom),
            aiter=_source_pin(aiter_url, aiter_ref_recorded, aiter, subs),
        ),
        base_image=base,
    )
    if (
        previous is not None
        and previous.atom.sha == lock.atom.sha
        and previous.aiter.sha == lock.aiter.sha
        and previous.patches
    ):
        lock = lock.with_patches(previous.patches)
    return PinResult(lock=lock, atom_repo=atom_repo, aiter_repo=aiter_repo, aiter_requested=aiter_req)


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


def auto_aiter_chooser(
    cache_dir: Path,
    log: Logger,
    report: dict[str, Any],
    patches_dir: Path | None = None,
    recipe_path: Path | None = None,
) -> AiterChooser:
    """`pin --auto`: choose the newest aiter compatible with ATOM (plus the patch series).

    `report` receives what the search found (commits examined, first breaking, newest).
    With `recipe_path`, the recipe's reviewed waivers apply as they do in the check stage.
    """
    from pipeline.patchq import PatchSeries

    compat = importlib.import_module("pipeline.compat")

    # The search runs on the tree we would build: ATOM plus the patch series.
    series = PatchSeries.load(patches_dir) if patches_dir is not None and patches_dir.is_dir() else None
    adjust = None
    if recipe_path is not None and recipe_path.is_file():
        from pipeline.compat.waivers import apply_waivers
        from pipeline.recipe import load_recipe

        waivers = load_recipe(recipe_path).compat.waive
        if waivers:

            def adjust(r: Any) -> Any:
                return apply_waivers(r, waivers)[0]

    def choose(
        atom_repo: GitRepo, atom: CommitInfo, aiter_repo: GitRepo, aiter_head: CommitInfo
    ) -> CommitInfo:
        log.info(
            f"searching aiter up to {aiter_head.short} for the newest commit compatible "
            f"with ATOM {atom.short}"
        )
        res = compat.search_compatible(
            atom_repo,
            atom.sha,
            aiter_repo,
            aiter_head.sha,
            cache_dir=cache_dir / "compat",
            patches=series,
            adjust=adjust,
        )
        first_breaking: CommitInfo | None = res.first_breaking
        newest: CommitInfo | None = res.newest_compatible
        report["commits_examined"] = res.commits_examined
        report["first_breaking"] = commit_json(first_breaking) if first_breaking else None
        report["newest_compatible"] = commit_json(newest) if newest else None
        if first_breaking is not None:
            log.info(f"first breaking aiter commit: {first_breaking.short} {first_breaking.subject}")
        if newest is None:
            raise IncompatibleError(
                f"no aiter commit up to {aiter_head.sha} is compatible with ATOM {atom.sha}"
                + (" even with the patch series" if series is not None else " without patches")
                + (
                    f" (first breaking: {first_breaking.sha} {first_breaking.subject!r})"
                    if first_breaking
                    else ""
                )
                + ".",
                hint="Pin aiter explicitly (--aiter REF) and let the patch stage adapt ATOM, "
                "or choose another ATOM commit.",
            )
        return newest

    return choose


def commit_json(c: CommitInfo) -> dict[str, str]:
    return {"sha": c.sha, "date": c.iso_date, "subject": c.subject}
