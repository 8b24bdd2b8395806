"""Housekeeping: what `pipeline gc` removes, and why it is safe to remove.

- **runs** older than N days (`runs_dir/*`), except a run another process
  holds (its `.run.lock`).
- **orphaned locks**: `mirrors/<name>.git.lock` with no mirror beside it,
  temp dirs of clones that were killed (`.<name>.git.*`), guard files of lock
  files (`locks/.<model>.toml.lock`) — each only when nobody holds it.
- **pins no lock names**: `refs/pins/<sha>` in a mirror (they keep pinned
  commits alive through upstream force-pushes) whose SHA no lock file in
  `locks_dir` and no kept run's `lock.toml` mentions. If any of those lock
  files cannot be read, no pin is removed.

Everything is listed first; `dry_run` removes nothing.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.config import Settings
from pipeline.errors import PipelineError, RunLocked
from pipeline.fsutil import acquire_lock, hold_lock, remove_held_lock
from pipeline.gitw import GitRepo
from pipeline.lock import Lock
from pipeline.log import Logger
from pipeline.sources.mirrors import LOCK_SUFFIX, PIN_REF_PREFIX, lock_path

Kind = Literal["run", "lock", "tmp", "pin"]
DAY = 86400.0


@dataclass(frozen=True)
class Item:
    kind: Kind
    path: Path  # the run, lock file or temp dir; for a pin, its mirror
    detail: str  # why it goes (age, "no mirror", the pinned SHA)
    ref: str = ""  # pins only: refs/pins/<sha>

    def line(self) -> str:
        what = self.ref if self.kind == "pin" else str(self.path)
        where = f" in {self.path.name}" if self.kind == "pin" else ""
        return f"{self.kind:<4} {what}{where} ({self.detail})"


@dataclass
class Plan:
    items: list[Item] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # what was left alone, and why

    def count(self, kind: Kind) -> int:
        return sum(1 for i in self.items if i.kind == kind)


def _free(lock_file: Path) -> bool:
    """True when nobody holds `lock_file` (checked by taking it for an instant)."""
    try:
        lock = acquire_lock(lock_file, wait=0, busy="held", hint="")
    except RunLocked:
        return False
    lock.release()
    return True


def _age_days(path: Path, now: float) -> float:
    """Days since anything at the top of `path` last changed."""
    try:
        mtimes = [path.stat().st_mtime] + [p.stat().st_mtime for p in path.iterdir()]
    except OSError:
        return 0.0
    return (now - max(mtimes)) / DAY


def _runs(settings: Settings, now: float) -> list[tuple[Path, float]]:
    """(run directory, age in days), newest first."""
    runs_dir = Path(settings.paths.runs_dir)
    if not runs_dir.is_dir():
        return []
    runs = [(p, _age_days(p, now)) for p in sorted(runs_dir.iterdir()) if p.is_dir()]
    return sorted(runs, key=lambda r: r[1])


def _held(run: Path) -> bool:
    return (run / ".run.lock").exists() and not _free(run / ".run.lock")


def plan(
    settings: Settings, *, older_than_days: float, keep_newest: int | None = None, now: float | None = None
) -> Plan:
    """What gc removes: runs older than `older_than_days` or beyond the newest `keep_newest`
    (None or 0: no count limit), locks and temp dirs nobody holds, pins no lock names."""
    now = time.time() if now is None else now
    out = Plan()
    kept_runs: list[Path] = []
    for n, (run, age) in enumerate(_runs(settings, now)):
        beyond = bool(keep_newest) and n >= int(keep_newest or 0)
        if age < older_than_days and not beyond:
            kept_runs.append(run)
        elif _held(run):
            kept_runs.append(run)
            out.kept.append(f"{run}: another process is driving it")
        else:
            why = f"{age:.0f} days old" if age >= older_than_days else f"beyond the newest {keep_newest}"
            out.items.append(Item("run", run, why))

    mirrors = settings.mirrors_dir
    if mirrors.is_dir():
        for f in sorted(mirrors.glob(f"*{LOCK_SUFFIX}")):
            mirror = f.with_name(f.name.removesuffix(LOCK_SUFFIX))
            if not mirror.exists() and _free(f):
                out.items.append(Item("lock", f, "no mirror"))
        for tmp in sorted(p for p in mirrors.glob(".*.git.*.tmp") if p.is_dir()):
            name = tmp.name[1:].split(".git.", 1)[0] + ".git"
            if _free(lock_path(mirrors / name)):
                out.items.append(Item("tmp", tmp, "left by an interrupted clone"))
    locks_dir = Path(settings.paths.locks_dir)
    if locks_dir.is_dir():
        for f in sorted(locks_dir.glob(".*.toml.lock")):
            if _free(f):
                out.items.append(Item("lock", f, "left by an interrupted pin"))

    named, unreadable = _named_shas(locks_dir, kept_runs)
    if unreadable:
        out.kept.append(
            f"every refs/pins/*: cannot read {unreadable[0]} ({len(unreadable)} unreadable lock file(s))"
        )
    elif mirrors.is_dir():
        for mirror in sorted(p for p in mirrors.glob("*.git") if p.is_dir()):
            try:
                repo = GitRepo(mirror)
                refs = repo.git("for-each-ref", "--format=%(refname)", PIN_REF_PREFIX.rstrip("/")).split()
            except PipelineError as e:
                out.kept.append(f"{mirror}: {e.message}")
                continue
            for ref in refs:
                sha = ref.removeprefix(PIN_REF_PREFIX)
                if sha not in named:
                    out.items.append(Item("pin", mirror, f"no lock names {sha[:12]}", ref=ref))
    return out


def _named_shas(locks_dir: Path, runs: list[Path]) -> tuple[set[str], list[Path]]:
    files = sorted(locks_dir.glob("*.toml")) if locks_dir.is_dir() else []
    files += [r / "lock.toml" for r in runs if (r / "lock.toml").is_file()]
    named: set[str] = set()
    unreadable: list[Path] = []
    for f in files:
        try:
            lock = Lock.load(f)
        except PipelineError:
            unreadable.append(f)
            continue
        named |= {lock.atom.sha, lock.aiter.sha, *(s.sha for s in lock.aiter.submodules)}
    return named, unreadable


def execute(p: Plan, settings: Settings, log: Logger) -> int:
    """Remove what `p` lists (re-checking each lock at the moment of removal); returns how many."""
    removed = 0
    for item in p.items:
        try:
            if item.kind == "run":
                shutil.rmtree(item.path)
            elif item.kind == "lock":
                lock = acquire_lock(item.path, wait=0, busy="held", hint="")
                remove_held_lock(lock)
                lock.release()
            elif item.kind == "tmp":
                name = item.path.name[1:].split(".git.", 1)[0] + ".git"
                with hold_lock(lock_path(item.path.parent / name), wait=0, busy="a fetch holds it", hint=""):
                    shutil.rmtree(item.path)
            else:
                with hold_lock(lock_path(item.path), wait=0, busy="a fetch holds it", hint=""):
                    GitRepo(item.path).git("update-ref", "-d", item.ref)
        except (RunLocked, OSError, PipelineError) as e:
            log.warn(f"kept {item.path}{' ' + item.ref if item.ref else ''}: {e}")
            continue
        removed += 1
    return removed


def prune_runs(settings: Settings, log: Logger, *, now: float | None = None) -> int:
    """The default retention, run by every command that opens a run directory: run directories
    beyond the newest `[paths] keep_runs` go (0: none); a run another process drives stays."""
    keep = settings.paths.keep_runs
    if keep <= 0:
        return 0
    removed = 0
    for run, _ in _runs(settings, time.time() if now is None else now)[keep:]:
        if _held(run):
            continue
        try:
            shutil.rmtree(run)
        except OSError as e:
            log.warn(f"kept {run}: {e}")
            continue
        removed += 1
    if removed:
        log.info(
            f"removed {removed} old run director{'y' if removed == 1 else 'ies'} in "
            f"{settings.paths.runs_dir}: the newest {keep} are kept ([paths] keep_runs; `pipeline gc` "
            "for the rest)"
        )
    return removed
