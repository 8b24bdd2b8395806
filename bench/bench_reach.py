"""Benchmark: a model's reachability (static import closure) at one ATOM commit.

Each measurement runs in a fresh Python process: cold = empty cache dir, warm = the
cache the cold run left (results are cached by tree SHA). On the real ATOM mirror
(ATOM_MIRROR), else a fixture repository.

Target (issue 18): ≤ 0.3 s cold. Named peer, measured in the same run: `ast.parse` of
every ATOM Python file of the same tree (the least an AST-based import graph costs).

    python bench/bench_reach.py [--atom REF] [--arch CLASS] [--runs N]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_COLD_S = 0.3

CHILD = r"""
import json, sys, time
from pathlib import Path
from pipeline.gitw import GitRepo
from pipeline.compat.pysource import SummaryCache
from pipeline.compat.reach import SUMMARY_SCHEMA, ModelFacts, compute_reach
atom, rev, arch, cache = sys.argv[1:5]
import resource
repo = GitRepo(atom)
t, c = time.perf_counter(), time.process_time()
ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
r = compute_reach(repo, rev, ModelFacts(arch), cache_dir=Path(cache))
s = time.perf_counter() - t
ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
git_cpu = (ch1.ru_utime + ch1.ru_stime) - (ch0.ru_utime + ch0.ru_stime)
cpu = time.process_time() - c + git_cpu
# How far each file was read: "{blob}:{path}" summarized with its blocks, "...:refs" references only.
kinds = list(SummaryCache.open(f"reach-files-v{SUMMARY_SCHEMA}", Path(cache)).data)
refs = sum(k.endswith(":refs") for k in kinds)
print(json.dumps({"s": s, "cpu": cpu, "files": len(r.parents), "full": len(kinds) - refs, "refs": refs}))
"""

PEER = r"""
import ast, json, sys, time, warnings
from pipeline.gitw import GitRepo
atom, rev = sys.argv[1:3]
repo = GitRepo(atom)
t = time.perf_counter()
blobs = repo.blob_shas(rev, prefix="atom", suffix=".py")
data = repo.cat_blobs(sorted(set(blobs.values())))
warnings.simplefilter("ignore")
for path, sha in blobs.items():
    try:
        ast.parse(data[sha])
    except SyntaxError:
        pass
print(json.dumps({"s": time.perf_counter() - t, "files": len(blobs)}))
"""


def child(code: str, *args: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True
    )
    got: dict[str, float] = json.loads(out.stdout)
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--atom", default="HEAD")
    ap.add_argument("--arch", default="MiniMaxM3SparseForCausalLM")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    mirror = os.environ.get("ATOM_MIRROR", "")
    if not (mirror and Path(mirror).is_dir()):
        sys.path.insert(0, str(ROOT))  # the fixtures live in the repository's tests/
        from tests.fixtures.reach_repos import build_reach_repos

        fx_root = tempfile.mkdtemp(prefix="bench-reach-")
        atexit.register(shutil.rmtree, fx_root, ignore_errors=True)
        fx = build_reach_repos(Path(fx_root))
        mirror, a.atom, a.arch = str(fx.atom), fx.atom_sha, "AlphaForCausalLM"
        print(f"(no real mirror: fixture repository {mirror})")
    load0 = os.getloadavg()[0]
    cold, cold_cpu, warm, peer = [], [], [], []
    first: dict[str, float] = {}
    for _ in range(a.runs):
        with tempfile.TemporaryDirectory() as cache:
            got = child(CHILD, mirror, a.atom, a.arch, cache)
            first = first or got
            cold.append(got["s"])
            cold_cpu.append(got["cpu"])
            warm.append(child(CHILD, mirror, a.atom, a.arch, cache)["s"])
        peer.append(child(PEER, mirror, a.atom)["s"])
    c, w, p = statistics.median(cold), statistics.median(warm), statistics.median(peer)
    print(f"reach {a.arch} @ {a.atom} in {mirror}: {int(got['files'])} files on the path")
    print(
        f"cold: {int(first['full'])} files summarized with their blocks, {int(first['refs'])} read for "
        "their references only (the evidence of who imports a file off the path)"
    )
    print(f"cold: {c:.3f} s (median of {a.runs}), target {TARGET_COLD_S} s, ratio {c / TARGET_COLD_S:.2f}")
    cpu = statistics.median(cold_cpu)
    print(f"cold CPU time (ours + git's): {cpu:.3f} s, ratio {cpu / TARGET_COLD_S:.2f} (less load-sensitive)")
    print(f"warm: {w:.3f} s (cached by tree SHA)")
    print(f"peer: ast.parse of every ATOM file: {p:.3f} s; cold reach / peer = {c / p:.2f}")
    print(f"load average: {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end, on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
