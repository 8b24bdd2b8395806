"""The versioned ATOM patch series (quilt `series` + DEP-3 headers, as `gbp pq`).

Public API for the rest of the pipeline:

- `PatchSeries.load(dir) -> PatchSeries` (strict parse; `PatchError` names file and line)
- `check_series(series, atom, atom_sha, aiter, aiter_sha) -> list[PatchCheck]`
  (status: applies | not-needed | already-upstream | conflict)
- `apply_series(series, atom, atom_sha, aiter, aiter_sha, *, workdir) -> AppliedSeries`
  (head_sha, pins for `lock.with_patches`, notes, worktree, branch)
- `patched_commit(...) -> AppliedSeries`: the same commit, no work tree, no branch (the patch stage)
- `import_series`, `export_series`, `new_patch`: the patch-queue round trip.
"""

from pipeline.patchq.apply import (
    AppliedSeries,
    PatchCheck,
    apply_series,
    branch_name,
    check_series,
    patched_commit,
    pins_for,
)
from pipeline.patchq.conditions import find_function
from pipeline.patchq.model import AtomRange, FileDiff, Hunk, Patch, PatchSeries, Requirement, series_digest
from pipeline.patchq.pq import export_series, import_series, new_patch

__all__ = [
    "AppliedSeries",
    "AtomRange",
    "FileDiff",
    "Hunk",
    "Patch",
    "PatchCheck",
    "PatchSeries",
    "Requirement",
    "apply_series",
    "branch_name",
    "check_series",
    "export_series",
    "find_function",
    "import_series",
    "new_patch",
    "patched_commit",
    "pins_for",
    "series_digest",
]
