"""Benchmark: `pipeline recipe drift` over every recipe in recipes/ up to an ATOM commit.

In a fresh Python process, on the real ATOM mirror (ATOM_MIRROR). Target (issue 18): ≤ 2 s for
all recipes. Named peer, measured in the same run: `git log -p` of the same recipe sources over
the same range (reading the history without understanding it).

    python bench/bench_drift.py [--atom REF] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 2.0

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from pipeline.gitw import GitRepo
from pipeline.recipes.drift import drift_all
atom, rev, recipes = sys.argv[1:4]
t, c = time.perf_counter(), time.process_time()
d = drift_all(GitRepo(atom), Path(recipes), rev)
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = time.process_time() - c + ch.ru_utime + ch.ru_stime
changed = sum(x.changed for x in d)
print(json.dumps({"s": time.perf_counter() - t, "cpu": cpu, "recipes": len(d), "changed": changed}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--atom", default="HEAD")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    mirror = os.environ.get("ATOM_MIRROR", "")
    if not (mirror and Path(mirror).is_dir()):
        print(f"no ATOM mirror at {mirror}: set ATOM_MIRROR")
        return 2
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    sys.path.insert(0, str(ROOT))
    from pipeline.recipes.recipe import load_recipe
    from pipeline.recipes.upstream import source_of

    sources = [source_of(load_recipe(p).source) for p in sorted((ROOT / "recipes").glob("*.yaml"))]
    times, cpus, peer = [], [], []
    for _ in range(a.runs):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, mirror, a.atom, str(ROOT / "recipes")],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        got = json.loads(out.stdout)
        times.append(got["s"])
        cpus.append(got["cpu"])
        t = time.perf_counter()
        for src in sources:
            if src:
                subprocess.run(
                    ["git", f"--git-dir={mirror}", "log", "-p", f"{src[1]}..{a.atom}", "--", src[0]],
                    capture_output=True,
                    check=True,
                )
        peer.append(time.perf_counter() - t)
    s, p = statistics.median(times), statistics.median(peer)
    print(f"recipe drift over {got['recipes']} recipes to {a.atom}: {got['changed']} with upstream drift")
    print(f"drift: {s:.3f} s (median of {a.runs}), target {TARGET_S} s, ratio {s / TARGET_S:.2f}")
    cpu = statistics.median(cpus)
    print(f"drift CPU time (ours + git's): {cpu:.3f} s, ratio {cpu / TARGET_S:.2f} (less load-sensitive)")
    print(f"peer: git log -p of the same sources and ranges: {p:.3f} s; drift / peer = {s / p:.2f}")
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
