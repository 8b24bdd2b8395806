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
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import LockFileError
from pipeline.fsutil import atomic_write_text

LOCK_VERSION = 1
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

    def with_patches(self, patches: tuple[PatchPin, ...]) -> Lock:
        return self.model_copy(update={"patches": patches})

    # -- I/O -------------------------------------------------------------------
    @classmethod
    def load(cls, path: Path) -> Lock:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise LockFileError(
                f"lock file {path} does not exist.",
                hint="Run `pipeline pin --model MODEL` first, or pass --lock with the right path.",
            ) from None
        except OSError as e:
            raise LockFileError(f"cannot read lock file {path}: {e.strerror}.") from e
        return cls.parse(text, source=str(path))

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
        """Write atomically if the content differs. Returns True if written."""
        text = self.to_toml()
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            return False
        atomic_write_text(path, text)
        return True


def _line_of(text: str, key: str) -> int | None:
    pat = re.compile(rf"^\s*{re.escape(key)}\s*=", re.M)
    m = pat.search(text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def default_lock_path(locks_dir: Path, model: str) -> Path:
    return locks_dir / f"{model}.toml"
