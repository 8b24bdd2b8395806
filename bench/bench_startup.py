"""Start-up cost of the CLI: `pipeline --version`, `pipeline --help`, `pipeline build --help`.

Each figure is the median wall time of N fresh `python -m pipeline ...` processes
(what a shell or a CI step pays), with the number of modules the process had
loaded when it exited. The named peer measured in the same run is a bare
`python -c pass` (the interpreter's own start-up, which no CLI can beat), so a
loaded machine shows in both.

Target (issue 14): `--version` and `--help` ≤ 0.15 s; no command imports another
stage's heavy dependencies (docker, paramiko, pydantic for `--help`).

    python bench/bench_startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 0.15
HEAVY = ("docker", "paramiko", "pydantic", "git", "jinja2", "requests", "yaml")

# Runs the CLI in-process and reports, on exit, how many modules were loaded and which heavy ones.
CHILD = r"""
import atexit, sys
def _report():
    heavy = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1].split(",")))
    sys.stderr.write(f"\nMODULES {len(sys.modules)} {','.join(heavy)}\n")
atexit.register(_report)
sys.argv = ["pipeline", *sys.argv[2:]]
from pipeline.__main__ import main
main()
"""


def run(args: list[str], runs: int) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    times, modules, heavy = [], 0, ""
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, check=False
        )
        times.append(time.perf_counter() - t0)
        for line in proc.stderr.splitlines():
            if line.startswith("MODULES "):
                parts = line.split(" ")
                modules, heavy = int(parts[1]), (parts[2] if len(parts) > 2 else "")
    return statistics.median(times), modules, heavy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    runs = ap.parse_args().runs
    peer, peer_modules, _ = run(["-c", "import sys, atexit; atexit.register(lambda: sys.stderr.write("
                                 "f'\\nMODULES {len(sys.modules)}\\n'))"], runs)  # fmt: skip
    print(f"peer   python -c pass         {peer:.3f} s  {peer_modules:4d} modules")
    worst = 0.0
    for label, argv in (
        ("--version", ["--version"]),
        ("--help", ["--help"]),
        ("build --help", ["build", "--help"]),
    ):
        t, n, heavy = run(["-c", CHILD, ",".join(HEAVY), *argv], runs)
        ratio = t / TARGET_S
        worst = max(worst, ratio) if label != "build --help" else worst
        print(
            f"pipeline {label:<14} {t:.3f} s  {n:4d} modules  ratio to the {TARGET_S:.2f} s target "
            f"{ratio:.2f}  ({t - peer:+.3f} s over the bare interpreter)  heavy: {heavy or 'none'}"
        )
    print(f"worst ratio (--version, --help) {worst:.2f} {'OK' if worst <= 1.0 else 'OVER TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
