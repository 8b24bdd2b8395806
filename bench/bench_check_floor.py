"""Benchmark: the least CPU a cold `pipeline check` of the seed pair can take, part by part.

Only the work the check cannot skip is timed (CPU time, best of --runs):
- the interpreter and the imports of the check path (serial: nothing runs before them);
- the ATOM scan of the files that can call aiter (and, for scale, a plain `ast.parse`
  of those that import it);
- `ast.parse` of the skeletons of the aiter modules the check resolves through (the module
  list is taken from a real cold check, in this process, with summarizing observed);
- git's reads of aiter's history that "written against" needs (whole first-parent `log --raw`).

It prints the lower bound of the wall time on this machine's cores (the serial part, plus
the rest split perfectly), before a single call is bound, beside the 1.0 s target of issue
12 §5. On the real mirrors only (ATOM_MIRROR / AITER_MIRROR).

    python bench/bench_check_floor.py [--runs N]
"""

from __future__ import annotations

import argparse
import ast
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import (  # (run as a script from anywhere)
    AITER_MIRROR,
    ATOM_MIRROR,
    ROOT,
    bytecode_env,
    have_mirrors,
)

sys.path.insert(0, str(ROOT))
TARGET_COLD_S = 1.0


def cpu(f: Callable[[], object], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        t = time.process_time()
        f()
        best = min(best, time.process_time() - t)
    return best


def child_cpu(cmd: list[str], runs: int, env: dict[str, str] | None = None) -> float:
    best = float("inf")
    for _ in range(runs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    return best


def summarized_modules(atom: object, aiter: object) -> list[bytes]:
    """The aiter module texts a cold check of the seed pair summarizes (serial, so all are seen)."""
    import pipeline.compat.aiterapi as api
    import pipeline.compat.cause as cause
    import pipeline.compat.checker as engine
    from pipeline.compat import run_check

    seen: list[bytes] = []
    real = api.summarize_module

    def observed(data: bytes, path: str, module: str) -> api.ModSummary:
        seen.append(data)
        return real(data, path, module)

    api.summarize_module = observed  # type: ignore[assignment]
    cause.summarize_module = observed  # type: ignore[assignment]
    engine.PARALLEL_MIN_FILES = 10**9
    try:
        with tempfile.TemporaryDirectory() as d:
            run_check(atom, "ab9eb781", aiter, "08f04b889a", cache_dir=Path(d))  # type: ignore[arg-type]
    finally:
        api.summarize_module = real
        cause.summarize_module = real
    return seen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if not have_mirrors():
        sys.exit(f"needs the real mirrors ({ATOM_MIRROR}, {AITER_MIRROR}): set ATOM_MIRROR / AITER_MIRROR")
    warnings.simplefilter("ignore")  # upstream sources' invalid escapes
    from pipeline.compat import calls
    from pipeline.compat.checker import ATOM_PREFIX, Tree
    from pipeline.compat.pysource import strip_bodies
    from pipeline.gitw import GitRepo

    env = bytecode_env(Path(tempfile.mkdtemp(prefix="bench-floor-")))
    imports = "import pipeline.cli, pipeline.commands.check, pipeline.stages.check, pipeline.compat.checker"
    child_cpu([sys.executable, "-c", imports], 1, env)  # compiles the bytecode an installed tool has
    start = child_cpu([sys.executable, "-c", imports], args.runs, env)
    atom, aiter = GitRepo(Path(ATOM_MIRROR)), GitRepo(Path(AITER_MIRROR))
    sha = atom.rev_parse("ab9eb781")
    assert sha is not None
    tree = Tree.load(atom, sha, prefix=ATOM_PREFIX)
    blobs = list(atom.cat_blobs(sorted(set(tree.blobs.values()))).values())
    worth = [d for d in blobs if calls.worth_scanning(d)]
    importing = [
        d
        for d in worth
        if calls.ROOT.encode() in d and (calls._IMPORTS_AITER.search(d) or b"torch.ops.aiter" in d)
    ]
    scan = cpu(lambda: [calls.scan_file(d, "m.py") for d in worth], args.runs)
    full = cpu(lambda: [ast.parse(d) for d in importing], args.runs)
    skeletons = [strip_bodies(d) or d for d in summarized_modules(atom, aiter)]
    skel = cpu(lambda: [ast.parse(s) for s in skeletons], args.runs)
    tip = aiter.rev_parse("HEAD") or ""
    log = child_cpu(
        ["git", f"--git-dir={AITER_MIRROR}", "log", "--format=%x01%H%x00%P%x00%ct%x00%an%x00%s", "--raw",
         "--no-renames", "--no-abbrev", "--first-parent", "-m", tip, "--", "aiter/"],
        args.runs,
    )  # fmt: skip
    cores = os.cpu_count() or 1
    shared = scan + skel + log
    floor = start + shared / cores
    print("pipeline check, ATOM ab9eb781 × aiter 08f04b889a: the CPU no cold check can skip (best of "
          f"{args.runs})")  # fmt: skip
    print(f"  interpreter + imports of the check path (serial)      {start:6.3f} s")
    print(f"  ATOM scan of {len(worth)} files that can call aiter             {scan:6.3f} s"
          f"   (plain ast.parse of the {len(importing)} importing it: {full:.3f} s)")  # fmt: skip
    print(f"  ast.parse of {len(skeletons)} aiter module skeletons                {skel:6.3f} s")
    print(f"  git log --raw of aiter's first-parent history            {log:6.3f} s")
    print(f"lower bound before one call is bound, {cores} core(s) split perfectly: {floor:.3f} s wall; "
          f"target ≤ {TARGET_COLD_S} s -> ratio {floor / TARGET_COLD_S:.2f}")  # fmt: skip
    print(f"load average: {os.getloadavg()[0]:.1f} on {cores} CPU(s)")


if __name__ == "__main__":
    main()
