"""The smoke run directory: writable, with room, and holding no earlier run's results.

Checked before a warm-up that can take 45 minutes: a run that cannot write its verdict
must not start a server. An earlier run's verdict, reports and logs are moved aside into
``earlier/<n>/`` so that a stale pass can never be read as this run's, and ``server.log``
holds one run only. ``pipeline.log`` (the whole command's log, already open) stays.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pipeline.errors import DiskError, disk_error

MIN_FREE_BYTES = 32 << 20  # server.log, tool outputs and reports of one run, with a margin
_KEEP = {"pipeline.log", "earlier"}


def _results(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.iterdir() if p.name not in _KEEP and not p.name.startswith(".pipeline"))


def prepare_run_dir(run_dir: Path, *, min_free: int = MIN_FREE_BYTES) -> Path | None:
    """Make `run_dir` ready for a smoke run; where an earlier run's files went (None: there were none).

    DiskError (exit 14) when it cannot be written or has less than `min_free` bytes free.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".pipeline-write-test-{os.getpid()}"
        probe.write_bytes(b"x" * 4096)
        probe.unlink()
        free = shutil.disk_usage(run_dir).free
    except OSError as e:
        err = disk_error(e, "write to") or DiskError(f"cannot use the run directory {run_dir}: {e}.")
        raise err from None
    if free < min_free:
        raise DiskError(
            f"the run directory {run_dir} has {free // 1024} KiB free; a smoke run needs at least "
            f"{min_free >> 20} MiB for the server log, the tools' outputs and the verdict. "
            "Nothing was started.",
            hint="Free space there, or pass --run-dir on a file system with room.",
        )
    earlier = _results(run_dir)
    if not earlier:
        return None
    n = 1
    while (run_dir / "earlier" / str(n)).exists():
        n += 1
    aside = run_dir / "earlier" / str(n)
    try:
        aside.mkdir(parents=True)
        for p in earlier:
            p.rename(aside / p.name)
    except OSError as e:
        err = disk_error(e, "move aside") or DiskError(f"cannot move {run_dir}'s earlier files aside: {e}.")
        raise err from None
    return aside
