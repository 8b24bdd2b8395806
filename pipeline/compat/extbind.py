"""The names aiter's compiled extension defines, read from its C++ sources at the same commit.

Older aiter packages star-import their prebuilt extension inside a guard
(`if find_spec("aiter_"): from aiter_ import *`). A name the Python sources lack
may then come from there, or may simply have been renamed or removed. The
extension's bindings are plain text in `csrc/`: `m.def("name", ...)` (often
inside the `*_PYBIND` macros of `csrc/include/rocm_ops.hpp`) and
`py::class_<T>(m, "Name")` / `py::enum_<T>(m, "Name")`. Their union is every
name any prebuilt module can bind (the prebuild links all of them into one).

One `git grep` per distinct `csrc` tree, cached by that tree's SHA.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.compat.pysource import SummaryCache
    from pipeline.gitw import GitRepo

SOURCES = "csrc"
_PATTERN = r'(m\.def|\bdef)\(\s*"[A-Za-z_]\w*"|py::(class_|enum_)<[^>]*>\(\s*m\s*,\s*"[A-Za-z_]\w*"'
_NAME_RE = re.compile(r'"([A-Za-z_][A-Za-z0-9_]*)"')


def is_extension_module(module: str) -> bool:
    """aiter's prebuilt modules: `aiter_`, `hipbsolidxgemm_`, `module_norm`, ... (never a Python file)."""
    top = module.split(".")[0]
    return top.endswith("_") or top.startswith("module_")


def extension_names(repo: GitRepo, commit: str, cache: SummaryCache) -> frozenset[str] | None:
    """Every name the compiled extension binds at `commit`; None when there are no C++ sources."""
    tree = repo.run("rev-parse", "--verify", "-q", f"{commit}:{SOURCES}")
    if not tree.ok or not tree.stdout.strip():
        return None
    key = f"ext-names:{tree.stdout.strip()}"
    got: frozenset[str] | None = cache.data.get(key)
    if got is not None:
        return got
    res = repo.run("grep", "-h", "-o", "-E", _PATTERN, commit, "--", SOURCES)
    names = frozenset(m.group(1) for line in res.stdout.splitlines() if (m := _NAME_RE.search(line)))
    cache.data[key] = names
    cache.dirty = True
    return names
