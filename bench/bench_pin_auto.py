"""Benchmark: `pipeline pin --auto` search (search_compatible) over the whole aiter history.

For ATOM ab9eb781 against the aiter mirror's head, cold (empty cache dir), in a
fresh process, on the real mirrors when present (else the fixture repos).
Target (the issue): ≤ 15 s cold.

    python bench/bench_pin_auto.py [--atom REF] [--aiter-head REF]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 15.0

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from pipeline.gitw import GitRepo
from pipeline.compat import search_compatible
atom, aiter, atom_rev, head, cache = sys.argv[1:6]
t0 = time.perf_counter(); c0 = time.process_time()
r = search_compatible(GitRepo(atom), atom_rev, GitRepo(aiter), head, cache_dir=Path(cache))
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({
    "wall_s": time.perf_counter() - t0,
    "cpu_s": time.process_time() - c0 + ch.ru_utime + ch.ru_stime,
    "rss_mb": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, ch.ru_maxrss) / 1024,
    "examined": r.commits_examined,
    "newest": r.newest_compatible.sha if r.newest_compatible else None,
    "first_breaking": r.first_breaking.sha if r.first_breaking else None,
    "explanation": r.explanation,
}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--atom", default="ab9eb781")
    ap.add_argument("--aiter-head", default="HEAD")
    args = ap.parse_args()
    atom = os.environ.get("ATOM_MIRROR", "/work/.mirror/ROCm+ATOM/repo")
    aiter = os.environ.get("AITER_MIRROR", "/work/.mirror/ROCm+aiter/repo")
    atom_rev, head, what = args.atom, args.aiter_head, "real mirrors"
    if not (Path(atom).exists() and Path(aiter).exists()):
        sys.path.insert(0, str(ROOT))
        from tests.fixtures.compat_repos import build_compat_repos

        fx = build_compat_repos(Path(tempfile.mkdtemp(prefix="bench-pin-")) / "fx")
        atom, aiter, atom_rev, head, what = str(fx.atom), str(fx.aiter), fx.t["T1"], fx.a["A4"], "fixtures"
    with tempfile.TemporaryDirectory(prefix="bench-pin-cache-") as d:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, atom, aiter, atom_rev, head, d],
            env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True, capture_output=True, text=True,
        )  # fmt: skip
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"pin --auto search: ATOM {atom_rev} × aiter history up to {head} on {what}")
    print(f"answer: {r['explanation']}")
    print(f"aiter commits examined: {r['examined']}")
    verdict = "OK" if r["wall_s"] <= TARGET_S else "OVER"
    print(
        f"cold: {r['wall_s']:.2f} s wall (CPU incl. git and workers {r['cpu_s']:.2f} s)  "
        f"target ≤ {TARGET_S:.0f} s -> {verdict} ({r['wall_s'] / TARGET_S:.2f}× target); "
        f"peak RSS {r['rss_mb']:.0f} MB"
    )
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPU(s)")


if __name__ == "__main__":
    main()
