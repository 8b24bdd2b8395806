"""Replay of ATOM's history: a changed file scanned from its previous version's scan, against a full scan.

For each of the last N first-parent commits of ATOM (ATOM_MIRROR), every `.py` under `atom/` it
modifies is scanned twice: in full (`scan_file`) and from the scan of its previous blob
(`scan_file_since`, as a nightly check does with the previous night's cache). The two must be
equal, field by field; the figures are how many files were compared, how many were equal, how
many function bodies were taken from the previous scan and how many parsed again (a fallback to
a full scan parses them all), and the time of each way (best of --runs, in this process).

    ATOM_MIRROR=/path/to/ATOM.git python bench/replay_rescan.py [--commits 100] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pipeline.compat import calls  # (run as a script: the repository is put on the path)

BIG = 100 << 10  # ATOM's model files (model_runner.py, moe.py, deepseek_v4.py) are 180-230 KB


def git(repo: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", repo, *args], check=True, capture_output=True).stdout


def changed_files(repo: str, commits: int) -> list[tuple[str, str, str, str]]:
    """(commit, path, old blob, new blob) of every `.py` under atom/ a first-parent commit modifies."""
    out = git(repo, "log", "--first-parent", "-m", "--raw", "--no-abbrev", "--format=%x01%H",
              f"-{commits}", "HEAD", "--", "atom")  # fmt: skip
    rows: list[tuple[str, str, str, str]] = []
    commit = ""
    for line in out.decode().splitlines():
        if line.startswith("\x01"):
            commit = line[1:]
        elif line.startswith(":"):
            meta, path = line.split("\t", 1)
            _, _, old, new, status = meta.split()
            if status == "M" and path.endswith(".py"):
                rows.append((commit, path, old, new))
    return rows


def best(runs: int, f):  # type: ignore[no-untyped-def]
    t, got = float("inf"), None
    for _ in range(runs):
        t0 = time.perf_counter()
        got = f()
        t = min(t, time.perf_counter() - t0)
    return t, got


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    repo = os.environ.get("ATOM_MIRROR")
    if not repo:
        print("set ATOM_MIRROR to a bare clone of ATOM")
        return 2
    rows = changed_files(repo, args.commits)
    compared = equal = big = 0
    t_full = t_inc = b_full = b_inc = 0.0
    bodies = {"taken": 0, "parsed": 0}
    take, parse = calls._Scanner._take, calls._Scanner._scan_function_body

    def taken(self, *a):  # type: ignore[no-untyped-def]
        bodies["taken"] += 1
        return take(self, *a)

    def parsed(self, fn, *a):  # type: ignore[no-untyped-def]
        bodies["parsed"] += not self.fn_hot and fn.lineno in self.units  # (outermost functions only)
        return parse(self, fn, *a)

    for commit, path, old, new in rows:
        before = calls.scan_file(git(repo, "cat-file", "blob", old), path)
        data = git(repo, "cat-file", "blob", new)
        tf, full = best(args.runs, lambda: calls.scan_file(data, path))  # noqa: B023
        ti, inc = best(args.runs, lambda: calls.scan_file_since(data, path, before))  # noqa: B023
        compared += 1
        t_full, t_inc = t_full + tf, t_inc + ti
        if len(data) >= BIG:
            big, b_full, b_inc = big + 1, b_full + tf, b_inc + ti
        if inc == full:
            equal += 1
        else:
            print(f"DIFFERENT: {commit[:10]} {path}")
        calls._Scanner._take, calls._Scanner._scan_function_body = taken, parsed  # type: ignore[method-assign]
        try:
            calls.scan_file_since(data, path, before)
        finally:
            calls._Scanner._take, calls._Scanner._scan_function_body = take, parse  # type: ignore[method-assign]
    print(f"{len(set(r[0] for r in rows))} commits, {compared} files compared, {equal} equal")
    print(f"functions scanned by units: {bodies['taken']} taken from the previous scan, "
          f"{bodies['parsed']} parsed (changed, reading a changed binding, setting self.x)")  # fmt: skip
    print(f"full scans {t_full:.3f} s, from the previous scan {t_inc:.3f} s "
          f"(saved {t_full - t_inc:.3f} s, {100 * (1 - t_inc / t_full) if t_full else 0:.0f}%)")  # fmt: skip
    print(f"of which {big} files of {BIG >> 10} KB or more: full {b_full:.3f} s, from the previous scan "
          f"{b_inc:.3f} s ({100 * (1 - b_inc / b_full) if b_full else 0:.0f}% saved)")  # fmt: skip
    return 0 if equal == compared else 1


if __name__ == "__main__":
    sys.exit(main())
