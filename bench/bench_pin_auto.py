"""Benchmark: `pipeline pin --auto`'s search over aiter's whole history, beside a real peer.

For ATOM ab9eb781 against the aiter mirror's head: the newest compatible aiter, found by
`search_compatible` in a fresh process with an empty cache dir (what `pin --auto` runs), on the
real mirrors when present (else the fixture repositories, and no peer). Figures: wall time, CPU
time with git and the scan workers, peak memory summed over the process tree.

Target (issue 12 §5): ≤ 5 s cold (13.7 s measured before the issue). Peer, in the same run:
willitbreak (PyPI) on the same ATOM tree from the aiter it was written against to the aiter
head, fed by `git archive` (it answers one pair, not "which aiter").

    python bench/bench_pin_auto.py [--atom REF] [--aiter-head REF] [--no-peers]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import (  # (run as a script from anywhere: bench/ is on the path)
    AITER_MIRROR,
    ATOM_MIRROR,
    ROOT,
    bytecode_env,
    have_mirrors,
    measure,
    scratch,
    willitbreak,
)

TARGET_S = 5.0

CHILD = r"""
import json, sys
from pathlib import Path
from pipeline.gitw import GitRepo
from pipeline.compat import search_compatible
atom, aiter, atom_rev, head, cache = sys.argv[1:6]
r = search_compatible(GitRepo(atom), atom_rev, GitRepo(aiter), head, cache_dir=Path(cache))
print(json.dumps({
    "examined": r.commits_examined,
    "newest": r.newest_compatible.sha if r.newest_compatible else None,
    "first_breaking": r.first_breaking.sha if r.first_breaking else None,
    "explanation": r.explanation,
    "atom": r.report_at_head.atom_sha,
    "head": r.report_at_head.aiter_sha,
    "baseline": r.report_at_head.baseline_aiter_sha,
}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--atom", default="ab9eb781")
    ap.add_argument("--aiter-head", default="HEAD")
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()
    atom, aiter, atom_rev, head, real = ATOM_MIRROR, AITER_MIRROR, args.atom, args.aiter_head, True
    if not have_mirrors():
        sys.path.insert(0, str(ROOT))
        from tests.fixtures.compat_repos import build_compat_repos

        fx = build_compat_repos(scratch("bench-pin-") / "fx")
        atom, aiter, atom_rev, head, real = str(fx.atom), str(fx.aiter), fx.t["T1"], fx.a["A4"], False
    tmp = scratch("bench-pin-")
    env = bytecode_env(tmp)
    measure([sys.executable, "-c", "import pipeline.compat"], env)  # compile the bytecode first
    run = measure([sys.executable, "-c", CHILD, atom, aiter, atom_rev, head, str(tmp / "cache")], env)
    if run.code != 0:
        sys.exit(f"the search failed (exit {run.code}):\n{run.stderr}")
    r = json.loads(run.stdout.strip().splitlines()[-1])
    where = "the real mirrors" if real else "fixtures"
    print(f"pin --auto search: ATOM {atom_rev} × aiter history up to {head} on {where}")
    print(f"answer: {r['explanation']}")
    print(f"aiter commits examined: {r['examined']}")
    verdict = "OK" if run.wall_s <= TARGET_S else "OVER"
    print(
        f"cold: {run.wall_s:.2f} s wall (CPU incl. git and workers {run.cpu_s:.2f} s)  "
        f"target ≤ {TARGET_S:.0f} s -> {verdict} ({run.wall_s / TARGET_S:.2f}× target); "
        f"peak memory, process tree summed {run.peak_mb:.0f} MB"
    )
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPU(s)")
    if args.no_peers or not real:
        return
    base = r["baseline"] or r["head"]
    wib = willitbreak(r["atom"], base, r["head"], tmp / "peer")
    if wib.wall_s is None:
        print(f"peer willitbreak: {wib.note}")
        return
    print(
        f"peer willitbreak, one pair only (aiter {base[:10]} -> head {r['head'][:10]}): "
        f"{wib.wall_s:.2f} s wall "
        f"({wib.note}), {len(wib.sites)} call site(s) reported; our whole search took "
        f"{run.wall_s / wib.wall_s:.2f}× its time for one pair"
    )
    for path, line in wib.sites[:10]:
        print(f"  it reports {path}:{line}")


if __name__ == "__main__":
    main()
