"""Benchmark: `pipeline check` for one ATOM × aiter pair, whole ATOM tree against all of aiter.

Runs each measurement in a fresh Python process (cold = empty cache dir,
warm = the cache the cold run left), on the real mirrors when present
(/work/.mirror/ROCm+ATOM/repo, /work/.mirror/ROCm+aiter/repo; override with
ATOM_MIRROR/AITER_MIRROR), else on the fixture repositories.

Targets (the issue): ≤ 1.0 s cold, ≤ 0.1 s warm, ≤ 300 MB.
Named baseline (the issue, not re-measured here: it needs torch installed):
mypy --check-untyped-defs with torch installed on the same pair: about 15 s.

    python bench/bench_check.py [--atom REF] [--aiter REF] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MYPY_BASELINE_S = 15.0
TARGET_COLD_S, TARGET_WARM_S, TARGET_MB = 1.0, 0.1, 300.0

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
c0 = time.process_time()
from pathlib import Path
from pipeline.gitw import GitRepo
from pipeline.compat import run_check
t_import = time.perf_counter() - t0
atom, aiter, atom_rev, aiter_rev, cache = sys.argv[1:6]
t1 = time.perf_counter()
c1 = time.process_time()
ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
r = run_check(GitRepo(atom), atom_rev, GitRepo(aiter), aiter_rev, cache_dir=Path(cache))
t2 = time.perf_counter()
ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
children_cpu = (ch1.ru_utime + ch1.ru_stime) - (ch0.ru_utime + ch0.ru_stime)
print(json.dumps({
    "check_s": t2 - t1,
    "import_s": t_import,
    "cpu_s": time.process_time() - c1 + children_cpu,
    "rss_mb": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, ch1.ru_maxrss) / 1024,
    "errors": len(r.errors), "warnings": len(r.warnings),
    "checked": r.calls_checked, "unchecked": r.calls_unchecked,
}))
"""


def run_child(atom: str, aiter: str, atom_rev: str, aiter_rev: str, cache: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, atom, aiter, atom_rev, aiter_rev, str(cache)],
        env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def repos() -> tuple[str, str, str, str, str]:
    atom = os.environ.get("ATOM_MIRROR", "/work/.mirror/ROCm+ATOM/repo")
    aiter = os.environ.get("AITER_MIRROR", "/work/.mirror/ROCm+aiter/repo")
    if Path(atom).exists() and Path(aiter).exists():
        return atom, aiter, "ab9eb781", "08f04b889a", "real mirrors"
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.compat_repos import build_compat_repos

    fx = build_compat_repos(Path(tempfile.mkdtemp(prefix="bench-compat-")) / "fx")
    return str(fx.atom), str(fx.aiter), fx.t["T1"], fx.a["A4"], "fixture repositories (no mirrors here)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--atom")
    ap.add_argument("--aiter")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    atom, aiter, atom_rev, aiter_rev, what = repos()
    atom_rev = args.atom or atom_rev
    aiter_rev = args.aiter or aiter_rev
    print(f"pipeline check: ATOM {atom_rev} × aiter {aiter_rev} on {what}")
    colds, warms = [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench-compat-cache-") as d:
            colds.append(run_child(atom, aiter, atom_rev, aiter_rev, Path(d)))
            warms.append(run_child(atom, aiter, atom_rev, aiter_rev, Path(d)))
    load = os.getloadavg()[0]
    first = colds[0]
    print(
        f"result: {first['errors']:.0f} error(s), {first['warnings']:.0f} warning(s), "
        f"{first['checked']:.0f} calls checked, {first['unchecked']:.0f} unchecked"
    )

    def show(name: str, runs: list[dict[str, float]], target: float) -> None:
        wall = [r["check_s"] for r in runs]
        cpu = [r["cpu_s"] for r in runs]
        best, med = min(wall), statistics.median(wall)
        print(
            f"{name}: best {best:.3f} s, median {med:.3f} s (CPU incl. git and workers {min(cpu):.3f} s; "
            f"interpreter+imports "
            f"{min(r['import_s'] for r in runs):.3f} s extra)  target ≤ {target:.1f} s -> "
            f"{'OK' if best <= target else 'OVER'} ({best / target:.2f}× target); "
            f"vs mypy baseline {MYPY_BASELINE_S:.0f} s: {MYPY_BASELINE_S / best:.0f}× faster"
        )

    show("cold", colds, TARGET_COLD_S)
    show("warm", warms, TARGET_WARM_S)
    rss = max(r["rss_mb"] for r in colds + warms)
    print(f"peak RSS: {rss:.0f} MB  target ≤ {TARGET_MB:.0f} MB -> {'OK' if rss <= TARGET_MB else 'OVER'}")
    print(
        f"named baseline: mypy --check-untyped-defs with torch installed, same pair: about "
        f"{MYPY_BASELINE_S:.0f} s (from the issue; not re-run here)"
    )
    print(f"load average during the runs: {load:.1f} on {os.cpu_count()} CPU(s)")


if __name__ == "__main__":
    main()
