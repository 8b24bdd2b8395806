"""Benchmark: a whole `pipeline check` process on one ATOM × aiter pair, beside a real peer.

Each run is a fresh `python -m pipeline check ...` process: cold (empty cache dir), then warm
(the cache the cold run left). Figures: wall time, CPU time (with git and the scan workers),
peak memory summed over the process tree. On the real mirrors when present
(ATOM_MIRROR / AITER_MIRROR),
else on the fixture repositories (then no peer runs).

Targets (issue 12 §5): cold ≤ 1.0 s, warm ≤ 0.1 s, peak ≤ 300 MB counting workers; (issue 28 §7)
the next night's check with the previous night's cache ≤ 0.3 s: on the real mirrors, HEAD × HEAD
after a check of ATOM 3 and aiter 5 first-parent commits behind, with aiter's default branch there
(a shared bare clone whose branch is moved back), as a scheduled rebuild sees it.
Peer, in the same run: willitbreak (PyPI) on the same ATOM tree and the same two aiter trees
(the aiter the calls were written against -> the pinned one), fed by `git archive`; griffe's
breaking-change finder on the two aiter trees; mypy only as the issue's printed reference.

    python bench/bench_check.py [--atom REF] [--aiter REF] [--runs N] [--no-peers]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import (  # (run as a script from anywhere: bench/ is on the path)
    AITER_MIRROR,
    ATOM_MIRROR,
    MYPY_REFERENCE_S,
    ROOT,
    Run,
    bytecode_env,
    cpu_steal,
    griffe_breakages,
    have_mirrors,
    interpreter_floor,
    measure,
    scratch,
    steal_since,
    willitbreak,
)

TARGET_COLD_S, TARGET_WARM_S, TARGET_MB, TARGET_NIGHT_S = 1.0, 0.1, 300.0, 0.3


def repos() -> tuple[str, str, str, str, bool]:
    if have_mirrors():
        return ATOM_MIRROR, AITER_MIRROR, "ab9eb781", "08f04b889a", True
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.compat_repos import build_compat_repos

    fx = build_compat_repos(scratch("bench-compat-") / "fx")
    return str(fx.atom), str(fx.aiter), fx.t["T1"], fx.a["A4"], False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--atom")
    ap.add_argument("--aiter")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()
    atom, aiter, atom_rev, aiter_rev, real = repos()
    atom_rev, aiter_rev = args.atom or atom_rev, args.aiter or aiter_rev
    tmp = scratch("bench-check-")
    env = bytecode_env(tmp)

    def check(cache: Path) -> Run:
        cmd = [
            sys.executable, "-m", "pipeline", "check", "--atom-repo", atom, "--aiter-repo", aiter,
            "--atom", atom_rev, "--aiter", aiter_rev, "--format", "json",
        ]  # fmt: skip
        return measure(cmd, dict(env, PIPELINE_CACHE_DIR=str(cache)), cwd=tmp)

    print(
        f"pipeline check: ATOM {atom_rev} × aiter {aiter_rev} on {'the real mirrors' if real else 'fixtures'}"
    )
    check(tmp / "prime")  # compiles the bytecode an installed tool would have
    steal0 = cpu_steal()
    colds, warms = [], []
    for i in range(args.runs):
        cache = tmp / f"cache{i}"
        colds.append(check(cache))
        warms.append(check(cache))
    report = json.loads(colds[0].stdout)
    errors = [(f["path"], f["line"]) for f in report["findings"] if f["severity"] == "error"]
    c = report["counts"]
    print(
        f"result: exit {colds[0].code}; {c['errors']} error(s), {c['warnings']} warning(s), "
        f"{c['calls_checked']} calls checked, {c['calls_unchecked']} unchecked"
    )
    for path, line in errors:
        print(f"  error at {path}:{line}")

    def show(name: str, runs: list[Run], target: float) -> float:
        wall = [r.wall_s for r in runs]
        best = min(wall)
        print(
            f"{name}: best {best:.3f} s, median {statistics.median(wall):.3f} s wall "
            f"(CPU incl. git and workers: best {min(r.cpu_s for r in runs):.3f} s)  "
            f"target ≤ {target:.1f} s -> {'OK' if best <= target else 'OVER'} ({best / target:.2f}× target)"
        )
        return best

    cold = show("cold, whole process", colds, TARGET_COLD_S)
    show("warm, whole process", warms, TARGET_WARM_S)
    if real and not args.atom and not args.aiter:
        night_runs = nights(atom, aiter, env, tmp, args.runs)
        show("next night (previous night's cache), whole process", night_runs, TARGET_NIGHT_S)
        cold_head = check_pair(atom, aiter, "HEAD", "HEAD", env, tmp / "cold-head", tmp)
        same = all(json.loads(r.stdout) == json.loads(cold_head.stdout) for r in night_runs)
        print(f"  the next night's report is a cold check's, field for field: {'yes' if same else 'NO'}")
    peak = max(r.peak_mb for r in colds + warms)
    print(f"peak memory, process tree summed: {peak:.0f} MB  target ≤ {TARGET_MB:.0f} MB -> "
          f"{'OK' if peak <= TARGET_MB else 'OVER'} ({peak / TARGET_MB:.2f}× target)")  # fmt: skip
    version = min(
        measure([sys.executable, "-m", "pipeline", "--version"], env, cwd=tmp).wall_s for _ in range(3)
    )
    full, bare = interpreter_floor(env)
    print(
        f"start-up on this machine: `pipeline --version` {version:.3f} s; "
        f"`python -c pass` {full:.3f} s (`python -S` {bare:.3f} s: the site hooks installed here)"
    )
    print(
        f"load average during the runs: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPU(s); "
        f"CPU time the VM's host took (steal): {steal_since(steal0)}"
    )
    if args.no_peers or not real:
        return
    baseline = report["baseline_aiter"] or report["aiter"]
    print(f"peers on the same pair (written against aiter {baseline[:10]} -> pinned {report['aiter'][:10]}):")
    wib = willitbreak(report["atom"], baseline, report["aiter"], tmp / "peer")
    if wib.wall_s is None:
        print(f"  willitbreak: {wib.note}")
    else:
        found = [s for s in wib.sites if s in set(errors)]
        print(
            f"  willitbreak: {wib.wall_s:.2f} s wall ({wib.note}); reports {len(wib.sites)} call site(s), "
            f"{len(found)} of our {len(errors)} error sites; ours is {wib.wall_s / cold:.1f}× faster cold"
        )
        for path, line in wib.sites[:10]:
            print(f"    it reports {path}:{line}")
    gr = griffe_breakages(baseline, report["aiter"], tmp / "peer", "fused_qknorm_idxrqknorm")
    wall = f"{gr.wall_s:.2f} s" if gr.wall_s is not None else "-"
    print(f"  griffe find_breaking_changes: {wall}; {gr.note}")
    print(
        f"  mypy --check-untyped-defs with torch installed: about {MYPY_REFERENCE_S:.0f} s "
        "(the issue's figure, not re-run)"
    )


def nights(atom: str, aiter: str, env: dict[str, str], tmp: Path, runs: int) -> list[Run]:
    """HEAD × HEAD, each time with the cache a check of the previous night's pair left."""
    import subprocess

    def git(repo: str, *a: str) -> str:
        return subprocess.run(
            ["git", "--git-dir", repo, *a], check=True, capture_output=True, text=True
        ).stdout.strip()

    prev_atom, prev_aiter = git(atom, "rev-parse", "HEAD~3"), git(aiter, "rev-parse", "HEAD~5")
    branch = git(aiter, "symbolic-ref", "--short", "HEAD")
    yesterday = tmp / "aiter-yesterday.git"
    subprocess.run(["git", "clone", "-q", "--bare", "--shared", aiter, str(yesterday)], check=True)
    git(str(yesterday), "update-ref", f"refs/heads/{branch}", prev_aiter)

    out = []
    for i in range(runs):
        cache = tmp / f"night{i}"
        check_pair(atom, str(yesterday), prev_atom, prev_aiter, env, cache, tmp)  # last night
        out.append(check_pair(atom, aiter, "HEAD", "HEAD", env, cache, tmp))
    return out


def check_pair(atom: str, aiter: str, a: str, b: str, env: dict[str, str], cache: Path, cwd: Path) -> Run:
    """One whole `pipeline check` process on the cache `cache` (it holds no answer of this pair to replay)."""
    cmd = [
        sys.executable, "-m", "pipeline", "check", "--atom-repo", atom, "--aiter-repo", aiter,
        "--atom", a, "--aiter", b, "--format", "json",
    ]  # fmt: skip
    return measure(cmd, dict(env, PIPELINE_CACHE_DIR=str(cache)), cwd=cwd)


if __name__ == "__main__":
    main()
