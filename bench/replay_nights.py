"""Validation on real history: night after night, the check with the last night's cache says
exactly what a cold check says (issue 28 §7; `pipeline.compat.carry`).

Night k of N (oldest first): ATOM `HEAD~(3k)` × aiter's first parent `HEAD~(5k)`, with aiter's
default branch moved there (a bare `--shared` clone), as a scheduled rebuild sees both
repositories move on. Each night's `pipeline check` runs on the cache the night before left;
a cold check (empty cache) of the same pair runs beside it. Printed per night: how many calls
the night carried, its wall time, the cold one's, and whether the two JSON reports are the same.
Exit 1 when any night differs. Needs the mirrors (ATOM_MIRROR, AITER_MIRROR).

    python bench/replay_nights.py [--nights N] [--atom-step 3] [--aiter-step 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import AITER_MIRROR, ATOM_MIRROR, bytecode_env, have_mirrors, measure, scratch


def git(repo: str, *a: str) -> str:
    out = subprocess.run(["git", "--git-dir", repo, *a], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def check(
    aiter: Path, atom_sha: str, aiter_sha: str, env: dict[str, str], where: Path
) -> tuple[dict[str, object], float]:
    """One whole `pipeline check` process on the cache `where`: (its JSON report, wall seconds)."""
    cmd = [
        sys.executable, "-m", "pipeline", "check", "--atom-repo", ATOM_MIRROR,
        "--aiter-repo", str(aiter), "--atom", atom_sha, "--aiter", aiter_sha, "--format", "json",
    ]  # fmt: skip
    run = measure(cmd, dict(env, PIPELINE_CACHE_DIR=str(where)), cwd=where.parent)
    if run.code not in (0, 4):
        raise SystemExit(f"check failed ({run.code}): {run.stderr[-2000:]}")
    return json.loads(run.stdout), run.wall_s


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nights", type=int, default=8)
    ap.add_argument("--atom-step", type=int, default=3)
    ap.add_argument("--aiter-step", type=int, default=5)
    args = ap.parse_args()
    if not have_mirrors():
        print("replay_nights: needs the mirrors (ATOM_MIRROR, AITER_MIRROR)")
        return 2
    tmp = scratch("nights-")
    env = bytecode_env(tmp)
    branch = git(AITER_MIRROR, "symbolic-ref", "--short", "HEAD")
    aiter = tmp / "aiter.git"
    subprocess.run(["git", "clone", "-q", "--bare", "--shared", AITER_MIRROR, str(aiter)], check=True)
    atom_fp = git(ATOM_MIRROR, "rev-list", "--first-parent", "HEAD").split()
    aiter_fp = git(AITER_MIRROR, "rev-list", "--first-parent", "HEAD").split()
    cache, differ = tmp / "nightly", 0
    print(f"{args.nights} nights on the real mirrors, ATOM {args.atom_step} and aiter {args.aiter_step} "
          "first-parent commits a night; load average at start "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPU(s)")  # fmt: skip
    for k in range(args.nights, -1, -1):
        atom_sha, aiter_sha = atom_fp[k * args.atom_step], aiter_fp[k * args.aiter_step]
        git(str(aiter), "update-ref", f"refs/heads/{branch}", aiter_sha)

        night, night_s = check(aiter, atom_sha, aiter_sha, env, cache)
        pair = f"{atom_sha[:10]} × {aiter_sha[:10]}"
        if k == args.nights:
            print(f"  first night {pair}: {night_s:.2f} s (cold: it starts the cache)")
            continue
        cold, cold_s = check(aiter, atom_sha, aiter_sha, env, tmp / f"cold{k}")
        same = night == cold
        differ += not same
        counts = night["counts"]
        assert isinstance(counts, dict)
        print(
            f"  night {pair}: {night_s:.2f} s (cold {cold_s:.2f} s); "
            f"{counts['errors']} error(s), {counts['calls_checked']} checked; "
            f"same report as a cold check: {'yes' if same else 'NO'}"
        )
        if not same:
            for key in night:
                if night[key] != cold.get(key):
                    print(f"    differs in {key!r}: night {str(night[key])[:300]}")
                    print(f"      cold {str(cold[key])[:300]}")
    print(f"nights that differ from a cold check: {differ}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
