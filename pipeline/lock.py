"""The lock file: the exact inputs every stage after `pin` reads.

TOML, one per model (default `locks/<model>.toml`). Written atomically and
only when its content changes, so `pipeline pin` on an unchanged lock is a
no-op. No timestamps of our own: only facts about the pinned commits.

    version = 1
    model = "MiniMax-M3-MXFP4"

    [sources.atom]
    url = "https://github.com/ROCm/ATOM.git"
    ref = "main"
    sha = "ab9eb78105ac2e34153874bc0064b75c96c21b7a"
    date = "2026-06-24T09:12:00Z"
    subject = "..."

    [sources.aiter]
    ...
    [[sources.aiter.submodules]]
    path = "3rdparty/composable_kernel"
    url = "https://github.com/ROCm/composable_kernel.git"
    sha = "15e12dd7f25ee583617c78f66cb502ff9916585f"

    [base_image]
    ref = "rocm/pytorch:..."
    digest = "sha256:..."   # "" when no registry answered

    [[patches]]
    name = "0001-minimax-m3-split-kv-cache.patch"
    sha256 = "..."
    status = "applied"      # applied | not-needed | already-upstream
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import LockFileError, LockInconsistent, RunLocked
from pipeline.fsutil import (
    acquire_lock,
    atomic_write_text,
    path_problem,
    read_text,
    remove_held_lock,
)

LOCK_VERSION = 1
# How long a save waits for another run's save of the same lock file (a save takes milliseconds).
GUARD_WAIT = 10.0
# The text of each lock file as this process last read or wrote it (to notice another run's write).
_seen: dict[str, str] = {}
# Lock files whose guard this process holds.
_held: set[str] = set()
_SHA = r"^[0-9a-f]{40}$"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Submodule(_Frozen):
    path: str
    url: str
    sha: str = Field(pattern=_SHA)


class SourcePin(_Frozen):
    url: str
    ref: str
    sha: str = Field(pattern=_SHA)
    date: str  # committer date, ISO 8601 UTC
    subject: str
    submodules: tuple[Submodule, ...] = ()

    @property
    def short(self) -> str:
        return self.sha[:10]


class Sources(_Frozen):
    atom: SourcePin
    aiter: SourcePin


class BaseImagePin(_Frozen):
    ref: str
    digest: str = Field(default="", pattern=r"^(sha256:[0-9a-f]{64})?$")

    @property
    def pinned(self) -> str:
        """`name@digest` when the digest is known, else the reference as given."""
        if not self.digest:
            return self.ref
        name = self.ref.split("@", 1)[0]
        return f"{name}@{self.digest}"


class PatchPin(_Frozen):
    name: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    status: Literal["applied", "not-needed", "already-upstream"]


class Lock(_Frozen):
    version: int = LOCK_VERSION
    model: str
    sources: Sources
    base_image: BaseImagePin
    patches: tuple[PatchPin, ...] = ()

    # -- convenience ---------------------------------------------------------
    @property
    def atom(self) -> SourcePin:
        return self.sources.atom

    @property
    def aiter(self) -> SourcePin:
        return self.sources.aiter

    @property
    def applied_patches(self) -> tuple[PatchPin, ...]:
        return tuple(p for p in self.patches if p.status == "applied")

    def to_toml(self) -> str:
        data: dict[str, Any] = self.model_dump(mode="json")
        for src in data["sources"].values():
            if not src["submodules"]:
                del src["submodules"]
        if not data["patches"]:
            del data["patches"]
        return tomli_w.dumps(data)

    def digest(self) -> str:
        """sha256 over what the lock pins: changes iff an input of the image changes.

        The requested refs are left out: `main` and `auto:main` resolving to the same
        commits pin the same image (the lock file still records them for people).
        """
        data: dict[str, Any] = self.model_dump(mode="json")
        for src in data["sources"].values():
            src.pop("ref")
        return hashlib.sha256(tomli_w.dumps(data).encode()).hexdigest()

    def pair(self) -> dict[str, Any]:
        """What the image is built from, and nothing else: the commits (URL, SHA, commit date: the
        image's `created`), aiter's submodules, the base image by digest and the applied series.

        No model (two models on one pair share one image), no refs asked, no patch the series did
        not apply, no commit subject: none of them reaches the image.
        """
        atom, aiter = self.atom, self.aiter
        return {
            "version": LOCK_VERSION,
            "atom": {"url": atom.url, "sha": atom.sha, "date": atom.date},
            "aiter": {
                "url": aiter.url,
                "sha": aiter.sha,
                "date": aiter.date,
                "submodules": [{"path": s.path, "url": s.url, "sha": s.sha} for s in aiter.submodules],
            },
            "base_image": self.base_image.pinned,
            "patches": [{"name": p.name, "sha256": p.sha256} for p in self.applied_patches],
        }

    def pair_toml(self) -> str:
        """`pair()` as TOML: the file the image carries in place of the (model's) lock."""
        return tomli_w.dumps(self.pair())

    def pair_digest(self) -> str:
        """sha256 over `pair()`: the same for every model whose lock pins the same image inputs.

        The image's identity is made of it (not of `digest()`, which names the model): two models
        with the same pair share one build, and each verdict binds its model's lock to that image.
        """
        return hashlib.sha256(self.pair_toml().encode()).hexdigest()

    def require_pair(self, image_labels: Mapping[str, str], image: str, *, name: str, done: str) -> None:
        """This lock pins the pair `image` was built from (its pair label), or LockInconsistent:
        the one check smoke and tag make of a lock against an image. `name` says which lock, `done`
        what was not done."""
        from pipeline import labels

        pair, label = self.pair_digest(), image_labels.get(labels.PAIR_DIGEST, "")
        if label != pair:
            raise LockInconsistent(
                f"{name} is not the lock the image {image} was built from: it pins pair {pair[:12]}, "
                f"the image's label {labels.PAIR_DIGEST} says {label[:12] or '(none)'} (edited since the "
                f"build, or the lock of another pair); {done}.",
                hint="Give the lock the image was built from (a run's lock.toml, restored with `git diff` "
                "or from a copy of the run directory), or build, smoke-test and tag this lock "
                f"(`pipeline build --model {self.model}`).",
            )

    def with_patches(self, patches: tuple[PatchPin, ...]) -> Lock:
        return self.model_copy(update={"patches": patches})

    # -- I/O -------------------------------------------------------------------
    @classmethod
    def load(cls, path: Path) -> Lock:
        hint = (
            "Run `pipeline pin --model MODEL` first, or pass --lock with the right path."
            if not path.exists()
            else "Restore it from version control, or delete it and run `pipeline pin` again."
        )
        text = read_text(path, what="lock file", error=LockFileError, hint=hint)
        lock = cls.parse(text, source=str(path))
        _seen[_key(path)] = text
        return lock

    @classmethod
    def parse(cls, text: str, *, source: str = "<lock>") -> Lock:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            # tomllib's message ends with "(at line L, column C)"
            raise LockFileError(
                f"lock file {source} is corrupt: {e}.",
                hint="Restore it from version control or delete it and run `pipeline pin` again.",
            ) from e
        version = data.get("version")
        if version != LOCK_VERSION:
            raise LockFileError(
                f"lock file {source} has version {version!r}; this pipeline reads version {LOCK_VERSION}.",
                hint="Run `pipeline pin` again to rewrite it.",
            )
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            problems = []
            for err in e.errors():
                key = ".".join(str(p) for p in err["loc"])
                line = _line_of(text, str(err["loc"][-1]))
                at = f" (line {line})" if line else ""
                problems.append(f"{key}{at}: {err['msg']}")
            raise LockFileError(
                f"lock file {source} is invalid: " + "; ".join(problems) + ".",
                hint="Restore it from version control or delete it and run `pipeline pin` again.",
            ) from e

    def save(self, path: Path) -> bool:
        """Write atomically if the content differs. Returns True if written.

        If this process read `path` and another run has changed it since, nothing is written:
        `RunLocked` (exit 13) says so, rather than the last writer silently winning.
        """
        text = self.to_toml()
        with _guarded(path):
            current = read_text(path, what="lock file", error=LockFileError) if path.exists() else None
            seen = _seen.get(_key(path), current)
            if current != seen:
                raise RunLocked(
                    f"lock file {path} was changed by another run since this one read it; "
                    "nothing was written.",
                    hint="Run again: it starts from the lock as the other run left it.",
                )
            if current == text:
                return False
            atomic_write_text(path, text, what="lock file", error=LockFileError)
            _seen[_key(path)] = text
            return True


def _line_of(text: str, key: str) -> int | None:
    pat = re.compile(rf"^\s*{re.escape(key)}\s*=", re.M)
    m = pat.search(text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def default_lock_path(locks_dir: Path, model: str) -> Path:
    return locks_dir / f"{model}.toml"


def _key(path: Path) -> str:
    return str(path.absolute())


def guard_path(path: Path) -> Path:
    """The file whose lock guards a read-modify-write of lock file `path` (it exists only meanwhile)."""
    return path.with_name(f".{path.name}.lock")


@contextmanager
def updating(path: Path) -> Iterator[Lock | None]:
    """Hold lock file `path` for a read-modify-write; yields its current content (None if absent).

    Two `pin`s (or a `pin` and a `patch apply`) on one lock file would otherwise both read
    it and the last writer would win, silently. The second one is refused at once (exit 13);
    nothing has been fetched or written by it.
    """
    problem = path_problem(path)
    if problem is not None:
        raise LockFileError(f"lock file path cannot be used: {problem}.", hint="Pass --lock FILE.")
    if path.is_dir():
        raise LockFileError(
            f"lock file {path} is a directory, not a file.", hint="Remove it, or pass --lock FILE."
        )
    with _guarded(path, wait=0):
        yield Lock.load(path) if path.exists() else None


@contextmanager
def _guarded(path: Path, *, wait: float = GUARD_WAIT) -> Iterator[None]:
    """Hold the guard of lock file `path` (re-entrant within this process); it is removed after."""
    key = _key(path)
    if key in _held:
        yield
        return
    guard = acquire_lock(
        guard_path(path),
        wait=wait,
        busy=f"another `pipeline` run is updating lock file {path}.",
        hint="Wait for it to finish, then run again (it may change what this run would write).",
    )
    _held.add(key)
    try:
        yield
    finally:
        _held.discard(key)
        remove_held_lock(guard)
        guard.release()
