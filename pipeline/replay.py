"""Replay of a `pipeline check` whose answer is already known.

A check of two commits is a pure function of every SHA it reads (the ATOM
commit, the aiter commit, aiter's tip for its history, an explicit baseline),
of the tool's own code and of the settings and environment that shape its
output. CI steps and shells ask the same question many times a day; the
question costs a full CLI start-up (click, pydantic, GitPython, the checker)
even when the report is cached. So the first run of a question records what it
printed and its exit code, keyed by all of the above; a repeat prints that
record, with the stage's real time, without importing anything heavy.

Only the plain form is replayed: `check --atom R --aiter R --atom-repo PATH
--aiter-repo PATH [--baseline-aiter R] [--format F]` with local repositories.
Anything else (a lock, a model, an output file, -v, --config, a step summary)
runs the full command. Only exit 0 (compatible) and 4 (incompatible) are
recorded: errors are always re-run. `PIPELINE_REPLAY=0` turns replay off (and
sends every check to the CLI).

A plain form not recorded yet is answered by `pipeline.plaincheck` (the check
without click or pydantic, printing what the CLI would) when no project file is
read; else, or whenever it cannot vouch for the answer, by the full CLI.

This module imports only what the interpreter has already loaded (start-up).
"""

from __future__ import annotations

import contextlib
import marshal
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence

try:  # hashlib pulls in OpenSSL (5 ms); the builtin BLAKE2 is enough for a cache key
    from _blake2 import blake2b
except ImportError:  # pragma: no cover (not CPython)
    from hashlib import blake2b

SCHEMA = 1
_VALUE_FLAGS = {
    "--atom": "atom",
    "--aiter": "aiter",
    "--atom-repo": "atom_repo",
    "--aiter-repo": "aiter_repo",
    "--baseline-aiter": "baseline",
    "--format": "format",
}
# The environment that shapes what a check prints (besides PIPELINE_* settings).
_ENV_KEYS = (
    "CI", "GITHUB_ACTIONS", "NO_COLOR", "FORCE_COLOR", "TERM", "COLUMNS", "LANG", "LC_ALL",
    "LC_CTYPE", "PYTHONIOENCODING", "XDG_CACHE_HOME", "HOME",
)  # fmt: skip
# the stage line: `✕ check (6.1s) — ...` (log.MARKS, or log.ASCII_MARKS where they cannot show)
_STAGE_MARKS = ("\n✓ check (", "\n✕ check (", "\n+ check (", "\nx check (")
COMPLETE_VAR = "_PIPELINE_COMPLETE"  # cli.COMPLETE_VAR (click's shell completion)
_RECORDED = (0, 4)  # compatible, incompatible: answers; every other exit is re-run
KEPT_PER_DIR = 16  # records kept in each of the 256 record directories (the newest)


def parse(argv: Sequence[str]) -> dict[str, str] | None:
    """The flags of a replayable `check` invocation, or None when it is not the plain form."""
    if not argv or argv[0] != "check":
        return None
    out: dict[str, str] = {}
    rest = list(argv[1:])
    while rest:
        arg = rest.pop(0)
        flag, eq, value = arg.partition("=")
        if flag not in _VALUE_FLAGS:
            return None
        if not eq:
            if not rest:
                return None
            value = rest.pop(0)
        if not value or value.startswith("-") or _VALUE_FLAGS[flag] in out:
            return None
        out[_VALUE_FLAGS[flag]] = value
    if not {"atom", "aiter", "atom_repo", "aiter_repo"} <= out.keys():
        return None
    if out.get("format", "text") not in ("text", "json", "sarif"):
        return None
    return out


def cache_dir(env: Mapping[str, str], project: bytes | None) -> str | None:
    """Where the settings put the cache (None: a project file may say; let the full CLI read it)."""
    if env.get("PIPELINE_CACHE_DIR"):
        return os.path.expanduser(env["PIPELINE_CACHE_DIR"])
    if project is not None and b"cache_dir" in project:
        return None
    base = env.get("XDG_CACHE_HOME", "").strip() or os.path.expanduser("~/.cache")
    return os.path.join(base, "atom-image-pipeline")  # platformdirs' user_cache_dir on Linux


def _git_lines(asks: Sequence[tuple[str, Sequence[str]]], env: Mapping[str, str]) -> list[list[str]] | None:
    """`git rev-parse REV^{commit}...` in each `(repo, revs)`, the gits run side by side, without
    the subprocess module (start-up)."""
    started: list[tuple[int, int, int]] = []  # (pid, read end, how many lines)
    try:
        for repo, revs in asks:
            started.append(_rev_parse(repo, revs, env))
    except OSError:
        for pid, r, _ in started:
            os.close(r)
            os.waitpid(pid, 0)
        return None
    out: list[list[str]] | None = []
    for pid, r, n in started:
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
        os.close(r)
        _, status = os.waitpid(pid, 0)
        lines = b"".join(chunks).decode("ascii", "replace").split()
        if os.waitstatus_to_exitcode(status) != 0 or len(lines) != n:
            out = None
        elif out is not None:
            out.append(lines)
    return out


def _rev_parse(repo: str, revs: Sequence[str], env: Mapping[str, str]) -> tuple[int, int, int]:
    r, w = os.pipe()
    try:
        pid = os.posix_spawnp(
            "git",
            ["git", "-C", repo, "rev-parse", *(f"{v}^{{commit}}" for v in revs)],
            {k: v for k, v in env.items() if not k.startswith("GIT_")},
            file_actions=[
                (os.POSIX_SPAWN_DUP2, w, 1),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_CLOSE, r),
            ],
        )
    except OSError:
        os.close(r)
        raise
    finally:
        os.close(w)
    return pid, r, len(revs)


_STAMP: list[bytes] = []  # (once per process: the code that answers is the code loaded at start)


def _code_stamp() -> bytes:
    """The tool's own code and data files (an edit of the checker changes every answer)."""
    if not _STAMP:
        _STAMP.append(_stamp_files())
    return _STAMP[0]


def _stamp_files() -> bytes:
    root = os.path.dirname(os.path.abspath(__file__))
    h = blake2b(digest_size=16)
    stack = [root]
    while stack:
        d = stack.pop()
        for e in sorted(os.scandir(d), key=lambda e: e.name):
            if e.is_dir(follow_symlinks=False):
                if e.name != "__pycache__":
                    stack.append(e.path)
            elif e.name.endswith((".py", ".toml", ".j2", ".json")):
                st = e.stat()
                h.update(f"{e.path}\0{st.st_mtime_ns}\0{st.st_size}\n".encode())
    return h.digest()


def _project_file_above(cwd: str) -> bool:
    """A pipeline.toml in a parent directory up to the repository root (`config.find_project_file`)."""
    d = cwd
    while not os.path.exists(os.path.join(d, ".git")):
        parent = os.path.dirname(d)
        if parent == d:
            return False  # outside a repository only the working directory counts
        d = parent
        if os.path.isfile(os.path.join(d, "pipeline.toml")):
            return True
    return False


def key(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> tuple[str, str] | None:
    """(cache file, key) for this invocation, or None when it must run in full."""
    found = _question(argv, env, cwd)
    return None if found is None else found[:2]


_Question = tuple[str, str, dict[str, str], str, bool]  # file, key, flags, cache dir, no project file


def _question(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> _Question | None:
    """`key`'s answer, with the flags, the cache dir and whether no project file is read."""
    flags = parse(argv)
    if flags is None or env.get("PIPELINE_REPLAY", "1") == "0" or env.get("GITHUB_STEP_SUMMARY"):
        return None
    if env.get(COMPLETE_VAR):
        return None  # shell completion: the CLI answers, not the check
    if not all(os.path.isdir(flags[k]) for k in ("atom_repo", "aiter_repo")):
        return None  # a URL goes through its mirror: the full CLI decides
    try:
        with open(os.path.join(cwd, "pipeline.toml"), "rb") as f:
            project: bytes | None = f.read()
    except FileNotFoundError:
        project = None
        if _project_file_above(cwd):
            return None  # the configuration comes from a parent directory: the full CLI reads it
    except OSError:
        return None
    where = cache_dir(env, project)
    if where is None:
        return None
    aiter_revs = [flags["aiter"], "HEAD", *([flags["baseline"]] if "baseline" in flags else [])]
    got = _git_lines([(flags["atom_repo"], [flags["atom"]]), (flags["aiter_repo"], aiter_revs)], env)
    if got is None:
        return None  # a ref that does not resolve: the full CLI says why
    atom, aiter = got
    h = blake2b(digest_size=20)
    parts: list[object] = [
        SCHEMA, _code_stamp().hex(), sys.version, cwd, project or b"",
        sorted((k, v) for k, v in flags.items()),
        [os.path.realpath(flags["atom_repo"]), os.path.realpath(flags["aiter_repo"])], atom, aiter,
        sorted((k, v) for k, v in env.items() if k.startswith("PIPELINE_") or k in _ENV_KEYS),
        [os.isatty(1), os.isatty(2), getattr(sys.stdout, "encoding", None)],
    ]  # fmt: skip
    h.update(repr(parts).encode())
    digest = h.hexdigest()
    return os.path.join(where, "compat", "replay", digest[:2], digest), digest, flags, where, project is None


def replay(path: str, started: float) -> int | None:
    """Print a recorded answer; its exit code, or None when there is none to replay."""
    try:
        with open(path, "rb") as f:
            rec = marshal.load(f)
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA or rec.get("code") not in _RECORDED:
        return None
    err = _with_time(rec["err"], time.monotonic() - started)
    if err is None:
        return None
    sys.stderr.write(err)
    sys.stderr.flush()
    sys.stdout.write(rec["out"])
    sys.stdout.flush()
    return int(rec["code"])


def _stage_time(err: str) -> tuple[int, int] | None:
    """Where the stage line's `(6.1s)` is in what a check printed on stderr."""
    text = "\n" + err
    for mark in _STAGE_MARKS:
        at = text.find(mark)
        if at >= 0:
            start = at + len(mark) - 1  # the "(" (offsets in `err`: one less for the added newline)
            end = text.find("s)", start)
            if end > start and text[start + 1 : end].replace(".", "", 1).isdigit():
                return start - 1, end  # "(" and ")" in `err`
    return None


def _with_time(err: str, seconds: float) -> str | None:
    at = _stage_time(err)
    if at is None:
        return None
    return f"{err[: at[0]]}({seconds:.1f}s){err[at[1] + 1 :]}"


class _Tee:
    """A text stream that keeps a copy of what is written to it."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.seen: list[str] = []

    def write(self, s: str) -> int:
        n: int = self._inner.write(s)  # type: ignore[attr-defined]
        if isinstance(s, str):  # (click probes with b"" for a binary stream)
            self.seen.append(s)
        return n

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def run(argv: Sequence[str], full: Callable[[], int], env: Mapping[str, str] | None = None) -> int:
    """Replay `argv` when its answer is recorded, else answer it (`pipeline.plaincheck`, else
    `full()`, the CLI) and record what was printed."""
    started = time.monotonic()
    env = os.environ if env is None else env
    cwd = os.getcwd()
    found = _question(argv, env, cwd)
    if found is not None:
        code = replay(found[0], started)
        if code is not None:
            return code
    if found is None:
        return full()
    out, err = _Tee(sys.stdout), _Tee(sys.stderr)
    real = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        code = None
        if found[4]:  # no project file: the settings are the environment's (plaincheck vouches for it)
            from pipeline import plaincheck

            code = plaincheck.run(found[2], env, found[3])
        if code is None:
            code = full()
    finally:
        sys.stdout, sys.stderr = real
    again = key(argv, env, cwd)  # a ref that moved during the run: the record would lie
    text_out, text_err = "".join(out.seen), "".join(err.seen)
    if code in _RECORDED and again == found[:2] and text_out and _stage_time(text_err):
        _store(found[0], {"schema": SCHEMA, "code": code, "out": text_out, "err": text_err})
    return code


def _store(path: str, rec: dict[str, object]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            marshal.dump(rec, f)
        os.replace(tmp, path)
    except OSError:  # a cache that cannot be written is only a slower next run
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return
    _prune(os.path.dirname(path))


def _prune(directory: str) -> None:
    """Keep the newest records of one directory: a scheduled CI's cache dir must not grow for ever."""
    with contextlib.suppress(OSError):
        entries = [e for e in os.scandir(directory) if e.is_file() and not e.name.endswith(".tmp")]
        if len(entries) > KEPT_PER_DIR:
            entries.sort(key=lambda e: e.stat().st_mtime)
            for e in entries[: len(entries) - KEPT_PER_DIR]:
                with contextlib.suppress(OSError):
                    os.unlink(e.path)
