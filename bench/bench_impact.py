"""Benchmark: `pipeline impact` on a warm cache, and `patch draft`, on the seed pair (issue 31).

On the real mirrors (ATOM_MIRROR, AITER_MIRROR): aiter 08f04b889a^..08f04b889a against ATOM
ab9eb781 for MiniMax-M3-MXFP4, the break that shipped. Target (issue 31): a pull request of a
few commits over a warm cache answers in about a second (the whole command, start-up included).
The draft has no target of its own in the issue: it is printed against the same interactive
second. A private cache directory (cold first, then warm) and a shared clone of the ATOM mirror
(the draft writes the drafted tree's objects there) keep the mirrors as they are.

    python bench/bench_impact.py [--runs N] [--base REF] [--head REF] [--atom REF]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 1.0
MODEL = "MiniMax-M3-MXFP4"

DRAFT = r"""
import json, sys, time
from datetime import UTC, datetime
from pathlib import Path
from pipeline.compat import run_check
from pipeline.gitw import GitRepo
from pipeline.patchq.draft import draft_fixes
atom, aiter, a, b, cache = sys.argv[1:6]
atom, aiter = GitRepo(Path(atom)), GitRepo(Path(aiter))
r = run_check(atom, a, aiter, b, cache_dir=Path(cache))
t = time.perf_counter()
d = draft_fixes(atom, r.atom_sha, aiter, r.aiter_sha, r.findings, range_start=r.atom_sha,
                command="bench", date=datetime.now(UTC), cache_dir=Path(cache))
s = time.perf_counter() - t
print(json.dumps({"s": s, "drafts": len(d.drafts), "sites": sum(len(x.sites) for x in d.drafts)}))
"""


CPU: list[float] = []  # CPU time (user + system) of each timed command: less load-sensitive than wall


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return time.perf_counter() - t, res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--base", default="08f04b889a^")
    ap.add_argument("--head", default="08f04b889a")
    ap.add_argument("--atom", default="ab9eb781")
    a = ap.parse_args()
    atom, aiter = os.environ.get("ATOM_MIRROR", ""), os.environ.get("AITER_MIRROR", "")
    if not (atom and aiter and Path(atom).is_dir() and Path(aiter).is_dir()):
        print(f"no mirrors at {atom} / {aiter}: set ATOM_MIRROR and AITER_MIRROR")
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-impact-") as tmp:
        cache = Path(tmp) / "cache"
        clone = Path(tmp) / "atom.git"
        subprocess.run(["git", "clone", "-q", "--bare", "--shared", atom, str(clone)], check=True)
        env = dict(os.environ, PYTHONPATH=str(ROOT), PIPELINE_CACHE_DIR=str(cache))
        impact = [
            sys.executable, "-m", "pipeline", "impact", "--aiter-base", a.base, "--aiter-head", a.head,
            "--atom", a.atom, "--model", MODEL, "--atom-repo", str(clone), "--aiter-repo", aiter,
            "--format", "json",
        ]  # fmt: skip
        cold, res = timed(impact, env)
        if res.returncode not in (0, 4):
            print(res.stderr)
            return 1
        report = json.loads(res.stdout)
        warm = []
        CPU.clear()
        for _ in range(a.runs):
            s, res = timed(impact, env)
            warm.append(s)
        warm_cpu = statistics.median(CPU)
        sites = [f"{s['path']}:{s['line']}" for f in report["functions"] for s in f["sites"]]
        defs = [f"{f['definition']['path']}:{f['definition']['line']}" for f in report["functions"]]
        print(f"impact aiter {a.base}..{a.head} × ATOM {a.atom} ({MODEL}):")
        print(f"    {', '.join(sites)} in {', '.join(defs)}")
        w = statistics.median(warm)
        print(f"impact, cold cache (whole command): {cold:.3f} s")
        print(f"impact, warm cache (whole command): {w:.3f} s (median of {a.runs}), target {TARGET_S} s, "
              f"ratio {w / TARGET_S:.2f}")  # fmt: skip
        print(f"impact, warm cache, CPU time (ours + git's, less load-sensitive): {warm_cpu:.3f} s, "
              f"ratio {warm_cpu / TARGET_S:.2f}")  # fmt: skip
        drafts = []
        for _ in range(a.runs):
            out = subprocess.run(
                [sys.executable, "-c", DRAFT, str(clone), aiter, a.atom, a.head, str(cache)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            got = json.loads(out.stdout)
            drafts.append(got["s"])
        d = statistics.median(drafts)
        what = f"{got['drafts']} draft(s), {got['sites']} call(s) rewritten, check report cached"
        print(f"draft ({what}): {d:.3f} s (median of {a.runs}),")
        print(f"    against {TARGET_S} s (the issue names no draft target), ratio {d / TARGET_S:.2f}")
        draft_cmd = [
            sys.executable, "-m", "pipeline", "patch", "draft", "--atom", a.atom, "--aiter", a.head,
            "--atom-repo", str(clone), "--aiter-repo", aiter, "--model", MODEL, "--dry-run",
            "--patches-dir", str(Path(tmp) / "patches"),
        ]  # fmt: skip
        first, res = timed(draft_cmd, env)
        again, _ = timed(draft_cmd, env)
        if res.returncode != 0:
            print(res.stderr)
            return 1
        print("`patch draft --dry-run` (whole command, with the check of the drafted tree):")
        print(f"    first {first:.3f} s, again {again:.3f} s")
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
