"""Start-up cost of the CLI: `pipeline --version`, `pipeline --help`, `pipeline build --help`.

Each figure is the median wall time of N fresh `python -m pipeline ...` processes
(what a shell or a CI step pays), its median CPU time (user + system: less
sensitive to a machine shared with other jobs), and the number of modules the
process had loaded when it exited. The named peer measured in the same run is a
bare `python -c pass` (the interpreter's own start-up, which no CLI can beat), so
a loaded machine shows in both.

Bytecode: an installed `pipeline` runs from compiled bytecode (pip compiles at install; an
editable install writes `__pycache__` on first use). So the figures are taken with bytecode
cached, in a private PYTHONPYCACHEPREFIX (nothing written into the tree), after one untimed
warm-up run. With PYTHONDONTWRITEBYTECODE=1 in the environment (as on some CI machines) every
run compiles the tool's modules again; one more line shows `--help` that way, for comparison.

Target (issue 14): `--version` and `--help` ≤ 0.15 s; no command imports another
stage's heavy dependencies (docker, paramiko, pydantic for `--help`).

    python bench/bench_startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
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


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(args: list[str], runs: int, env: dict[str, str]) -> tuple[float, float, int, str]:
    env = {**env, "PYTHONPATH": str(ROOT)}
    if "PYTHONDONTWRITEBYTECODE" not in env:  # warm-up: compile once, as an install does
        subprocess.run([sys.executable, *args], capture_output=True, env=env, cwd=ROOT, check=False)
    times, cpus, modules, heavy = [], [], 0, ""
    for _ in range(runs):
        t0, c0 = time.perf_counter(), _children_cpu()
        proc = subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, check=False
        )
        times.append(time.perf_counter() - t0)
        cpus.append(_children_cpu() - c0)
        for line in proc.stderr.splitlines():
            if line.startswith("MODULES "):
                parts = line.split(" ")
                modules, heavy = int(parts[1]), (parts[2] if len(parts) > 2 else "")
    return statistics.median(times), statistics.median(cpus), modules, heavy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    runs = ap.parse_args().runs
    with tempfile.TemporaryDirectory(prefix="bench-startup-pyc-") as pyc:
        compiled = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        compiled["PYTHONPYCACHEPREFIX"] = pyc
        return measure(runs, compiled, {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def measure(runs: int, compiled: dict[str, str], uncompiled: dict[str, str]) -> int:
    bare = (
        "import sys, atexit; atexit.register(lambda: sys.stderr.write(f'\\nMODULES {len(sys.modules)}\\n'))"
    )
    peer, peer_cpu, peer_modules, _ = run(["-c", bare], runs, compiled)
    print(f"peer     python -c pass       wall {peer:.3f} s  cpu {peer_cpu:.3f} s  {peer_modules:4d} modules")
    worst = 0.0
    for label, argv in (
        ("--version", ["--version"]),
        ("--help", ["--help"]),
        ("build --help", ["build", "--help"]),
    ):
        t, cpu, n, heavy = run(["-c", CHILD, ",".join(HEAVY), *argv], runs, compiled)
        ratio = t / TARGET_S
        worst = max(worst, ratio) if label != "build --help" else worst
        print(
            f"pipeline {label:<14} wall {t:.3f} s  cpu {cpu:.3f} s  {n:4d} modules  ratio to the "
            f"{TARGET_S:.2f} s target {ratio:.2f}  (wall {t - peer:+.3f} s, cpu {cpu - peer_cpu:+.3f} s "
            f"over the bare interpreter)  heavy: {heavy or 'none'}"
        )
    t, cpu, _, _ = run(["-c", CHILD, ",".join(HEAVY), "--help"], runs, uncompiled)
    print(
        f"pipeline --help, no bytecode (PYTHONDONTWRITEBYTECODE=1)  wall {t:.3f} s  cpu {cpu:.3f} s  "
        f"ratio {t / TARGET_S:.2f} (not the target's figure: every run compiles the tool again)"
    )
    print(f"worst ratio (--version, --help) {worst:.2f} {'OK' if worst <= 1.0 else 'OVER TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
