"""One error hierarchy; each failure class carries its exit code.

The library raises these; only the CLI (`pipeline.cli`) catches them, prints
`str(err)` (one paragraph that says what to do next) and exits with
`err.exit_code`. The exit-code table in README.md is generated from EXIT_CODES.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1  # a bug in the pipeline itself
    USAGE = 2  # bad command line or configuration (click also uses 2)
    SOURCE = 3  # a repository, ref or lock file problem
    INCOMPATIBLE = 4  # the static ATOM x aiter check found breaking calls
    PATCH = 5  # the patch series does not apply / is malformed
    RENDER = 6  # templates or build context could not be rendered
    BUILD = 7  # the image build failed
    SMOKE_FAILED = 8  # the smoke test ran and a gate failed
    NO_HARDWARE = 9  # the smoke test could not run: GPUs / model cache missing
    TAG = 10  # tagging or pushing refused or failed
    INFRA = 11  # Docker engine, registry or network unreachable
    LOCK_INCONSISTENT = 12  # a lock file that its commits or the patch series contradict
    LOCKED = 13  # another run holds the run directory or tag lock
    DISK = 14  # no room (ENOSPC, EDQUOT) or no write access (EROFS, EACCES) where a run writes
    INTERRUPTED = 130  # Ctrl-C / SIGTERM


EXIT_CODES: dict[ExitCode, str] = {
    ExitCode.OK: "success",
    ExitCode.INTERNAL: "internal error (a bug: please report it with the run log)",
    ExitCode.USAGE: "bad command line, configuration or recipe",
    ExitCode.SOURCE: "source problem: unknown ref, bad repository, corrupt lock file",
    ExitCode.INCOMPATIBLE: "ATOM calls that do not match aiter's signatures",
    ExitCode.PATCH: "patch series malformed, conflicting or refused",
    ExitCode.RENDER: "Dockerfile/build context could not be rendered",
    ExitCode.BUILD: "image build failed",
    ExitCode.SMOKE_FAILED: "smoke test ran and a gate failed",
    ExitCode.NO_HARDWARE: "smoke test could not run here (GPUs, model cache or token missing)",
    ExitCode.TAG: "tag or push refused or failed",
    ExitCode.INFRA: "infrastructure unreachable: Docker engine, registry, network",
    ExitCode.LOCK_INCONSISTENT: "lock file inconsistent with its commits or the patch series (edited?)",
    ExitCode.LOCKED: "another run holds the lock on this run directory or tag",
    ExitCode.DISK: "disk full or read-only where the run writes (run directory, cache, locks)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C or SIGTERM); every container the run started was removed",
}


def sentence(text: str) -> str:
    """`text` ended as a sentence (`.`, `!`, `?` or `:`), so that another can follow it."""
    text = text.rstrip()
    return text if not text or text.endswith((".", "!", "?", ":")) else text + "."


class PipelineError(Exception):
    """Base class. `str(err)` is the user-facing paragraph.

    `hint` says what to do next; `evidence` keeps what the failing tool said
    (stderr, build log tail, container logs) for the run log, not the console.
    """

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, *, hint: str | None = None, evidence: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.evidence = evidence

    def __str__(self) -> str:
        if not self.hint:
            return self.message
        if "\n" in self.message:  # a report below the message: the hint on a line of its own
            return f"{self.message.rstrip()}\n{self.hint}"
        return f"{sentence(self.message)} {self.hint}"


class UsageError(PipelineError):
    exit_code = ExitCode.USAGE


class ConfigError(UsageError):
    """Configuration or recipe problem; the message names file, key, expected type."""


class SourceError(PipelineError):
    exit_code = ExitCode.SOURCE


class LockFileError(SourceError):
    pass


class LockInconsistent(PipelineError):
    """A lock whose recorded fields differ from what its commits and the patch series say."""

    exit_code = ExitCode.LOCK_INCONSISTENT


class IncompatibleError(PipelineError):
    exit_code = ExitCode.INCOMPATIBLE


class PatchError(PipelineError):
    exit_code = ExitCode.PATCH


class RenderError(PipelineError):
    exit_code = ExitCode.RENDER


class BuildError(PipelineError):
    exit_code = ExitCode.BUILD


class SmokeFailed(PipelineError):
    exit_code = ExitCode.SMOKE_FAILED


class NoHardware(PipelineError):
    exit_code = ExitCode.NO_HARDWARE


class TagError(PipelineError):
    exit_code = ExitCode.TAG


class InfraError(PipelineError):
    exit_code = ExitCode.INFRA


class RunLocked(PipelineError):
    exit_code = ExitCode.LOCKED


class Interrupted(PipelineError):
    exit_code = ExitCode.INTERRUPTED


def interrupted() -> Interrupted:
    """Ctrl-C or SIGTERM (`on_sigterm`), with what the stages guarantee: containers removed;
    images built stay (they are the build cache)."""
    return Interrupted("interrupted; every container this run started was removed.")


def on_sigterm(signum: int, frame: object) -> None:
    """A SIGTERM handler: SIGTERM takes Ctrl-C's path, so every `finally` cleans up."""
    raise KeyboardInterrupt


class DiskError(PipelineError):
    """A write failed for lack of room or of write access; the message names the path."""

    exit_code = ExitCode.DISK


_DISK_ERRNOS = {
    "ENOSPC": "is full",
    "EDQUOT": "is over its quota",
    "EROFS": "is read-only",
    "EACCES": "is not writable",
}


def disk_error(exc: OSError, what: str = "write") -> DiskError | None:
    """The DiskError for an OSError of a full or read-only file system, else None."""
    import errno as _errno

    name = _errno.errorcode.get(exc.errno or 0, "")
    why = _DISK_ERRNOS.get(name)
    if why is None:
        return None
    where = exc.filename or "the run directory"
    return DiskError(
        f"could not {what} {where}: the file system {why} ({name}). Nothing was published.",
        hint="Free space or make the directory writable (or point [paths] runs_dir / cache_dir and "
        "PIPELINE_RUNS_DIR / PIPELINE_CACHE_DIR elsewhere), then run the command again.",
    )
