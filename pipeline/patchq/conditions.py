"""When is a patch needed? Its ATOM range and its aiter conditions.

Everything is read from git objects at the locked commits (no checkout):
ancestry with `merge-base --is-ancestor`, aiter's function signatures by
finding `def F(` in `aiter/**/*.py` at the aiter commit and reading its
parameters with `ast`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from pipeline.errors import PatchError
from pipeline.gitw import GitRepo
from pipeline.patchq.model import AITER_AFTER, RANGE, Patch, Requirement

AITER_SOURCES = "aiter/*.py"  # git pathspec: `*` also matches `/`


@dataclass(frozen=True)
class Need:
    needed: bool
    reason: str


def _resolve(repo: GitRepo, rev: str, patch: Patch, field_name: str, what: str) -> str:
    sha = repo.rev_parse(rev)
    if sha is None:
        raise PatchError(
            f"{patch.name}: {field_name} names {what} commit {rev}, which is not in {repo.path}.",
            hint=f"Fetch the {what} mirror (`pipeline pin`) or fix the {field_name} field of the patch.",
        )
    return sha


def atom_in_range(patch: Patch, atom: GitRepo, atom_sha: str) -> Need:
    rng = patch.atom_range
    start = _resolve(atom, rng.start, patch, RANGE, "ATOM")
    short = atom_sha[:9]
    if not atom.is_ancestor(start, atom_sha):
        return Need(False, f"ATOM {short} does not contain {rng.start}, the start of its range {rng}")
    if rng.end is not None:
        end = _resolve(atom, rng.end, patch, RANGE, "ATOM")
        if atom.is_ancestor(end, atom_sha):
            return Need(False, f"ATOM {short} is past its range {rng} (contains {rng.end})")
    return Need(True, f"ATOM {short} is in its range {rng}")


@dataclass(frozen=True)
class FunctionDef:
    path: str
    line: int
    params: tuple[str, ...]


def find_function(aiter: GitRepo, aiter_sha: str, name: str) -> list[FunctionDef]:
    """Module-level `def name(...)` in aiter's Python sources at `aiter_sha`."""
    res = aiter.run("grep", "-l", "-F", "-e", f"def {name}(", aiter_sha, "--", AITER_SOURCES)
    if res.status == 1 and not res.stderr.strip():
        return []
    if not res.ok:
        raise PatchError(f"cannot search aiter {aiter_sha[:10]} for `def {name}(`: {res.stderr.strip()}")
    found: list[FunctionDef] = []
    for line in res.stdout.splitlines():
        # `git grep -l <tree>` prints `<tree>:<path>`
        path = line.split(":", 1)[1] if line.startswith(f"{aiter_sha}:") else line
        blob = aiter.read_blob(aiter_sha, path)
        if blob is None:
            continue
        try:
            tree = ast.parse(blob, filename=path)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                a = node.args
                params = tuple(x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs))
                found.append(FunctionDef(path, node.lineno, params))
    return found


def aiter_conditions(patch: Patch, aiter: GitRepo, aiter_sha: str) -> Need:
    short = aiter_sha[:10]
    reasons: list[str] = []
    after = patch.aiter_after
    if after is not None:
        sha = _resolve(aiter, after, patch, AITER_AFTER, "aiter")
        if not aiter.is_ancestor(sha, aiter_sha):
            return Need(False, f"aiter {short} does not contain {after} ({AITER_AFTER})")
        reasons.append(f"aiter {short} contains {after}")
    for req in patch.aiter_requires:
        ok, why = requirement_holds(req, aiter, aiter_sha)
        if not ok:
            return Need(False, why)
        reasons.append(why)
    return Need(True, "; ".join(reasons) if reasons else "no aiter condition")


def requirement_holds(req: Requirement, aiter: GitRepo, aiter_sha: str) -> tuple[bool, str]:
    short = aiter_sha[:10]
    defs = find_function(aiter, aiter_sha, req.function)
    if not defs:
        return False, f"aiter {short} has no function {req.function}"
    with_param = [d for d in defs if req.param in d.params]
    where = ", ".join(f"{d.path}:{d.line}" for d in (with_param or defs))
    has = bool(with_param)
    holds = has if req.verb == "has" else not has
    verb = "has" if has else "lacks"
    return holds, f"aiter {short}: {req.function} {verb} {req.param} ({where})"
