"""The plain `pipeline check` answered without the CLI framework (no click, no pydantic).

A plain check (`replay.parse`) whose answer is not recorded yet runs here, not through the
CLI: a night's first check then skips the CLI's start-up (click, pydantic, the settings: a
fifth of a second). What it prints comes from the functions the CLI's check prints with:
the check (`compat.run_check`), the report, the stage line and the verdict
(`compat.verdict`, `Logger.stage`), the error (`Logger.report`, as `cli.main` ends).

This module only vouches that the CLI would print the same: that the settings would say
nothing (no `PIPELINE_*` variable but the cache dir, the four its flags override and the
non-settings; no project file, which `replay.key` rules out), that the logger prints nothing
before the stage line (not on GitHub Actions) and that click would print the report as it
is. Whatever else happens (an error, a bug, a report click would re-encode) returns None with
nothing printed, and the full CLI answers with its own messages and codes.
"""

from __future__ import annotations

import codecs
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from pipeline.envvars import ENV_PREFIX, OTHER_ENV
from pipeline.errors import IncompatibleError, interrupted, on_sigterm
from pipeline.log import Logger

# The PIPELINE_* variables the settings of a plain check take silently and that change nothing
# else: the cache dir (resolved as the settings do, `replay.cache_dir`), the four settings the
# flags override (strings: always valid) and the variables that are not settings.
QUIET_ENV = frozenset(
    [
        "PIPELINE_CACHE_DIR",
        *(f"PIPELINE_{k}" for k in ("ATOM_REPO", "AITER_REPO", "ATOM_REF", "AITER_REF")),
        *OTHER_ENV,
    ]
)


class _Held:
    """The console held back until the answer is known (nothing shows when the full CLI answers)."""

    def __init__(self, encoding: str | None) -> None:
        self.encoding = encoding  # (the stage marks are chosen by it: `log.shows_marks`)
        self.parts: list[str] = []

    def write(self, s: str) -> int:
        self.parts.append(s)
        return len(s)

    def flush(self) -> None:
        pass


def run(flags: Mapping[str, str], env: Mapping[str, str], cache_dir: str) -> int | None:
    """Answer the plain check `flags` (`replay.parse`, local repositories, no project file):
    0 compatible, 4 incompatible, 130 interrupted; None (nothing printed) when the CLI must."""
    if any(k.startswith(ENV_PREFIX) and k not in QUIET_ENV for k in env):
        return None  # a setting the CLI validates, or a variable it warns about
    if not _utf8(sys.stdout):
        return None  # click re-encodes an ASCII stdout
    if env.get("GITHUB_ACTIONS") == "true":
        # its lines before the check (masks, the group) would show before the answer is known
        # to be ours; elsewhere the check's stage line is the first (what else writes to stderr,
        # a warning of Python's, a worker's, comes before it either way)
        return None
    held = _Held(getattr(sys.stderr, "encoding", None))
    log = Logger.from_env(env, stream=held)  # type: ignore[arg-type]
    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, on_sigterm)  # as `cli.main`
    try:
        failed, report = _check(flags, log, cache_dir)
    except KeyboardInterrupt:  # the stage's `■ check` line, then the CLI's
        _release(held, log)
        return log.report(interrupted())
    except Exception:  # an error or a bug: the CLI says it
        return None
    # click prints the report as its file holds it (read back with universal newlines, no
    # terminal escapes when not a terminal): anything else is its to print
    if "\r" in report or "\x1b" in report or not _encodes(report):
        return None
    _release(held, log)
    sys.stdout.write(log.redact(report))
    sys.stdout.flush()
    return 0 if failed is None else log.report(failed)


def _check(flags: Mapping[str, str], log: Logger, cache_dir: str) -> tuple[IncompatibleError | None, str]:
    """The check stage of `pipeline check` for `flags`: (its verdict, the report in --format)."""
    from pipeline import validate
    from pipeline.compat import run_check, verdict
    from pipeline.compat.report import Counts
    from pipeline.gitw import GitRepo
    from pipeline.sources.repos import local_path

    atom_rev = validate.ref(flags["atom"], what="ATOM ref")
    aiter_rev = validate.ref(flags["aiter"], what="aiter ref")
    atom_path = local_path(flags["atom_repo"], "ATOM")
    aiter_path = local_path(flags["aiter_repo"], "aiter")
    if atom_path is None or aiter_path is None:
        raise LookupError("a URL: its mirror is the CLI's")
    shown: list[str] = []

    def work() -> str:
        report = run_check(
            GitRepo(atom_path),
            atom_rev,
            GitRepo(aiter_path),
            aiter_rev,
            baseline_aiter_rev=flags.get("baseline"),
            cache_dir=Path(cache_dir) / "compat",
        )
        counts = Counts.of(report)  # (no recipe: no gate; not on Actions: no annotations)
        shown.append(verdict.render(flags.get("format", "text"), report, counts))
        if counts.errors:
            raise verdict.incompatible(report, counts.errors, patched=False, model="")
        return verdict.figure(counts, report.calls_checked, report.calls_unchecked)

    failed = verdict.staged(log, atom_rev, aiter_rev, work)
    return failed, shown[0]


def _release(held: _Held, log: Logger) -> None:
    """Print what was held back; the logger prints to stderr from now on."""
    sys.stderr.write("".join(held.parts))
    sys.stderr.flush()
    log.stream = sys.stderr


def _utf8(stream: object) -> bool:
    try:
        return codecs.lookup(getattr(stream, "encoding", None) or "ascii").name == "utf-8"
    except LookupError:
        return False


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
