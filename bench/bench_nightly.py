"""The scheduled rebuild, simulated: today's workflow against the jobs-by-machine one (issue 29).

The plan is real: `pipeline rebuild --write-plan` over the first N real recipes in recipes/, at the
mirrors' heads (ATOM_MIRROR, AITER_MIRROR), timed; its builds (one per distinct inputs digest, a
lead per aiter stage key) and smoke list are what gets scheduled. The rest is simulated with
stated durations:

- aiter's stage: --aiter-seconds (600 s, as bench/bench_build.py simulates it);
- ATOM's stage and the image around it: --atom-seconds (120 s); a candidate pushed or pulled:
  --transfer-seconds (60 s); aiter's stage imported from the registry cache: the same;
- a smoke test: the recipe's length, i.e. the recorded durations of the benchmark rows it runs by
  default plus --smoke-fixed-minutes (15) for the server's start and GSM8K; 30 minutes when the
  recipe records no durations;
- tag: --tag-seconds (60 s) per model.

Today (.github/workflows/rebuild.yml before issue 29): the pins job and then every model's job,
one after another (`max-parallel: 1`), on one MI355 runner: build (the first compiles aiter, the
others find it in that runner's cache), smoke, tag. Everything runs on the GPU host.
New: plan on a hosted runner; the lead builds on b build hosts, then the other builds (aiter's
stage from the registry cache); then the smoke tests on g GPU hosts (a job waits for all of the
job before it, as GitHub's `needs:` does); then one tag job. GPU hosts only smoke.

    ATOM_MIRROR=... AITER_MIRROR=... python bench/bench_nightly.py [--counts 1,5,15]
        [--build-hosts 2] [--gpu-hosts 4]
    python bench/bench_nightly.py --plan-dir DIR      (reuse plans written by an earlier run)

Goal: 15 recipes on 2 build hosts and 4 GPU hosts in at most 0.3x today's wall time, and no
GPU-host time spent compiling.
"""

from __future__ import annotations

import argparse
import heapq
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.rebuild import Plan  # noqa: E402
from pipeline.recipes.recipe import BenchmarkCheck, load_recipe  # noqa: E402

GOAL_RATIO = 0.3
UNKNOWN_SMOKE_S = 30 * 60.0
# A base image pinned by a well-formed digest: the plan renders, nothing is pulled.
BASE = "rocm/pytorch:rocm7.2.4_ubuntu22.04_py3.10_pytorch_release_2.10.0@sha256:" + "0" * 64


@dataclass(frozen=True)
class Costs:
    aiter: float
    atom: float
    transfer: float
    tag: float
    smoke_fixed: float


def smoke_seconds(model: str, fixed: float) -> tuple[float, str]:
    """The recipe's smoke length: its benchmark rows' recorded durations plus the fixed part."""
    recipe = load_recipe(REPO / "recipes" / f"{model}.yaml")
    rows = [
        r
        for check in recipe.checks
        if isinstance(check, BenchmarkCheck)
        for r in check.reference
        if r.concurrency in check.concurrencies
    ]
    durations = [r.duration_s for r in rows if r.duration_s is not None]
    if rows and len(durations) == len(rows):
        return sum(durations) + fixed, "recipe"
    return UNKNOWN_SMOKE_S, "unknown: 30 min"


def write_plan(models: list[str], out: Path) -> float:
    """Run the real `pipeline rebuild --write-plan` for these recipes; its wall seconds."""
    atom, aiter = os.environ.get("ATOM_MIRROR", ""), os.environ.get("AITER_MIRROR", "")
    if not (atom and aiter and Path(atom).is_dir() and Path(aiter).is_dir()):
        sys.exit(
            "set ATOM_MIRROR and AITER_MIRROR to bare mirrors of ROCm/ATOM and ROCm/aiter "
            "(or pass --plan-dir)"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    work = Path(tempfile.mkdtemp(prefix="bench-nightly-"))
    env.update(
        PIPELINE_ATOM_REPO=atom,
        PIPELINE_AITER_REPO=aiter,
        PIPELINE_OFFLINE="1",  # the mirrors as they are: no fetch, no registry
        PIPELINE_SUBMODULES="in-build",  # aiter's submodules need no mirror of their own to render
        PIPELINE_BASE_IMAGE=BASE,
        PIPELINE_RECIPES_DIR=str(REPO / "recipes"),
        PIPELINE_PATCHES_DIR=str(REPO / "patches" / "atom"),
        PIPELINE_TEMPLATES_DIR=str(REPO / "dockerfiles"),
        PIPELINE_RUNS_DIR=str(work / "runs"),
        PIPELINE_LOCKS_DIR=str(work / "locks"),
        PIPELINE_WHEELS_DIR=str(work / "no-wheelhouse"),
        PIPELINE_CACHE_DIR=os.environ.get("BENCH_CACHE_DIR", str(work / "cache")),
        PYTHONPATH=str(REPO),  # this checkout's pipeline, whatever is installed
    )
    argv = [
        sys.executable,
        "-m",
        "pipeline",
        "rebuild",
        "--write-plan",
        str(out),
        *(f"--model={m}" for m in models),
    ]
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - t0
    if proc.returncode != 0 or not (out / "plan.json").is_file():
        sys.exit(
            f"rebuild --write-plan failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return took


def today(plan: Plan, plan_s: float, smoke: dict[str, float], c: Costs) -> tuple[float, float, float]:
    """(wall, GPU-host seconds, GPU-host seconds compiling): all serial on one MI355 runner."""
    wall = plan_s
    compiled: set[str] = set()
    compiling = 0.0
    for model in sorted(m for m, e in plan.models.items() if e["status"] == "ok" and not e.get("released")):
        key = plan.models[model].get("aiter_stage", "")
        build = c.atom + c.transfer + (c.aiter if key not in compiled else 0.0)
        compiling += build - c.transfer
        compiled.add(key)
        wall += build + smoke[model] + c.tag
    return wall, wall, compiling


def _makespan(durations: list[float], hosts: int) -> float:
    """Jobs in the given order on the first free host (GitHub hands matrix jobs out in order)."""
    if not durations:
        return 0.0
    free = [0.0] * max(1, hosts)
    heapq.heapify(free)
    end = 0.0
    for d in durations:
        start = heapq.heappop(free)
        heapq.heappush(free, start + d)
        end = max(end, start + d)
    return end


def new(
    plan: Plan, plan_s: float, smoke: dict[str, float], c: Costs, b: int, g: int
) -> tuple[float, float, float]:
    builds = plan.builds()
    leads = [c.aiter + c.atom + c.transfer for x in builds if x["lead"]]
    follows = [c.transfer + c.atom + c.transfer for x in builds if not x["lead"]]  # import aiter, build, push
    models = [m for x in builds for m in x["models"]]
    smokes = [c.transfer + smoke[m] for m in sorted(models)]  # pull by digest, then smoke
    wall = plan_s + _makespan(leads, b) + _makespan(follows, b) + _makespan(smokes, g) + c.tag * len(models)
    return wall, sum(smokes), 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", default="1,5,15")
    ap.add_argument("--build-hosts", type=int, default=2)
    ap.add_argument("--gpu-hosts", type=int, default=4)
    ap.add_argument("--aiter-seconds", type=float, default=600.0)
    ap.add_argument("--atom-seconds", type=float, default=120.0)
    ap.add_argument("--transfer-seconds", type=float, default=60.0)
    ap.add_argument("--tag-seconds", type=float, default=60.0)
    ap.add_argument("--smoke-fixed-minutes", type=float, default=15.0)
    ap.add_argument(
        "--plan-dir", type=Path, help="read (or write) plan-<n>/ here instead of a temporary directory"
    )
    args = ap.parse_args()
    c = Costs(
        args.aiter_seconds,
        args.atom_seconds,
        args.transfer_seconds,
        args.tag_seconds,
        args.smoke_fixed_minutes * 60,
    )
    recipes = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))
    root = args.plan_dir or Path(tempfile.mkdtemp(prefix="bench-nightly-plans-"))
    print(
        f"load: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores; "
        "plan times are measured, the rest simulated"
    )
    print(
        f"{'recipes':>7} {'planned':>7} {'images':>6} {'aiter':>5} {'plan s':>7} | "
        f"{'today h':>7} {'GPU h':>6} "
        f"{'GPU compile h':>13} | {'new h':>6} {'GPU h':>6} {'GPU compile h':>13} | {'ratio':>5}"
    )
    verdicts = []
    for n in [int(x) for x in args.counts.split(",")]:
        models = recipes[:n]
        out = root / f"plan-{n}"
        timing = out / "plan-seconds.txt"
        if (out / "plan.json").is_file() and timing.is_file():
            plan_s = float(timing.read_text())
        else:
            plan_s = write_plan(models, out)
            timing.write_text(f"{plan_s:.1f}\n")
        plan = Plan.load(out / "plan.json")
        smoke = {m: smoke_seconds(m, c.smoke_fixed)[0] for m in plan.models}
        t_wall, t_gpu, t_comp = today(plan, plan_s, smoke, c)
        n_wall, n_gpu, n_comp = new(plan, plan_s, smoke, c, args.build_hosts, args.gpu_hosts)
        ok = sum(1 for e in plan.models.values() if e["status"] == "ok")
        ratio = n_wall / t_wall if t_wall else 0.0
        print(
            f"{n:>7} {ok:>7} {len(plan.builds()):>6} {len({b['aiter_stage'] for b in plan.builds()}):>5} "
            f"{plan_s:>7.0f} | {t_wall / 3600:>7.2f} {t_gpu / 3600:>6.2f} {t_comp / 3600:>13.2f} | "
            f"{n_wall / 3600:>6.2f} {n_gpu / 3600:>6.2f} {n_comp / 3600:>13.2f} | {ratio:>5.2f}"
        )
        left = plan.matrix()["left_out"]
        if left:
            print(f"        left out of the plan (not scheduled): {', '.join(left)}")
        if n == 15:
            verdicts.append((ratio, n_comp))
    print(f"(b={args.build_hosts} build hosts, g={args.gpu_hosts} GPU hosts; smoke lengths:", end=" ")
    print(", ".join(f"{m} {smoke_seconds(m, c.smoke_fixed)[0] / 60:.0f} min" for m in recipes[:3]), "...)")
    for ratio, comp in verdicts:
        met = ratio <= GOAL_RATIO and comp == 0
        print(
            f"goal (15 recipes, <= {GOAL_RATIO}x today, no GPU-host compile): "
            f"{'met' if met else 'NOT met'} ({ratio:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
